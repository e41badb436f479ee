"""A cluster in a box: N nodes on one machine, each a network namespace with its own hostname, /tmp and /dev/shm.

The nodes sit on one bridge (addresses from 198.18.0.0/15, the range set
aside for network benchmarks; tools/box_network.py), see a folder shared by
all of them (for checkpoints, inputs, logs) at the same path, and reach the
object store, SeaweedFS, on the bridge's address behind a proxy that records
which node asked for what. A node's /tmp and /dev/shm are tmpfs of its own
(the shared folder, the interpreter and the repository are bound into its
/tmp where they live under it), so nothing one node writes there is seen by
another, and everything goes with the node. Needs root.

    python tools/cluster_box.py up --nodes 3            # until Ctrl-C or SIGTERM; prints how to reach it
    python tools/cluster_box.py exec zb1a2b 1 -- hostname
    python tools/cluster_box.py cut zb1a2b 2            # heal, cut-store, heal-store, kill

From Python (tests, benchmarks)::

    with Box(3) as box:
        proc = box.run(1, ["python", "-c", "import socket; print(socket.gethostname())"])
        box.cut(2); box.heal(2); box.cut_store(1); box.heal_store(1); box.kill(2); box.boot(2)

What it guarantees: ``stop()`` (and leaving the ``with``) kills every process
of every node, deletes the namespaces, veths and bridge, stops the store and
removes the box's folder; and so does the box's keeper, a process under the
servers' guard (zephon_stream/storage/lifetime.py), within a second or so of
the process that made the box dying, SIGKILL included. Boxes whose owner and
keeper were both killed are swept by the next box's start.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess as sp
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

# Only the standard library and the network module at import, so that the command line says why it
# cannot make a box (not root) before anything heavier loads; the store and the keeper come in start().
from tools import box_network as net
from tools.box_node import REPO_ROOT, Node, boot_script, read_line, visible_paths

TMPFS_BYTES = 1 << 30  # A ceiling, not a reservation: tmpfs takes memory only for what is written
BOOT_TIMEOUT_S = 20.0
_DROPPED_ENV = ("TMPDIR", "ZEPHON_NODE_CACHE", "LOCAL_WORLD_SIZE", "LOCAL_RANK", "RANK", "WORLD_SIZE")


class Box:
    """N nodes as network namespaces on one bridge, a shared folder, and SeaweedFS on the bridge's address.

    Args:
        num_nodes: how many nodes.
        root: the box's folder (None: a temporary one); removed by ``stop()`` either way.
        store: run SeaweedFS and the recording proxy in front of it.
        buckets: buckets made on the store.
        rate_limit: the store's request rate per prefix (the proxy answers 503 SlowDown beyond it); None: none.
        burst: the proxy's token bucket (None: one second's worth).
        tmpfs_bytes: the size of each node's /tmp and /dev/shm.

    Raises:
        net.BoxUnavailable: at ``start()``, when this machine cannot make a box (one line says why).
    """

    def __init__(
        self,
        num_nodes: int = 3,
        *,
        root: str | os.PathLike[str] | None = None,
        store: bool = True,
        buckets: tuple[str, ...] = ("data",),
        rate_limit: float | None = None,
        burst: float | None = None,
        tmpfs_bytes: int = TMPFS_BYTES,
    ) -> None:
        if not 1 <= num_nodes <= 240:
            raise ValueError(f"a box holds 1 to 240 nodes (got {num_nodes})")
        self.num_nodes = num_nodes
        self._root_arg = root
        self._store_wanted = store
        self._store_args = {"buckets": buckets, "rate_limit": rate_limit, "burst": burst}
        self._tmpfs_bytes = tmpfs_bytes
        self.root: Path | None = None
        self.names: net.BoxNames | None = None
        self.nodes: list[Node] = []
        self.store: Any = None  # tools.box_store.BoxStore
        self._keeper: Any = None  # tools.server_process.ServerProcess
        self._lock = threading.Lock()

    # -- life --------------------------------------------------------------

    @property
    def name(self) -> str:
        return self._names().name

    @property
    def bridge_address(self) -> str:
        return self._names().bridge_address

    @property
    def shared(self) -> Path:
        """The folder every node sees at this same path."""
        return self._root() / "shared"

    def start(self) -> Box:
        reason = net.unavailable()
        if reason is not None:
            raise net.BoxUnavailable(reason)
        from tools.box_store import BoxStore
        from tools.server_process import ServerProcess
        from zephon_stream.storage.lifetime import mark_owner

        net.sweep()
        self.root = Path(self._root_arg or tempfile.mkdtemp(prefix="zs-box-")).resolve()
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            mark_owner(self.root)
            self.shared.mkdir(exist_ok=True)
            self.names = net.allocate(str(self.root))
            self._keeper = ServerProcess(
                name=f"box {self.name} keeper",
                argv=[sys.executable, "-I", net.__file__, "keep", self.name],
                ready=lambda: True,
                log_path=self.root / "keeper.log",
                remove_on_orphan=self.root,
            ).start()
            hosts = [f"{n.address} {n.hostname}" for n in (Node(self.names, i) for i in range(self.num_nodes))]
            (self.root / "hosts").write_text("\n".join(["127.0.0.1 localhost", *hosts, ""]))
            for index in range(self.num_nodes):
                net.add_node(self.names, index)
                self.nodes.append(Node(self.names, index))
                self.boot(index)
            if self._store_wanted:
                self.store = BoxStore(host=self.bridge_address, **self._store_args).start()
                # SeaweedFS leaves these in /tmp when it is killed rather than stopped, as its guard does.
                net.add_leftovers(self.name, self.store.leftover_patterns())
            self._write_state()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Kill every node's processes, delete the network, stop the store and the keeper, remove the folder."""
        if self.names is not None:
            for node in self.nodes:
                self._reap(node)
            net.teardown(self.name)
            for node in self.nodes:
                self._reap(node)
        if self.store is not None:
            self.store.stop()
            self.store = None
        if self._keeper is not None:
            self._keeper.stop()
            self._keeper = None
        if self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)
        self.nodes, self.names, self.root = [], None, None

    def __enter__(self) -> Box:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # -- a node's life ------------------------------------------------------

    def boot(self, index: int) -> None:
        """Start node ``index`` (again, after ``kill``): fresh /tmp, /dev/shm and hostname, its link as it was."""
        node = self.nodes[index]
        if node.up:
            return
        root = self._root()
        stage = root / f"stage{index}"
        stage.mkdir(exist_ok=True)
        script = boot_script(node, root / "hosts", stage, visible_paths(self.shared), self._tmpfs_bytes)
        with open(root / f"node{index}.log", "ab") as log:
            node.holder = sp.Popen(
                [
                    "nsenter",
                    f"--net=/run/netns/{node.netns}",
                    "unshare",
                    "--mount",
                    "--uts",
                    "--ipc",
                    "--propagation",
                    "private",
                    "sh",
                    "-c",
                    script,
                ],
                stdin=sp.DEVNULL,
                stdout=sp.PIPE,
                stderr=log,
                start_new_session=True,
            )
        ready = read_line(node.holder, BOOT_TIMEOUT_S)
        if ready != "ready":
            node.holder.kill()
            node.holder.wait()
            raise RuntimeError(
                f"{node.hostname} did not boot; its log {root / f'node{index}.log'} ends:\n"
                f"{(root / f'node{index}.log').read_text(errors='replace')[-2000:]}"
            )

    def kill(self, index: int) -> int:
        """SIGKILL every process of node ``index`` (``ip netns pids``), its holder included: the node is down,
        its /tmp and /dev/shm gone, until ``boot``. Returns how many processes were killed."""
        node = self.nodes[index]
        killed = net.kill_netns(node.netns)
        self._reap(node)
        return killed

    def cut(self, index: int) -> None:
        """Take node ``index``'s link down: its processes run on, and nothing reaches it or leaves it."""
        net.set_link(self._names(), index, up=False)

    def heal(self, index: int) -> None:
        net.set_link(self._names(), index, up=True)

    def cut_store(self, index: int) -> None:
        """Route node ``index``'s packets to the bridge's address (the store) to a neighbour that does not exist:
        they are lost silently, as in a partition, while its peers stay reachable."""
        net.cut_store(self._names(), index)

    def heal_store(self, index: int) -> None:
        net.heal_store(self._names(), index)

    # -- commands on a node -------------------------------------------------

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        """A node's environment: this one without its temp folder and launcher variables, the node's /tmp,
        the repository importable, the store's variables, then ``extra``."""
        env = {k: v for k, v in os.environ.items() if k not in _DROPPED_ENV}
        env["TMPDIR"] = "/tmp"
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
        env.update(self.store.env() if self.store is not None else {})
        env.update(extra or {})
        return env

    def run(
        self,
        index: int,
        argv: list[str],
        *,
        env: dict[str, str] | None = None,
        cwd: str | os.PathLike[str] = REPO_ROOT,
        **popen: Any,
    ) -> sp.Popen[Any]:
        """Start ``argv`` on node ``index`` (in a session of its own) with ``env()`` and ``env``; its Popen.

        Raises:
            RuntimeError: the node is down.
        """
        node = self.nodes[index]
        if not node.up:
            raise RuntimeError(f"{node.hostname} is down (killed): boot it first")
        command = [
            "nsenter",
            f"--target={node.holder.pid}",
            "--net",
            "--mount",
            "--uts",
            "--ipc",
            f"--wd={cwd}",  # type: ignore[union-attr]
            "--",
            *argv,
        ]
        proc = sp.Popen(command, env=self.env(env), start_new_session=True, **popen)
        with self._lock:
            node.processes.append(proc)
        return proc

    def check_output(self, index: int, argv: list[str], *, timeout_s: float = 60.0, **kw: Any) -> str:
        """Run ``argv`` on node ``index`` and return its output; raises CalledProcessError on failure."""
        proc = self.run(index, argv, stdout=sp.PIPE, stderr=sp.PIPE, text=True, **kw)
        out, err = proc.communicate(timeout=timeout_s)
        if proc.returncode != 0:
            raise sp.CalledProcessError(proc.returncode, argv, out, err)
        return out

    def waiting_sockets(self, index: int, address: str) -> int:
        """How many TCP sockets of node ``index`` to ``address`` wait for an answer: connecting (SYN-SENT) or
        holding bytes sent that were not acknowledged (what a lost route leaves a node's requests doing)."""
        listed = sp.run(
            ["nsenter", f"--net=/run/netns/{self.nodes[index].netns}", "ss", "-tnH", "dst", address],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        waiting = 0
        for line in listed.splitlines():
            state, _, send_q = line.split()[:3]
            waiting += state == "SYN-SENT" or (state == "ESTAB" and int(send_q) > 0)
        return waiting

    def pids(self, index: int) -> list[int]:
        """The processes of node ``index``, its holder included."""
        return net.netns_pids(self.nodes[index].netns)

    def leftovers(self, index: int) -> list[str]:
        """What is in node ``index``'s /tmp and /dev/shm, apart from the paths bound into it."""
        keep = visible_paths(self.shared)
        listed = self.check_output(index, ["find", "/tmp", "/dev/shm", "-mindepth", "1"]).splitlines()
        # A bound path and the folders above it are the node's view of the host, not its own files.
        bound = {p for p in listed if any(Path(p).is_relative_to(k) or k.is_relative_to(p) for k in keep)}
        return sorted(set(listed) - bound)

    # -- internals ----------------------------------------------------------

    def _names(self) -> net.BoxNames:
        if self.names is None:
            raise RuntimeError("the box is not started")
        return self.names

    def _root(self) -> Path:
        if self.root is None:
            raise RuntimeError("the box is not started")
        return self.root

    def _reap(self, node: Node) -> None:
        with self._lock:
            procs, node.processes = node.processes, []
        for proc in [*procs, *([node.holder] if node.holder is not None else [])]:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, 9)
                except ProcessLookupError:
                    pass
                proc.wait()
            for stream in (proc.stdin, proc.stdout, proc.stderr):
                if stream is not None:
                    stream.close()
        node.holder = None

    def _write_state(self) -> None:
        state = {
            "name": self.name,
            "bridge": self.bridge_address,
            "shared": str(self.shared),
            "nodes": [
                {"hostname": n.hostname, "address": n.address, "holder": n.holder.pid}  # type: ignore[union-attr]
                for n in self.nodes
            ],
            "store_env": self.store.env() if self.store is not None else {},
        }
        (self._root() / "box.json").write_text(json.dumps(state, indent=1))


# -- the command line ---------------------------------------------------------


def _state(name: str) -> dict:
    entry = net.registered().get(name)
    if entry is None:
        raise SystemExit(f"no box named {name!r} runs here (boxes: {', '.join(net.registered()) or 'none'})")
    return json.loads((Path(entry["folder"]) / "box.json").read_text())


def _up(args: argparse.Namespace) -> int:
    import signal

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    with Box(args.nodes, store=not args.no_store, buckets=tuple(args.bucket), rate_limit=args.rate_limit) as box:
        me = f"{sys.executable} {Path(__file__).resolve()}"
        print(
            f"box {box.name}: {box.num_nodes} nodes on bridge {box.names.bridge} {box.bridge_address}/24, "  # type: ignore[union-attr]
            f"shared folder {box.shared}",
            flush=True,
        )
        for node in box.nodes:
            print(f"  {node.hostname} {node.address}: {me} exec {box.name} {node.index} -- COMMAND", flush=True)
        if box.store is not None:
            print(f"store {box.store.endpoint_url} (buckets {', '.join(args.bucket)}); on the nodes:", flush=True)
            print("  " + " ".join(f"{k}={shlex.quote(v)}" for k, v in box.store.env().items()), flush=True)
        print(f"cut, heal, cut-store, heal-store, kill: {me} cut {box.name} NODE; Ctrl-C tears it down", flush=True)
        while not stop.wait(0.5):
            pass
    print("box torn down", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="verb", required=True)
    up = sub.add_parser("up", help="make a box and hold it until Ctrl-C or SIGTERM, then tear it down")
    up.add_argument("--nodes", type=int, default=3)
    up.add_argument("--no-store", action="store_true", help="no SeaweedFS")
    up.add_argument("--bucket", action="append", default=[], help="bucket to make (repeatable; default data)")
    up.add_argument("--rate-limit", type=float, default=None, help="the store's requests/s per prefix (503 beyond)")
    run = sub.add_parser("exec", help="run a command on a node of a running box, with the store's variables")
    run.add_argument("name")
    run.add_argument("node", type=int)
    run.add_argument("command", nargs=argparse.REMAINDER)
    for verb, what in (
        ("cut", "take a node's link down"),
        ("heal", "bring it up"),
        ("cut-store", "lose a node's packets to the store"),
        ("heal-store", "route them again"),
        ("kill", "SIGKILL every process of a node (it stays down)"),
    ):
        one = sub.add_parser(verb, help=what)
        one.add_argument("name")
        one.add_argument("node", type=int)
    args = parser.parse_args(argv)
    if args.verb == "up":
        args.bucket = args.bucket or ["data"]
        reason = net.unavailable()
        if reason is not None:
            print(reason, file=sys.stderr)
            return 1
        return _up(args)
    state = _state(args.name)
    names = net.BoxNames(args.name, net.registered()[args.name]["subnet"])
    if args.verb == "exec":
        command = args.command[1:] if args.command[:1] == ["--"] else args.command
        env = {**os.environ, "TMPDIR": "/tmp", **state["store_env"]}
        holder = state["nodes"][args.node]["holder"]
        return sp.call(
            [
                "nsenter",
                f"--target={holder}",
                "--net",
                "--mount",
                "--uts",
                "--ipc",
                f"--wd={REPO_ROOT}",
                "--",
                *command,
            ],
            env=env,
        )
    if args.verb == "kill":
        print(f"killed {net.kill_netns(names.netns(args.node))} processes", flush=True)
        return 0
    if args.verb in ("cut", "heal"):
        net.set_link(names, args.node, up=args.verb == "heal")
    elif args.verb == "cut-store":
        net.cut_store(names, args.node)
    else:
        net.heal_store(names, args.node)
    return 0


if __name__ == "__main__":
    sys.exit(main())
