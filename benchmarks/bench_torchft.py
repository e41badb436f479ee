"""What the torchft loader costs: the first batch after a quorum change, and
the trainer's CPU in ``next()`` with a stable quorum.

1. Quorum change. A step's share depends on the quorum's shape
   (participants, participating rank); while it stays, the loader reading
   fresh shares runs ahead as usual, and a changed shape builds another at
   that step (integrations/torchft_rows.py). Measured on ``ShareReader``, the
   part of ``TorchFTLoader.__next__`` that reads: the wall time of the first
   batch after the shape changes (2 and 3 participants in turn), against a
   steady step of the same shape, each the median of 5, with the trainer
   ``--compute-ms`` busy between steps. The quorum itself is torchft's time
   and is not in these figures.
2. Stable quorum. A real lighthouse and one replica group (``Manager`` with
   ``ProcessGroupGloo``) in this process; per step ``start_quorum()``,
   ``next(loader)``, ``should_commit()``. ``time.thread_time()`` around
   ``next()`` (the trainer thread's CPU: waiting for the quorum, the one-hot
   SUM allreduce, taking the batch), against a plain ``StreamingLoader`` of
   the same rows in the same run.

The last printed line is one JSON object with the figures.

    python benchmarks/bench_torchft.py [--steps 200 --rows 8 --seq-len 2048]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.bench_read import build_dataset
from zephon_stream import StreamingLoader
from zephon_stream.integrations.torchft import TorchFTConfig, TorchFTLoader
from zephon_stream.integrations.torchft_plan import Piece
from zephon_stream.integrations.torchft_rows import ShareReader


def build(out: Path) -> str:
    build_dataset(out, 8, block_tokens=2**16 + 1)
    return str(out)


def quorum_change(url: str, *, rows: int, seq_len: int, compute_s: float) -> dict[str, float]:
    reader = ShareReader(
        url, group_rank=0, group_world_size=1, seq_len=seq_len, seed=0, lanes=rows * 3, window=0, loader_options={}
    )
    firsts, steadies = [], []
    cursor = 0
    try:
        for change in range(5):
            participants = 2 + change % 2
            for i in range(6):
                started = time.perf_counter()
                reader.read(Piece(cursor, participants, 0), global_batch=participants * rows, fresh=True)
                elapsed = time.perf_counter() - started
                (firsts if i == 0 else steadies).append(elapsed)
                cursor += participants * rows
                time.sleep(compute_s)
    finally:
        reader.close()
    return {
        "first_after_change_ms": 1e3 * statistics.median(firsts),
        "steady_ms": 1e3 * statistics.median(steadies[-5:]),
        "rebuilds": reader.rebuilds,
    }


def stable_cpu(url: str, *, rows: int, seq_len: int, steps: int, compute_s: float) -> dict[str, float]:
    from torch.distributed import TCPStore
    from torchft import Manager, ProcessGroupGloo
    from torchft.coordination import LighthouseServer

    lighthouse = LighthouseServer(bind="[::]:0", min_replicas=1, join_timeout_ms=100)
    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    manager = Manager(
        pg=ProcessGroupGloo(timeout=timedelta(seconds=30)),
        load_state_dict=lambda s: None,
        state_dict=dict,
        min_replica_size=1,
        rank=0,
        world_size=1,
        store_addr="127.0.0.1",
        store_port=store.port,
        lighthouse_addr=lighthouse.address(),
        replica_id="bench",
    )
    ours, plain = [], []
    try:
        config = TorchFTConfig(seq_len=seq_len, group_batch_size=rows, lanes=rows)
        with TorchFTLoader(url, manager=manager, config=config) as loader:
            for _ in range(steps):
                manager.start_quorum()
                started = time.thread_time()
                next(loader)
                ours.append(time.thread_time() - started)
                time.sleep(compute_s)
                manager.should_commit()
        with StreamingLoader(url, seq_len=seq_len, local_batch_size=rows, rank=0, world_size=1, lanes=rows) as loader:
            for _ in range(steps):
                started = time.thread_time()
                next(loader)
                plain.append(time.thread_time() - started)
                time.sleep(compute_s)
    finally:
        manager.shutdown(wait=False)
        lighthouse.shutdown()
    # The first steps start the helper and the first quorum; the steady state is what a run pays.
    skip = min(10, steps // 4)
    ours_us, plain_us = 1e6 * statistics.median(ours[skip:]), 1e6 * statistics.median(plain[skip:])
    return {"next_cpu_us_torchft": ours_us, "next_cpu_us_plain": plain_us, "next_cpu_ratio": ours_us / plain_us}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--compute-ms", type=float, default=20.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        url = build(Path(tmp) / "data")
        change = quorum_change(url, rows=args.rows, seq_len=args.seq_len, compute_s=args.compute_ms / 1e3)
        print(
            f"first batch after a quorum change {change['first_after_change_ms']:.1f} ms, "
            f"steady step {change['steady_ms']:.2f} ms (median of 5)"
        )
        cpu = stable_cpu(url, rows=args.rows, seq_len=args.seq_len, steps=args.steps, compute_s=args.compute_ms / 1e3)
        print(
            f"trainer CPU in next(), stable quorum: torchft {cpu['next_cpu_us_torchft']:.0f} us, "
            f"plain {cpu['next_cpu_us_plain']:.0f} us ({cpu['next_cpu_ratio']:.2f}x)"
        )
    figures = {**change, **cpu, "rows": args.rows, "seq_len": args.seq_len, "compute_ms": args.compute_ms}
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
