"""The embedded S3 server's port, as the demo's user meets it: a port whose
last server left its connections in TIME-WAIT is free (the OS lets a server
that sets SO_REUSEADDR listen there), and a port another socket listens on is
reported once, in one wording, before the server moves to a free one."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from zephon_stream.storage.embedded_s3 import EmbeddedS3

REPO = Path(__file__).resolve().parents[1]
HOST = "127.0.0.1"


def port_left_in_time_wait(connections: int = 20) -> int:
    """A port on which a stopped server's connections linger in TIME-WAIT, and nothing listens.

    The server closes each connection first, as an HTTP server does after its
    answer, so the TIME-WAIT entries hold the server's own port.
    """
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind((HOST, 0))
    server.listen(connections)
    port = server.getsockname()[1]
    for _ in range(connections):
        client = socket.create_connection((HOST, port), timeout=10)
        accepted, _ = server.accept()
        accepted.close()
        assert client.recv(1) == b""
        client.close()
    server.close()
    # The state this test is about: a bind without SO_REUSEADDR (the
    # old probe's) is refused, though nothing listens.
    with socket.socket() as plain, pytest.raises(OSError):
        plain.bind((HOST, port))
    return port


def run_demo_store(port: int) -> tuple[str, str]:
    """Open the demo's store with ``--s3-port port`` in a fresh process, as the demo does;
    return its stdout and stderr (the warning reaches stderr as the demo's user sees it)."""
    code = (
        "import sys\n"
        "from zephon_stream.demo.orchestrate import DemoConfig, open_demo_store\n"
        "with open_demo_store(DemoConfig(s3_port=int(sys.argv[1]))) as url:\n"
        "    print('dataset at', url)\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    done = subprocess.run(
        [sys.executable, "-c", code, str(port)], capture_output=True, text=True, timeout=180, env=env, cwd=REPO
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout, done.stderr


def test_a_port_left_in_time_wait_is_used_without_a_warning(caplog):
    port = port_left_in_time_wait()
    with caplog.at_level(logging.WARNING, logger="zephon_stream.storage"):
        with EmbeddedS3(port=port) as server:
            assert server.port == port
            assert server.create_bucket("time-wait") == "s3://time-wait"
    assert [r.getMessage() for r in caplog.records if r.name.startswith("zephon_stream")] == []


def test_the_demo_reruns_on_its_port_after_a_run_without_a_word():
    port = port_left_in_time_wait()
    out, err = run_demo_store(port)
    assert f"embedded S3 (moto) serving on http://{HOST}:{port}\n" in out
    assert "in use" not in out + err and "taken" not in out + err, out + err


def test_the_demo_reports_a_port_another_server_listens_on_once():
    with socket.socket() as blocker:
        blocker.bind((HOST, 0))
        blocker.listen()
        taken = blocker.getsockname()[1]
        out, err = run_demo_store(taken)
    mentions = [line for line in (out + err).splitlines() if f"port {taken}" in line]
    assert len(mentions) == 1, out + err
    assert mentions[0].startswith(f"embedded S3: port {taken} on {HOST} is in use; serving on port ")
    moved = int(mentions[0].split("serving on port ")[1].split()[0])
    assert moved != taken and f"serving on http://{HOST}:{moved}\n" in out
