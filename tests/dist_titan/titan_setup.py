"""Pieces shared by the TorchTitan tests and their torchrun workers.

The workers build their loaders through TorchTitan's ``Config.build`` and
checkpoint through TorchTitan's own ``CheckpointManager`` (DCP underneath),
exactly as ``torchtitan.trainer.Trainer`` wires them, minus the GPU-only parts.

Every TorchTitan test runs against the installed TorchTitan, 0.3.0 or main
(tests/test_torchtitan_main.py runs them again with main first on the path):
``trainer_keywords`` are the keywords that TorchTitan's trainer passes a
loader's ``build``, and ``as_rows`` views a batch of either form as rows.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.checkpoint.stateful import Stateful
from torch.utils.data import IterableDataset
from torchtitan.components.optimizer import LRSchedulersContainer, default_adamw

from zephon_stream.integrations.torchtitan import TITAN

CheckpointManager = importlib.import_module(TITAN.checkpoint_module).CheckpointManager

if os.environ.get("ZEPHON_EXPECT_TORCHTITAN", TITAN.name) != TITAN.name:
    raise RuntimeError(f"expected TorchTitan {os.environ['ZEPHON_EXPECT_TORCHTITAN']}, found {TITAN.name}: "
                       "a process lost the session's PYTHONPATH")  # fmt: skip


def trainer_keywords(seq_len: int, rows: int) -> dict[str, int]:
    """What the installed TorchTitan's trainer passes ``Config.build`` for
    ``rows`` rows of ``seq_len`` tokens per dp rank."""
    if TITAN.flat_batches:
        return {"max_context_length": seq_len, "num_tokens_per_batch": rows * seq_len}
    return {"seq_len": seq_len, "local_batch_size": rows}


def as_rows(tensor: torch.Tensor, seq_len: int) -> torch.Tensor:
    """A batch tensor as ``[rows, seq_len]``: 0.3.0's as it is, main's 1-D one cut into its rows."""
    return tensor.reshape(-1, seq_len)


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
    return [hashlib.sha256(i.tobytes() + l.tobytes()).hexdigest() for i, l in zip(inputs_np, labels_np)]


def write_json(path: str, payload: Any) -> None:
    """Write ``payload`` atomically (the test reads it after torchrun exits)."""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as out:
        json.dump(payload, out)
    os.replace(tmp, path)


def token_rows(num_tokens: int, seed: int) -> np.ndarray:
    """Deterministic token ids for the stand-in dataset of TorchTitan's own loader."""
    return np.random.default_rng(seed).integers(0, 2000, size=num_tokens, dtype=np.int64)


# -- TorchTitan's own loader, to show what it does at a new dp degree -------------------


class PackedTokens(IterableDataset, Stateful):
    """A per-rank packed-token dataset in the style of TorchTitan 0.3.0's text
    datasets, for its ``ParallelAwareDataloader``."""

    def __init__(self, *, seq_len: int, dp_rank: int, dp_world_size: int) -> None:
        self._tokens = token_rows(1 << 16, seed=0)
        self._seq_len = seq_len
        self._rank = dp_rank
        self._world = dp_world_size
        self._sample_idx = 0

    def __iter__(self):
        while True:
            row = self._sample_idx * self._world + self._rank
            start = (row * self._seq_len) % (len(self._tokens) - self._seq_len - 1)
            window = torch.from_numpy(self._tokens[start : start + self._seq_len + 1])
            self._sample_idx += 1
            yield {"input": window[:-1]}, window[1:]

    def state_dict(self):
        return {"sample_idx": self._sample_idx}

    def load_state_dict(self, state_dict):
        self._sample_idx = state_dict["sample_idx"]


def titan_own_loader(*, rank: int, world: int, seq_len: int, rows: int, tokenizer: Any, corpus_jsonl: str) -> Any:
    """TorchTitan's own loader for the installed API: 0.3.0's
    ``ParallelAwareDataloader`` over packed tokens, or main's ``GrainDataLoader``
    (concatenate then split) over a JSONL corpus of ``{"text": ...}`` lines."""
    if not TITAN.flat_batches:
        from torchtitan.components.dataloader import ParallelAwareDataloader

        return ParallelAwareDataloader(PackedTokens(seq_len=seq_len, dp_rank=rank, dp_world_size=world), dp_rank=rank,
                                       dp_world_size=world, batch_size=rows)  # fmt: skip
    from torchtitan.components.data import (
        ConcatThenSplitPackingConfig,
        GrainDataLoader,
        IndexedJsonlSource,
        SingleDatasetConfig,
    )
    from torchtitan.hf_datasets.text_datasets import TextProcessor

    source = SingleDatasetConfig(source=IndexedJsonlSource.Config(patterns=(corpus_jsonl,)),
                                 processor=TextProcessor.Config(), post_filters=(lambda sample: sample is not None,))
    config = GrainDataLoader.Config(dataset=ConcatThenSplitPackingConfig(dataset=source), shuffle=False)
    return config.build(dp_world_size=world, dp_rank=rank, tokenizer=tokenizer, max_context_length=seq_len,
                        num_tokens_per_batch=rows * seq_len)  # fmt: skip


def titan_own_entries(world: int) -> list[str]:
    """The ``dataloader.*`` checkpoint entries TorchTitan's own loader writes at dp ``world``: one per rank
    (main's Grain state is a nested dict: these are its top-level keys)."""
    ranks = [f"dataloader.dp_rank_{r}" for r in range(world)]
    if TITAN.flat_batches:
        return sorted([*ranks, "dataloader.dp_world_size", "dataloader.version"])
    return [*ranks, "dataloader.world_size"]


TITAN_OWN_REFUSAL = (
    ("ValueError", "cannot resume after changing the effective data-parallel degree")
    if TITAN.flat_batches
    else ("AssertionError", "dataloader resharding is not supported yet")
)
"""The error type and message TorchTitan's own loader raises loading a checkpoint of another dp degree."""
