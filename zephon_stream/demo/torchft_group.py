"""One rank of one torchft replica group, trained on a model that counts.

The model's only parameters count the rows that committed steps trained:
``ours[t, p]`` is minus the times position ``p`` was trained at committed
step ``t`` (each row's gradient is one at its position; gradients are
SUM-allreduced with ``Manager.allreduce``, which zeroes a healing group's; the
optimizer subtracts them only when ``should_commit()``). ``sampler[p]`` does
the same for the rows ``torchft.data.DistributedSampler`` semantics give this
group (group ``r`` of ``G`` takes positions ``r, r+G, ...``, its counter
starting again with the process). A healing group receives both with the
loader's data state through torchft's own transfer.

Usage: python -m zephon_stream.demo.torchft_group SPEC_JSON (written by
demo/torchft_run.py; keys below, in ``main``).
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
from torch.distributed import ReduceOp, TCPStore
from torchft import Manager, ProcessGroupGloo

from zephon_stream.integrations.torchft import TorchFTConfig, TorchFTLoader


def row_digest(inputs: torch.Tensor, labels: torch.Tensor) -> str:
    return hashlib.sha1(inputs.numpy().tobytes() + labels.numpy().tobytes()).hexdigest()[:16]


def wait_for(path: Path, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {timeout_s} s for {path}")
        time.sleep(0.02)


def main() -> None:
    spec = json.loads(sys.argv[1])
    out = Path(spec["out"])
    group, rank, ranks = spec["group"], spec["group_rank"], spec["group_world_size"]
    life = spec["life"]
    name = f"g{group}r{rank}"
    steps, positions = spec["steps"], spec["max_positions"]
    kinds = spec["loaders"]
    ours = torch.zeros(len(kinds), steps, positions)
    sampler = torch.zeros(positions)

    def load_model(state: dict) -> None:
        ours.copy_(state["ours"])
        sampler.copy_(state["sampler"])

    # Each group its own store; rank 0 hosts it on a free port and tells the others.
    port_file = out / f"g{group}.life{life}.port"
    if rank == 0:
        store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=60))
        port_file.with_suffix(".tmp").write_text(str(store.port))
        port_file.with_suffix(".tmp").rename(port_file)
    else:
        wait_for(port_file)
        store = TCPStore(
            "127.0.0.1",
            int(port_file.read_text()),
            is_master=False,
            wait_for_workers=False,
            timeout=timedelta(seconds=60),
        )
    manager = Manager(
        pg=ProcessGroupGloo(timeout=timedelta(seconds=15)),
        load_state_dict=load_model,
        state_dict=lambda: {"ours": ours, "sampler": sampler},
        min_replica_size=1,
        use_async_quorum=spec["async_quorum"],
        timeout=timedelta(seconds=15),
        quorum_timeout=timedelta(seconds=60),
        connect_timeout=timedelta(seconds=30),
        rank=rank,
        world_size=ranks,
        store_addr="127.0.0.1",
        store_port=store.port,
        lighthouse_addr=spec["lighthouse"],
        replica_id=f"group_{group}",
    )
    loaders = []
    for kind in kinds:
        config = TorchFTConfig(
            seq_len=spec["seq_len"],
            policy=kind["policy"],
            group_batch_size=kind.get("group_batch"),
            global_batch_size=kind.get("global_batch"),
            lanes=spec["lanes"],
            seed=3,
            state_key=f"data_{kind['policy']}_{kind.get('packing', 'concat')}",
        )
        loaders.append(
            TorchFTLoader(
                spec["dataset"],
                manager=manager,
                config=config,
                group_rank=rank,
                group_world_size=ranks,
                loader_options={"pipeline": "threads", "prefetch_steps": 2, "packing": kind.get("packing", "concat")},
            )
        )
    records = (out / f"{name}.life{life}.jsonl").open("w")
    (out / f"{name}.life{life}.ready").write_text("")
    wait_for(out / "go")
    local_batches = 0
    events = spec.get("events", {})
    while manager.current_step() < steps:
        step_before = manager.current_step()
        hold = events.get("hold_at")
        if hold is not None and step_before >= hold[0]:
            wait_for(out / hold[1])
        if events.get("leave_at") is not None and step_before >= events["leave_at"]:
            break
        manager.start_quorum()
        batches = [next(loader) for loader in loaders]
        step = manager.current_step()
        if events.get("kill_at") is not None and life == 1 and step >= events["kill_at"]:
            records.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        grad_ours = torch.zeros_like(ours)
        grad_sampler = torch.zeros_like(sampler)
        for i, batch in enumerate(batches):
            for p in batch["sample_positions"].tolist():
                if p >= 0:
                    grad_ours[i, step, p] += 1
        # torchft.data.DistributedSampler over groups of this size:
        # shard group + G * group_rank ... of G * ranks shards, restarting
        # with the process.
        shards = spec["sampler_groups"] * ranks
        shard = rank + ranks * group
        local = len(batches[0]["sample_positions"])
        for j in range(local):
            p = (local_batches * local + j) * shards + shard
            if p < positions:
                grad_sampler[p] += 1
        local_batches += 1
        works = [manager.allreduce(g, reduce_op=ReduceOp.SUM) for g in (grad_ours, grad_sampler)]
        for work in works:
            work.wait()
        if events.get("fail_at") is not None and step == events["fail_at"] and not (out / f"{name}.failed").exists():
            (out / f"{name}.failed").write_text("")
            manager.report_error(RuntimeError("injected failure"))
        committed = manager.should_commit()
        if committed:
            ours.sub_(grad_ours)
            sampler.sub_(grad_sampler)
        record = loaders[0].last_step
        records.write(
            json.dumps(
                {
                    "time": time.time(),
                    "step": step,
                    "participants": record.participants,
                    "rank": record.participating_rank,
                    "counted": record.counted,
                    "committed": committed,
                    "trained": [
                        sorted(x.last_step.trained) if x.last_step.trained is not None else None for x in loaders
                    ],
                    "positions": [b["sample_positions"].tolist() for b in batches],
                    "digests": [
                        [row_digest(b["input"][i], b["labels"][i]) for i in range(len(b["input"]))] for b in batches
                    ],
                }
            )
            + "\n"
        )
        records.flush()
        (out / f"{name}.step").write_text(str(manager.current_step()))
    records.close()
    torch.save(
        {
            "ours": ours,
            "sampler": sampler,
            "step": manager.current_step(),
            "states": [loader.state_dict() for loader in loaders],
        },
        out / f"{name}.final.pt",
    )
    for loader in loaders:
        loader.close()
    manager.shutdown(wait=False)
    (out / f"{name}.done").write_text(str(manager.current_step()))


if __name__ == "__main__":
    main()
