"""Pieces shared by the TorchTitan tests and their torchrun workers.

The workers build their loaders through TorchTitan's ``Config.build`` and
checkpoint through TorchTitan's own ``CheckpointManager`` (DCP underneath),
exactly as ``torchtitan.trainer.Trainer`` wires them, minus the GPU-only parts.

Every TorchTitan test runs against the installed TorchTitan, 0.3.0 or main
(tests/titan_forms.py: what differs for the tests).
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.stateful import Stateful
from torchtitan.components.optimizer import LRSchedulersContainer, default_adamw

from zephon_stream.integrations.torchtitan import TITAN

sys.path.append(str(Path(__file__).resolve().parents[1]))  # the workers' folder is sys.path[0]; tests/ holds:
from titan_forms import as_rows, repeat, titan_own_loader, trainer_keywords  # noqa: E402, F401 (for the workers)

CheckpointManager = importlib.import_module(TITAN.checkpoint_module).CheckpointManager


class TrainState(Stateful):
    """The trainer's own ``train_state`` entry: the step counter."""

    def __init__(self) -> None:
        self.step = 0

    def state_dict(self) -> dict[str, Any]:
        return {"step": torch.tensor(self.step)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.step = int(state_dict["step"])


def init_gloo() -> tuple[int, int]:
    """``(rank, world_size)`` after joining the torchrun job with gloo."""
    dist.init_process_group("gloo")
    return dist.get_rank(), dist.get_world_size()


def build_checkpointer(
    *, folder: str, interval: int, dataloader: Any, model: torch.nn.Module, lr: float = 1e-3
) -> tuple[CheckpointManager, Any, Any, TrainState]:
    """A TorchTitan ``CheckpointManager`` over ``dataloader``, ``model``, its
    TorchTitan optimizer and LR scheduler, and a train state, as the trainer
    builds it (``states={"train_state": ...}``)."""
    optimizers = default_adamw(lr=lr).build(model_parts=[model])
    lr_schedulers = LRSchedulersContainer.Config(warmup_steps=1).build(optimizers=optimizers, training_steps=1000)
    train_state = TrainState()
    checkpointer = CheckpointManager.Config(enable=True, folder="checkpoint", interval=interval).build(
        dataloader=dataloader,
        model_parts=[model],
        optimizers=optimizers,
        lr_schedulers=lr_schedulers,
        states={"train_state": train_state},
        sd_adapter=None,
        base_folder=folder,
    )
    return checkpointer, optimizers, lr_schedulers, train_state


def row_digests(inputs: torch.Tensor, labels: torch.Tensor, seq_len: int) -> list[str]:
    """One sha256 per row over its input and label tokens (a batch of either form)."""
    inputs_np = as_rows(inputs, seq_len).cpu().numpy().astype("<i8")
    labels_np = as_rows(labels, seq_len).cpu().numpy().astype("<i8")
    return [
        hashlib.sha256(input_row.tobytes() + label_row.tobytes()).hexdigest()
        for input_row, label_row in zip(inputs_np, labels_np)
    ]


def write_json(path: str, payload: Any) -> None:
    """Write ``payload`` atomically (the test reads it after torchrun exits)."""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as out:
        json.dump(payload, out)
    os.replace(tmp, path)
