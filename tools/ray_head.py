"""A local Ray head on loopback, as a server process of its own: ``ray start --head --block``.

Tests and tools that need Ray start one of these and connect drivers to
``address`` from other processes, so that no test process is a Ray driver:
Ray ends a driver whose node fails ("connection to the plasma store is
failed. Terminate the process"), and a driver inside a pytest worker took
the worker, and every fixture it held, with it.

The head runs under the same guard as the object-store servers
(``zephon_stream/storage/lifetime.py``): ``ray start --block`` holds the
raylet, the GCS and the agents in its process group (each also dies with it),
and the guard stops them all once this process is gone. Every port is chosen
free on loopback, so two heads on one machine (two test workers) never meet
on Ray's fixed defaults. No dashboard, usage reporting off, workers at the
caller's niceness (Ray's default 15 put every other process first), and a
token of its own that its drivers need (``env()``).

    python tools/ray_head.py --num-cpus 2
"""

from __future__ import annotations

import argparse
import os
import secrets
import sys
from collections.abc import Iterable
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tools.processes import process_group, processes
from tools.server_process import LoopbackServer, free_ports, installed_command, serve_until_signalled

INSTALL_HINT = "install Ray: pip install 'ray[data]>=2.60,<3' (the project's 'ray' extra)"
# Enough for the tests' small Ray Datasets; Ray's default is 30% of memory.
OBJECT_STORE_BYTES = 256 * 1024 * 1024
_PORT_FLAGS = (
    "port",
    "node-manager-port",
    "object-manager-port",
    "ray-client-server-port",
    "dashboard-agent-listen-port",
    "dashboard-agent-grpc-port",
    "metrics-export-port",
    "runtime-env-agent-port",
)
_STARTED_LINE = "Ray runtime started"
GCS_RECONNECT_S = 5
# A single-machine instance: without the first, Ray rewrites 127.0.0.1
# in an address to this machine's outside address and connects there.
RAY_LOOPBACK_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0"}
"""Variables for every process of a test's Ray (head, drivers, CLI runs): loopback only, no usage reporting."""


def ray_binary() -> str:
    """The ``ray`` command (installed beside the interpreter with Ray)."""
    return installed_command("ray", f"the 'ray' command was not found; {INSTALL_HINT}")


class RayHead(LoopbackServer):
    """``ray start --head --block`` on 127.0.0.1, its session files in a short temporary folder.

    Args:
        num_cpus: the CPUs the node offers to tasks.
        data_dir: Ray's temporary folder; None makes one under ``/tmp``
            (Ray's socket paths may not exceed 107 bytes), removed by ``stop()``.
        host: the address to bind.
    """

    _server_name = "Ray head"
    _dir_prefix = "zs-ray-"
    _log_name = "ray-start.log"

    def __init__(
        self, *, num_cpus: int = 2, data_dir: str | os.PathLike[str] | None = None, host: str = "127.0.0.1"
    ) -> None:
        super().__init__(data_dir=data_dir, port=0, host=host)
        self._num_cpus = num_cpus
        self._ports: dict[str, int] = {}

    @property
    def address(self) -> str:
        """The GCS address drivers connect to (``ray.init(address=...)``, ``--ray-address``)."""
        return f"{self._host}:{self.port}"

    @property
    def token_path(self) -> Path:
        """The file holding this head's token (mode 0600, in its folder)."""
        return self.data_dir / "auth_token"

    def env(self) -> dict[str, str]:
        """What a driver in another process needs besides the address: loopback, this head's token,
        and a driver that ends within seconds once the head is gone (Ray waits 60 s for its GCS)."""
        return {
            **RAY_LOOPBACK_ENV,
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN_PATH": str(self.token_path),
            "RAY_gcs_rpc_server_reconnect_timeout_s": str(GCS_RECONNECT_S),
        }

    def _temp_root(self) -> str | None:
        return "/tmp" if os.path.isdir("/tmp") else None

    def _binary(self) -> str:
        return ray_binary()

    def _pick_ports(self) -> None:
        self._ports = dict(zip(_PORT_FLAGS, free_ports(len(_PORT_FLAGS), self._host)))
        self._port = self._ports["port"]

    def _argv(self, binary: str) -> list[str]:
        ports = [f"--{flag}={port}" for flag, port in self._ports.items()]
        return [
            binary, "start", "--head", "--block", f"--node-ip-address={self._host}", *ports,
            f"--num-cpus={self._num_cpus}", f"--object-store-memory={OBJECT_STORE_BYTES}",
            "--include-dashboard=false", "--disable-usage-stats", f"--temp-dir={self.data_dir}",
        ]  # fmt: skip

    def _process_env(self) -> dict[str, str]:
        # Ray 2.60 turns token authentication on by itself once
        # ~/.ray/auth_token exists (a local ray.init() writes it), and then
        # refuses drivers without it; a token of the head's own, given to its
        # drivers, works either way and lets no other user's process in.
        fd = os.open(self.token_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as token:
            token.write(secrets.token_hex(32))
        env = {**os.environ, **self.env()}
        env.setdefault("RAY_worker_niceness", "0")
        return env

    def _ready(self) -> bool:
        try:
            return _STARTED_LINE in (self.data_dir / self._log_name).read_text(errors="replace")
        except OSError:
            return False

    def group_pids(self) -> list[int]:
        """The processes of the head's group: the guard, ``ray start``, the raylet, the GCS, agents, workers."""
        if self.pid is None:
            return []
        return process_group(self.pid)

    def raylet_pid(self) -> int | None:
        """The raylet's process id (task workers are its children)."""
        raylets = (p.pid for p in processes() if p.group == self.pid and p.state != "Z" and p.command == "raylet")
        return next(raylets, None)

    def worker_pids(self, title: str) -> list[int]:
        """The raylet's children whose title starts with ``title`` (``ray::convert_unit_task``)."""
        raylet = self.raylet_pid()
        if raylet is None:
            return []
        found = []
        for pid in _children(raylet):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
                    if cmdline.read().startswith(title.encode()):
                        found.append(pid)
            except OSError:
                continue
        return found


def _children(parent: int) -> list[int]:
    try:
        with open(f"/proc/{parent}/task/{parent}/children") as children:
            return [int(pid) for pid in children.read().split()]
    except OSError:
        return []


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--num-cpus", type=int, default=2)
    parser.add_argument("--data-dir", help="Ray's temporary folder (default: a new one, removed at exit)")
    args = parser.parse_args(argv)
    server = RayHead(num_cpus=args.num_cpus, data_dir=args.data_dir)

    def lines() -> Iterable[str]:
        yield f"Ray head at {server.address}, pid {server.pid}, session files in {server.data_dir}"
        yield (
            f"connect with: ray.init(address='{server.address}') or --ray-address {server.address}, "
            "in an environment with"
        )
        yield " ".join(f"{key}={value}" for key, value in server.env().items())

    return serve_until_signalled(server, name="Ray head", lines=lines)


if __name__ == "__main__":
    sys.exit(main())
