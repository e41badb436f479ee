"""The server launchers run by hand: each script serves until SIGTERM, prints
where it listens and where its data are, then stops and removes them."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = {
    "seaweedfs.py": ["--bucket", "zs-script"],
    "fake_gcs.py": ["--bucket", "zs-script"],
    "azurite.py": ["--container", "zs-script"],
}
PROBES = {
    "seaweedfs.py": "/zs-script",
    "fake_gcs.py": "/storage/v1/b/zs-script",
    "azurite.py": "/devstoreaccount1?comp=list",
}


def http_status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_launcher_script_serves_until_sigterm_and_removes_its_data(script):
    process = subprocess.Popen(
        [sys.executable, str(REPO / "tools" / script), *SCRIPTS[script]],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    try:
        first = process.stdout.readline()
        match = re.search(r"on (http://127\.0\.0\.1:\d+), pid (\d+), data in (\S+)", first)
        assert match, (first, process.stderr.read() if process.poll() is not None else "")
        endpoint, server_pid, data_dir = match.group(1), int(match.group(2)), Path(match.group(3))
        assert data_dir.is_dir()
        # The S3 and blob probes are unsigned: refused (403) or listed, the server answered.
        assert http_status(endpoint + PROBES[script]) in (200, 403)
    finally:
        process.send_signal(signal.SIGTERM)
        out, _ = process.communicate(timeout=60)
    assert process.returncode == 0
    assert out.strip().endswith("stopped")
    assert not data_dir.exists()
    # The server runs in a session of its own; the script must have stopped it.
    with pytest.raises(ProcessLookupError):
        os.kill(server_pid, 0)
    with pytest.raises(OSError):
        urllib.request.urlopen(endpoint, timeout=2)
