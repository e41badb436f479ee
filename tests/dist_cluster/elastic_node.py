"""examples/torchelastic/train.py as the cluster tests run it on the nodes of a box: the example's own main(),
with three things a test needs to see and time what happens, and nothing of its training changed.

- Each step waits the seconds in the file ``ZS_EVENTS/pace`` (none without it) before taking its batch, so
  that a link cut or a store lost for seconds lands mid-run however fast the tiny model trains.
- Each rank writes its loader's counters (retries, throttling) after every step to
  ``ZS_EVENTS/stats-<host>-<rank>-<agent pid>-<restart>.json``, and appends ``opened`` (once its loader is
  built), ``step`` and ``failed`` (the error that ended it) events to ``ZS_EVENTS/events.jsonl`` (one line
  each, with the time, host and round).
- ``N`` in the file ``ZS_EVENTS/hold``: the first time checkpoint ``step-N`` is saved, every rank writes its
  part and then waits ``ZS_HOLD_SAVE_S`` before the ranks gather to commit it (``.metadata``), having said
  so in ``ZS_EVENTS/saving-N-<host>-<rank>``: a test kills a node whole while that checkpoint is being saved.
"""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import time
from pathlib import Path

from torch.distributed.checkpoint import filesystem

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "torchelastic" / "train.py"
EVENTS = Path(os.environ["ZS_EVENTS"])
HOLD_SAVE_S = float(os.environ.get("ZS_HOLD_SAVE_S", "30"))
# A round is one start of the workers: a join restarts them without counting a restart, but each round
# has a rendezvous store (MASTER_PORT) of its own.
ROUND = {
    "host": socket.gethostname(),
    "agent": os.getppid(),
    "restart": int(os.environ["TORCHELASTIC_RESTART_COUNT"]),
    "round": f"{os.getppid()}:{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}",
    "rank": int(os.environ["RANK"]),
    "world": int(os.environ["WORLD_SIZE"]),
}


def event(kind: str, **fields: object) -> None:
    line = json.dumps({"event": kind, "time": time.time(), **ROUND, **fields}) + "\n"
    # One write of a short line in append mode: lines of ranks on several nodes do not interleave.
    with open(EVENTS / "events.jsonl", "a") as out:
        out.write(line)


spec = importlib.util.spec_from_file_location("torchelastic_example", EXAMPLE)
example = importlib.util.module_from_spec(spec)
spec.loader.exec_module(example)


class ObservedLoader(example.StreamingLoader):
    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        event("opened", node_cache=None if self._node_cache is None else self._node_cache.root)

    def __next__(self) -> dict:
        pace = EVENTS / "pace"
        time.sleep(float(pace.read_text()) if pace.exists() else 0.0)
        batch = super().__next__()
        name = f"stats-{ROUND['host']}-{ROUND['rank']}-{ROUND['agent']}-{ROUND['restart']}.json"
        (EVENTS / name).write_text(json.dumps(self.stats()))
        event("step", step=self.step - 1)
        return batch


_write_data = filesystem._FileSystemWriter.write_data


def write_data_then_hold(self, plan, planner):  # type: ignore[no-untyped-def]
    written = _write_data(self, plan, planner)
    hold = (EVENTS / "hold").read_text().strip() if (EVENTS / "hold").exists() else None
    if hold and Path(self.path).name == f"{example.CHECKPOINT_PREFIX}{int(hold):08d}":
        held = EVENTS / f"held-{hold}"
        if not held.exists():
            written.wait()
            (EVENTS / f"saving-{hold}-{ROUND['host']}-{ROUND['rank']}").touch()
            time.sleep(HOLD_SAVE_S)
            held.touch()
    return written


example.StreamingLoader = ObservedLoader
filesystem._FileSystemWriter.write_data = write_data_then_hold

if __name__ == "__main__":
    try:
        example.main()
    except BaseException as exc:
        event("failed", error=f"{type(exc).__name__}: {exc}"[:300])
        raise
