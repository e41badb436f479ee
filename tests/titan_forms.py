"""What the TorchTitan tests need to know of the installed TorchTitan's data API.

Every TorchTitan test runs against the installed TorchTitan 0.3.0 and again,
in tests/test_torchtitan_main.py, with TorchTitan main first on the path.
``trainer_keywords`` are the keywords that TorchTitan's trainer passes a
loader's ``build``; ``as_rows`` views a batch of either form as its rows;
``repeat`` is the flag a validator sets on a loader config.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import torch
from torch.distributed.checkpoint.stateful import Stateful
from torch.utils.data import IterableDataset

from zephon_stream.integrations.torchtitan import TITAN

if os.environ.get("ZEPHON_EXPECT_TORCHTITAN", TITAN.name) != TITAN.name:
    raise RuntimeError(
        f"expected TorchTitan {os.environ['ZEPHON_EXPECT_TORCHTITAN']}, found {TITAN.name}: "
        "a process lost the session's PYTHONPATH"
    )


def trainer_keywords(seq_len: int, rows: int) -> dict[str, int]:
    """What the installed TorchTitan's trainer passes ``Config.build`` for
    ``rows`` rows of ``seq_len`` tokens per dp rank."""
    if TITAN.flat_batches:
        return {"max_context_length": seq_len, "num_tokens_per_batch": rows * seq_len}
    return {"seq_len": seq_len, "local_batch_size": rows}


def as_rows(tensor: torch.Tensor, seq_len: int) -> torch.Tensor:
    """A batch tensor as ``[rows, seq_len]``: 0.3.0's as it is, main's 1-D one cut into its rows."""
    return tensor.reshape(-1, seq_len)


def repeat(value: bool) -> dict[str, bool]:
    """The keyword a validator sets on a loader config (``infinite`` on 0.3.0, ``repeat`` on main)."""
    return {TITAN.repeat_field: value}


# -- TorchTitan's own loader, to show what it does at a new dp degree -------------------


class PackedTokens(IterableDataset, Stateful):
    """A per-rank packed-token dataset in the style of TorchTitan 0.3.0's text
    datasets, for its ``ParallelAwareDataloader``."""

    def __init__(self, *, seq_len: int, dp_rank: int, dp_world_size: int) -> None:
        self._tokens = np.random.default_rng(0).integers(0, 2000, size=1 << 16, dtype=np.int64)
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


def titan_own_loader(
    *, rank: int, world: int, seq_len: int, rows: int, tokenizer: Any, corpus_jsonl: str, num_tokens: int | None = None
) -> Any:
    """TorchTitan's own loader for the installed API: 0.3.0's
    ``ParallelAwareDataloader`` over packed tokens, or main's ``GrainDataLoader``
    (concatenate then split, unshuffled) over a JSONL corpus of ``{"text": ...}``
    lines, ``num_tokens`` a batch (default ``rows * seq_len``)."""
    if not TITAN.flat_batches:
        from torchtitan.components.dataloader import ParallelAwareDataloader

        return ParallelAwareDataloader(
            PackedTokens(seq_len=seq_len, dp_rank=rank, dp_world_size=world),
            dp_rank=rank,
            dp_world_size=world,
            batch_size=rows,
        )
    from torchtitan.components.data import (
        ConcatThenSplitPackingConfig,
        GrainDataLoader,
        IndexedJsonlSource,
        SingleDatasetConfig,
    )
    from torchtitan.hf_datasets.text_datasets import TextProcessor

    source = SingleDatasetConfig(
        source=IndexedJsonlSource.Config(patterns=(corpus_jsonl,)),
        processor=TextProcessor.Config(),
        post_filters=(lambda sample: sample is not None,),
    )
    config = GrainDataLoader.Config(dataset=ConcatThenSplitPackingConfig(dataset=source), shuffle=False)
    return config.build(
        dp_world_size=world,
        dp_rank=rank,
        tokenizer=tokenizer,
        max_context_length=seq_len,
        num_tokens_per_batch=num_tokens or rows * seq_len,
    )


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
