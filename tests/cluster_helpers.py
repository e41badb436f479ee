"""What the tests of nodes in a box share (tools/cluster_box.py): the skip when this machine cannot make one,
and a connect probe from one node to an address."""

from __future__ import annotations

import sys
import time

import pytest

from tools import box_network
from tools.cluster_box import Box

BOX_UNAVAILABLE = box_network.unavailable()
needs_box = pytest.mark.skipif(BOX_UNAVAILABLE is not None, reason=f"no cluster box here: {BOX_UNAVAILABLE}")

_CONNECT = """
import socket, sys
sock = socket.socket()
sock.settimeout(float(sys.argv[2]))
try:
    sock.connect((sys.argv[1], 9))
    print("connected")
except ConnectionRefusedError:
    print("refused")
except (TimeoutError, socket.timeout):
    print("timeout")
except OSError as exc:
    print(type(exc).__name__)
"""


def connect(box: Box, node: int, address: str, timeout_s: float = 1.5) -> tuple[str, float]:
    """Try a TCP connection from ``node`` to port 9 of ``address`` (no one listens there): ``refused`` when
    the address is reachable, ``timeout`` when packets are lost; and how long it took."""
    started = time.monotonic()
    out = box.check_output(node, [sys.executable, "-I", "-c", _CONNECT, address, str(timeout_s)]).strip()
    return out, time.monotonic() - started


def box_traces(name: str) -> list[str]:
    """What of box ``name`` the machine still holds: namespaces, links, its registry entry."""
    found = [f"netns {ns}" for ns in box_network.box_netns(name)]
    found += [
        f"link {line.split()[0]}"
        for line in box_network.ip("-br", "link").splitlines()
        if line.split()[0].startswith(name)
    ]
    found += [f"registry {name}" for entry in box_network.registered() if entry == name]
    return found
