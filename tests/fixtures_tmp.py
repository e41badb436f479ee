"""The suite leaves nothing in the machine's temp folder outside folders it removes.

Loaded as a pytest plugin by tests/conftest.py. For the session, child
processes (servers, torchrun and its ranks, CLI runs) get a TMPDIR of their
own, and the session fails, naming them, when anything is left in it at the
end: a launcher that leaves files behind (torchrun's ``torchelastic_*``
folders, SeaweedFS's ``weed.*`` logs) is caught whatever else runs on the
machine, since no other process writes there. That folder is removed either
way. This process keeps the machine's temp folder (pytest's ``tmp_path`` lives
there); what it writes is covered by the fixtures that use it, and names
that leaks took before are reported if they appear there during the session.
tiktoken, which caches the files of named encodings it loads in
``data-gym-cache`` under the temp folder, caches in a session folder instead.
The node-local metadata cache's default folder (``/dev/shm/zephon-node-cache-
<uid>``) is checked the same way: torchrun jobs of the suite that kill every
rank point ``ZEPHON_NODE_CACHE`` into a folder they remove, so anything new
left there is a leak of a job that ended normally.
Under pytest-xdist (``-n``) the controller owns that folder and checks it
after every worker has finished; the workers' children share it.
At the start, the controller removes the server folders (``zs-seaweedfs-*``,
``zs-azurite-*``, ``zs-fake-gcs-*``, ``zs-ray-*``) that a killed session
left in the machine's temp folder and in ``/tmp``: those whose recorded
owner no longer runs (``zephon_stream.storage.lifetime.sweep_orphaned``).
"""

from __future__ import annotations

import fnmatch
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

from zephon_stream.storage.lifetime import sweep_orphaned
from zephon_stream.storage.node_cache import node_cache_root

# NOTE: tools/ is not installed; the repository root on sys.path makes it importable.
_REPO_ROOT = str(Path(__file__).resolve().parent.parent)
if _REPO_ROOT not in sys.path:
    sys.path.insert(0, _REPO_ROOT)

from tools.server_process import SERVER_DIR_PREFIXES  # noqa: E402

# NOTE: what leaked from the suite before; new ones in the machine's temp
# folder are reported (not failed: other processes on the machine write there).
KNOWN_LEAKS = ("weed.*", "torchelastic_*", "torchinductor_*", "data-gym-cache", "seaweedfs-*.sock")

_state = pytest.StashKey[dict]()


def _known(folder: Path) -> set[str]:
    try:
        names = os.listdir(folder)
    except OSError:
        return set()
    return {name for name in names if any(fnmatch.fnmatch(name, pattern) for pattern in KNOWN_LEAKS)}


def _node_cache_entries() -> set[str]:
    """What the node cache's default folder holds (nothing when it does not exist)."""
    root = node_cache_root({"LOCAL_WORLD_SIZE": "2"})
    try:
        return {os.path.join(path, name) for path, dirs, files in os.walk(root) for name in dirs + files}
    except OSError:
        return set()


def pytest_configure(config: pytest.Config) -> None:
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None:
        # NOTE: a pytest-xdist worker inherits the controller's TMPDIR (the
        # children's folder, which the controller checks once every worker has
        # finished); the worker's own process keeps the machine's, as a
        # process running the tests does without xdist.
        tempfile.tempdir = workerinput["zs_machine_tmpdir"]
        return
    # NOTE: resolved (and cached by tempfile) before TMPDIR changes, so this
    # process and pytest's tmp_path keep the machine's temp folder.
    machine = Path(tempfile.gettempdir())
    swept = [path for root in sorted({str(machine), "/tmp"}) for path in sweep_orphaned(root, SERVER_DIR_PREFIXES)]
    if swept:
        print(f"note: removed {len(swept)} server folders of killed sessions: {', '.join(swept[:10])}")
    children = Path(tempfile.mkdtemp(prefix="zs-suite-children-tmp-"))
    config.stash[_state] = {
        "machine": machine,
        "before": _known(machine),
        "children": children,
        "previous": os.environ.get("TMPDIR"),
        "node_cache": _node_cache_entries(),
    }
    os.environ["TMPDIR"] = str(children)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:
    """pytest-xdist: tell each worker the machine's temp folder (its TMPDIR is the children's)."""
    node.workerinput["zs_machine_tmpdir"] = str(node.config.stash[_state]["machine"])


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    """After the session's fixtures are torn down: what the children left, and new known leaks."""
    state = session.config.stash.get(_state, None)
    if state is None:
        return
    if state["previous"] is None:
        os.environ.pop("TMPDIR", None)
    else:
        os.environ["TMPDIR"] = state["previous"]
    children: Path = state["children"]
    left = sorted(os.listdir(children)) if children.is_dir() else []
    shutil.rmtree(children, ignore_errors=True)
    appeared = sorted(_known(state["machine"]) - state["before"])
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if appeared and reporter is not None:
        reporter.write_line(
            f"note: new in {state['machine']} during the session (from this suite or another process): "
            + ", ".join(appeared),
            yellow=True,
        )
    messages = []
    if left:
        messages.append(f"the suite's child processes left {len(left)} entries in their temp folder "
                        f"(TMPDIR={children}, now removed): {', '.join(left[:20])}")
    leaked = sorted(_node_cache_entries() - state["node_cache"])
    if leaked:
        messages.append(f"the suite left {len(leaked)} entries in the node cache's default folder: "
                        f"{', '.join(leaked[:20])}")
    for message in messages:
        if reporter is not None:
            reporter.write_line(message, red=True, bold=True)
        else:
            print(message)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture(scope="session", autouse=True)
def tiktoken_cache(tmp_path_factory: pytest.TempPathFactory):
    """tiktoken's cache for the session, unless the caller chose one."""
    with pytest.MonkeyPatch.context() as patch:
        if "TIKTOKEN_CACHE_DIR" not in os.environ:
            patch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path_factory.mktemp("tiktoken-cache")))
        yield os.environ["TIKTOKEN_CACHE_DIR"]
