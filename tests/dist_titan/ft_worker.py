"""One replica group (one rank) of TorchTitan's torchft trainer, minus the model.

Built from TorchTitan's own torchft pieces as ``FaultTolerantTrainer`` wires
them: ``TorchFTManager`` from its ``FaultTolerance`` config (a real torchft
``Manager`` on the lighthouse), the dataloader through ``config.build`` with
``get_dp_info``'s static split, ``TorchFTOptimizersContainer`` (its
``zero_grad`` starts the quorum, its ``step`` asks ``should_commit``) and
``ZephonFTCheckpointManager`` (which registers the model, optimizer, lr and
train state with the Manager for healing). Each step repeats
``FaultTolerantTrainer.train_step``'s order (tests/test_torchtitan_torchft.py
checks those lines against the installed source).

``counts[p]`` is minus the times a committed step trained position ``p``: its
gradient, SUM-allreduced by ``Manager.allreduce`` (zeroed for a healing
group), is applied only when the step committed; healing and checkpoints
carry it, so at the end it says what was trained, whatever the loader believes.

Usage: python ft_worker.py SPEC_JSON (demo/torchft_run.py's spec, plus
``dump`` (checkpoint base folder), ``interval``, ``local_batch``,
``microbatches``, ``groups``, ``positions`` (the length of ``counts``) and
``device`` (the loader's)).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed import ReduceOp, TCPStore
from torch.distributed.checkpoint.stateful import Stateful
from torchtitan.components.optimizer import LRSchedulersContainer, default_adamw
from torchtitan.experiments.torchft.config.job_config import FaultTolerance
from torchtitan.experiments.torchft.manager import TorchFTManager
from torchtitan.experiments.torchft.optimizer import TorchFTOptimizersContainer

from titan_setup import TrainState, as_rows, trainer_keywords  # this folder is sys.path[0]
from zephon_stream.demo.torchft_group import row_digest, wait_for
from zephon_stream.integrations.torchtitan.torchft import (
    ZephonFTCheckpointManager,
    ZephonFTDataLoader,
)


class Counts(Stateful):
    """The counting model's state: minus the trainings of each position."""

    def __init__(self, positions: int) -> None:
        self.counts = torch.zeros(positions)

    def state_dict(self) -> dict[str, Any]:
        return {"counts": self.counts}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.counts.copy_(state_dict["counts"])


def phase(name: str) -> None:
    print(f"ft_worker: {name} at {time.time():.3f}", flush=True)


def main() -> None:
    phase("start")
    spec = json.loads(sys.argv[1])
    out = Path(spec["out"])
    group, life = spec["group"], spec["life"]
    name = f"g{group}r0"
    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=60))
    os.environ.update(
        {
            "RANK": "0",
            "WORLD_SIZE": "1",
            "LOCAL_RANK": "0",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(store.port),
            "TORCHFT_LIGHTHOUSE": spec["lighthouse"],
            "TORCHFT_TIMEOUT_SEC": "15",
            "TORCHFT_QUORUM_TIMEOUT_SEC": "60",
            "TORCHFT_CONNECT_TIMEOUT_SEC": "30",
        }
    )
    # The group's own one-rank world (DCP), apart from torchft's store.
    dist.init_process_group("gloo", init_method=f"file://{out}/{name}.life{life}.pg", rank=0, world_size=1)

    # FaultTolerantTrainer.init_distributed: config.fault_tolerance.build()
    phase("dist")
    ft_manager = TorchFTManager(
        FaultTolerance(
            enable=True,
            replica_id=group,
            group_size=spec["groups"],
            process_group="gloo",
            process_group_timeout_ms=15000,
        )
    )
    manager = ft_manager.manager
    phase("manager")
    # FaultTolerantTrainer.__init__: get_dp_info, then config.dataloader.build(...)
    batch_degree, batch_rank = ft_manager.get_dp_info(1, 0)
    dataloader = ZephonFTDataLoader.Config(
        dataset_path=spec["dataset"],
        seed=3,
        lanes=spec["lanes"],
        pipeline="threads",
        prefetch_steps=2,
        device=spec.get("device"),
        # The reference rows are read with the plain loader's default.
        cross_document_targets="predict",
    ).build(
        dp_world_size=batch_degree,
        dp_rank=batch_rank,
        tokenizer=None,
        **trainer_keywords(spec["seq_len"], spec["local_batch"]),
    )
    model = torch.nn.Linear(spec["seq_len"], 1, bias=False)
    optimizers = TorchFTOptimizersContainer.Config(
        param_groups=default_adamw(lr=1e-3).param_groups, implementation="for-loop"
    ).build(model_parts=[model], ft_manager=ft_manager)
    lr_schedulers = LRSchedulersContainer.Config(warmup_steps=1).build(optimizers=optimizers, training_steps=1000)
    train_state = TrainState()
    counts = Counts(spec["positions"])
    checkpointer = ZephonFTCheckpointManager.Config(
        enable=True, folder="checkpoint", interval=spec["interval"], keep_latest_k=0
    ).build(
        dataloader=dataloader,
        model_parts=[model],
        optimizers=optimizers,
        lr_schedulers=lr_schedulers,
        states={"train_state": train_state, "counts": counts},
        sd_adapter=None,
        base_folder=spec["dump"],
        ft_manager=ft_manager,
    )
    manager.register_state_dict_fn("counts", counts.load_state_dict, counts.state_dict)
    # ZephonFTTrainer.__init__: bind after the trainer knows its accumulation.
    dataloader.bind_torchft(ft_manager, microbatches=spec["microbatches"])
    # FaultTolerantTrainer.train: checkpointer.load(step=...)
    phase("bound")
    loaded = checkpointer.load(step=-1)
    phase("loaded")

    records = (out / f"{name}.life{life}.jsonl").open("w")
    (out / f"{name}.life{life}.ready").write_text("")
    wait_for(out / "go")
    events = spec.get("events", {})
    data_iterator = iter(dataloader)
    start_position = dataloader.torchft_loader.position
    while manager.current_step() < spec["steps"]:
        hold = events.get("hold_at")
        if hold is not None and manager.current_step() >= hold[0]:
            wait_for(out / hold[1])
        if events.get("leave_at") is not None and manager.current_step() >= events["leave_at"]:
            break
        train_state.step += 1
        # FaultTolerantTrainer.train_step, in its order:
        optimizers.zero_grad(set_to_none=True)
        batches = []
        for _ in range(spec["microbatches"]):
            input_dict, labels = next(data_iterator)
            # With device="cuda" the inputs arrive on the GPU; the counting model is on the host.
            input_dict = {key: value.cpu() for key, value in input_dict.items()}
            shape = list(input_dict["input"].shape)
            inputs, labels = as_rows(input_dict["input"], spec["seq_len"]), as_rows(labels, spec["seq_len"])
            batches.append((inputs, labels, dataloader.last_sample_positions.cpu(), shape))
        step = manager.current_step()
        if events.get("kill_at") is not None and life == 1 and step >= events["kill_at"]:
            records.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        grad = torch.zeros_like(counts.counts)
        for inputs, _, positions, _ in batches:
            loss = model(inputs.float()).mean()
            loss.backward()
            for p in positions.tolist():
                if p >= 0:
                    grad[p] += 1
        # TorchTitan reduces gradients in FSDP's all-reduce hook over
        # the Manager's process group; a plain module reduces them here.
        works = [manager.allreduce(p.grad) for p in model.parameters()]
        works.append(manager.allreduce(grad, reduce_op=ReduceOp.SUM))
        for work in works:
            work.wait()
        optimizers.step()
        committed = manager.current_step() == step + 1
        if committed:
            counts.counts.sub_(grad)
        saved = checkpointer.save(train_state.step)
        record = dataloader.torchft_loader.last_step
        records.write(
            json.dumps(
                {
                    "time": time.time(),
                    "step": step,
                    "train_step": train_state.step,
                    "participants": record.participants,
                    "rank": record.participating_rank,
                    "counted": record.counted,
                    "committed": committed,
                    "saved": saved,
                    "positions": [[p for b in batches for p in b[2].tolist()]],
                    "shapes": [b[3] for b in batches],
                    "digests": [[row_digest(b[0][i], b[1][i]) for b in batches for i in range(len(b[1]))]],
                }
            )
            + "\n"
        )
        records.flush()
        (out / f"{name}.step").write_text(str(manager.current_step()))
    records.close()
    checkpointer.maybe_wait_for_saving()
    torch.save(
        {
            "ours": counts.counts.clone().unsqueeze(0),
            "step": manager.current_step(),
            "loaded": loaded,
            "start_position": start_position,
            "state": dataloader.state_dict(),
        },
        out / f"{name}.final.pt",
    )
    dataloader.close()
    checkpointer.close()
    manager.shutdown(wait=False)
    (out / f"{name}.done").write_text(str(manager.current_step()))


if __name__ == "__main__":
    main()
