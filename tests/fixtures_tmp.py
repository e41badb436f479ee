"""The suite leaves nothing in the machine's temp folder outside folders it removes.

Loaded as a pytest plugin by tests/conftest.py. For the session, child
processes (servers, torchrun and its ranks, CLI runs) get a TMPDIR of their
own, and the session fails, naming them, when anything is left in it at the
end: a launcher that leaves files behind (torchrun's ``torchelastic_*``
folders, SeaweedFS's ``weed.*`` logs) is caught whatever else runs on the
machine, since no other process writes there. That folder is removed either
way. The processes that run the tests (this one, and pytest-xdist's workers)
write their own temporary files (``tempfile``: a library's cache, a test's
folder) into a second folder of the session, from the first test on; what is
left there at the end is named in a note (not a failure: libraries keep
caches there, torch's compile cache among them), and the folder is removed.
pytest's ``tmp_path`` stays in the machine's temp folder, where pytest keeps
the last sessions' for a look after a failure. Nothing is said about the rest
of the machine's temp folder: other processes of a shared machine write
there, and no file tells which process made it.
tiktoken, which caches the files of named encodings it loads in
``data-gym-cache`` under the temp folder, caches in a session folder instead.
The node-local metadata cache's folder for torchrun ranks
(``/dev/shm/zephon-node-cache-<uid>``, or ``$ZEPHON_NODE_CACHE``) is checked
too: torchrun jobs of the suite that kill every rank point
``ZEPHON_NODE_CACHE`` into a folder they remove, so anything new left there
is a leak of a job that ended normally. The folder is shared by every process
of the user, and each open cache records its owner's pid in it
(``node-cache-users/<pid>-<id>``): while a process outside the session holds
it open at the end, what is new there may be that process's, and it is
reported as such rather than failed (a leak of the session's is then found by
a session that ends with the folder to itself).
The notes and the failures are printed on lines of their own, in the
summary, after pytest's progress.
Under pytest-xdist (``-n``) the controller owns both folders and checks them
after every worker has finished; the workers' children share the first.
At the start, the controller removes the server folders (``zs-seaweedfs-*``,
``zs-azurite-*``, ``zs-fake-gcs-*``, ``zs-ray-*``) and the session folders
(``zs-suite-*-tmp-*``) that a killed session left in the machine's temp
folder and in ``/tmp``: those whose recorded owner no longer runs
(``zephon_stream.storage.lifetime.sweep_orphaned``).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

from zephon_stream.storage.lifetime import OWNER_FILE, mark_owner, sweep_orphaned
from zephon_stream.storage.node_cache import ENV_VAR as NODE_CACHE_ENV
from zephon_stream.storage.node_cache import node_cache_root
from zephon_stream.storage.node_cache_files import USERS

# tools/ is not installed; the repository root on sys.path makes it importable.
_REPO_ROOT = str(Path(__file__).resolve().parent.parent)
if _REPO_ROOT not in sys.path:
    sys.path.insert(0, _REPO_ROOT)

from tools.processes import alive  # noqa: E402
from tools.server_process import SERVER_DIR_PREFIXES  # noqa: E402

_state = pytest.StashKey[dict]()
_said = pytest.StashKey[list]()


SESSION_DIR_PREFIXES = ("zs-suite-children-tmp-", "zs-suite-own-tmp-")


def _node_cache_folder() -> str:
    """The node cache's folder for the ranks of a torchrun job of the session (its default one)."""
    chosen = os.environ.get(NODE_CACHE_ENV)
    return node_cache_root({"LOCAL_WORLD_SIZE": "2", **({NODE_CACHE_ENV: chosen} if chosen else {})})


def _node_cache_entries() -> set[str]:
    """What the node cache's folder holds (nothing when it does not exist)."""
    root = _node_cache_folder()
    try:
        return {os.path.join(path, name) for path, dirs, files in os.walk(root) for name in dirs + files}
    except OSError:
        return set()


def _node_cache_holders(exclude: set[int]) -> list[int]:
    """The pids outside ``exclude`` that hold the node cache's folder open (its owner records)."""
    try:
        names = os.listdir(os.path.join(_node_cache_folder(), USERS))
    except OSError:
        return []
    pids = {int(name.split("-", 1)[0]) for name in names if name.split("-", 1)[0].isdigit()}
    return sorted(pid for pid in pids - exclude if alive(pid))


def pytest_configure(config: pytest.Config) -> None:
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None:
        # A pytest-xdist worker inherits the controller's TMPDIR (the
        # children's folder, which the controller checks once every worker has
        # finished); the worker's own process keeps the machine's until its
        # first test (own_temp_folder), as a process running the tests does
        # without xdist.
        tempfile.tempdir = workerinput["zs_machine_tmpdir"]
        return
    # Resolved (and cached by tempfile) before TMPDIR changes, so this
    # process and pytest's tmp_path keep the machine's temp folder.
    machine = Path(tempfile.gettempdir())
    prefixes = SERVER_DIR_PREFIXES + SESSION_DIR_PREFIXES
    swept = [path for root in sorted({str(machine), "/tmp"}) for path in sweep_orphaned(root, prefixes)]
    if swept:
        print(f"note: removed {len(swept)} server and session folders of killed sessions: {', '.join(swept[:10])}")
    # Each marked with this process as its owner, so a killed session's are swept as above.
    children, own = (Path(tempfile.mkdtemp(prefix=prefix)) for prefix in SESSION_DIR_PREFIXES)
    for folder in (children, own):
        mark_owner(folder)
    config.stash[_state] = {
        "machine": machine,
        "own": own,
        "children": children,
        "previous": os.environ.get("TMPDIR"),
        "node_cache": _node_cache_entries(),
    }
    os.environ["TMPDIR"] = str(children)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:
    """pytest-xdist: tell each worker the machine's temp folder and the session's own (its TMPDIR is the children's)."""
    state = node.config.stash[_state]
    node.workerinput["zs_machine_tmpdir"] = str(state["machine"])
    node.workerinput["zs_own_tmpdir"] = str(state["own"])


@pytest.fixture(scope="session", autouse=True)
def own_temp_folder(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    """From the first test on, this process's temporary files go to the session's own folder."""
    workerinput = getattr(request.config, "workerinput", None)
    own = workerinput["zs_own_tmpdir"] if workerinput is not None else str(request.config.stash[_state]["own"])
    tmp_path_factory.getbasetemp()  # First, so that pytest's tmp_path stays where pytest keeps it
    previous, tempfile.tempdir = tempfile.tempdir, own
    try:
        yield Path(own)
    finally:
        tempfile.tempdir = previous


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    """After the session's fixtures are torn down: what the children and the session's own processes left."""
    state = session.config.stash.get(_state, None)
    if state is None:
        return
    if state["previous"] is None:
        os.environ.pop("TMPDIR", None)
    else:
        os.environ["TMPDIR"] = state["previous"]
    left, own_left = (_left_in(state[name]) for name in ("children", "own"))
    children, own = state["children"], state["own"]
    notes, failures = [], []
    if own_left:
        notes.append(
            f"note: the processes that ran the tests left {len(own_left)} entries in their temp folder "
            f"({own}, now removed): {', '.join(own_left[:20])}"
        )
    if left:
        failures.append(
            f"the suite's child processes left {len(left)} entries in their temp folder "
            f"(TMPDIR={children}, now removed): {', '.join(left[:20])}"
        )
    leaked = sorted(_node_cache_entries() - state["node_cache"])
    if leaked:
        holders = _node_cache_holders({os.getpid()})
        if holders:
            notes.append(
                f"note: the node cache's folder {_node_cache_folder()} is held open by processes outside "
                f"this session (pids {', '.join(map(str, holders[:10]))}): its {len(leaked)} new entries "
                "may be theirs; not checked"
            )
        else:
            failures.append(
                f"the suite left {len(leaked)} entries in the node cache's folder: {', '.join(leaked[:20])}"
            )
    if failures:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    lines = [(line, {"yellow": True}) for line in notes] + [(line, {"red": True, "bold": True}) for line in failures]
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if lines and (reporter is None or reporter.no_summary):
        print("", *(line for line, _ in lines), sep="\n")
    elif lines:
        # Written in the summary (pytest_terminal_summary), after the
        # line pytest ends its progress with, so none is glued to "[100%]".
        session.config.stash[_said] = lines


def _left_in(folder: Path) -> list[str]:
    """What ``folder`` holds besides its owner record; then the folder is removed."""
    left = sorted(set(os.listdir(folder)) - {OWNER_FILE}) if folder.is_dir() else []
    shutil.rmtree(folder, ignore_errors=True)
    return left


def pytest_terminal_summary(terminalreporter, config: pytest.Config) -> None:
    for line, markup in config.stash.get(_said, []):
        terminalreporter.write_line(line, **markup)


@pytest.fixture(scope="session", autouse=True)
def tiktoken_cache(tmp_path_factory: pytest.TempPathFactory):
    """tiktoken's cache for the session, unless the caller chose one."""
    with pytest.MonkeyPatch.context() as patch:
        if "TIKTOKEN_CACHE_DIR" not in os.environ:
            patch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path_factory.mktemp("tiktoken-cache")))
        yield os.environ["TIKTOKEN_CACHE_DIR"]
