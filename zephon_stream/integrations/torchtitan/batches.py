"""What a step hands TorchTitan's trainer: ``(input_dict, labels)`` in the form
the installed TorchTitan trains, and where its tensors live.

The loader delivers ``input`` and ``positions`` on the configured device (a
CUDA device: copied at their stored width from the pinned ring and widened
there) and ``labels`` on the host (TorchTitan's trainer, 0.3.0 and main,
counts valid labels into a CPU tensor before it moves the batch itself); the
trainer moves every tensor of ``input_dict`` to its device, so scalars a
kernel wants on the host go in as Python ints.

On TorchTitan main a batch is 1-D: its rows laid end to end, ``positions``
restarting at every document and every row, which is how main's attention
finds the documents. The training loaders build their ``StreamingLoader``
with ``batch_layout=TITAN.batch_layout``, so the loader hands over the 1-D
tensors itself (views of the ring slot, made once per slot), and a step
here only pads, when a token budget is not a whole number of rows, as
main's own collator pads. ``EvalLoader`` delivers rows (fresh copies each
step, no slot tensors to keep), which :func:`titan_layout` lays end to end.
"""

from __future__ import annotations

from typing import Any

import torch

from zephon_stream.integrations.torchtitan.api import TITAN
from zephon_stream.integrations.torchtitan.base import TitanShape

__all__ = ["IGNORE_INDEX", "titan_batch", "titan_input_dict", "titan_layout"]

IGNORE_INDEX = -100
"""TorchTitan's ``IGNORE_INDEX``: a label the loss leaves out."""

PACKING_KEYS = ("segment_ids", "document_lengths", "cu_seqlens")
TOKEN_KEYS = ("input", "labels", "positions")


def titan_input_dict(batch: dict[str, torch.Tensor], *, packing_outputs: bool) -> dict[str, Any]:
    """TorchTitan 0.3.0's ``input_dict`` from a loader batch: ``input`` and
    ``positions``, and with ``packing_outputs`` the document outputs, the two
    scalars as Python ints (TorchTitan's trainer moves every tensor of
    ``input_dict`` to the device, and a kernel wants them on the host)."""
    out: dict[str, Any] = {"input": batch["input"], "positions": batch["positions"]}
    if packing_outputs:
        for key in PACKING_KEYS:
            out[key] = batch[key]
        for key in ("num_cu_seqlens", "max_seqlen"):
            out[key] = int(batch[key])
    return out


def titan_batch(
    batch: dict[str, torch.Tensor], *, shape: TitanShape, packing_outputs: bool
) -> tuple[dict[str, Any], torch.Tensor]:
    """``(input_dict, labels)`` in the installed TorchTitan's form, from a
    batch in its layout (``TITAN.batch_layout``; :func:`titan_layout`).

    0.3.0: ``[rows, seq_len]`` tensors as the loader delivers them. Main:
    1-D ``[rows * seq_len + pad_tokens]`` tensors: the loader's own, padded
    when ``pad_tokens``.
    """
    if not TITAN.flat_batches:
        return titan_input_dict(batch, packing_outputs=packing_outputs), batch["labels"]
    inputs, positions, labels = batch["input"], batch["positions"], batch["labels"]
    if shape.pad_tokens:
        inputs = _pad(inputs, shape.pad_tokens, 0)
        labels = _pad(labels, shape.pad_tokens, IGNORE_INDEX)
        positions = torch.cat(
            [positions, torch.arange(shape.pad_tokens, dtype=positions.dtype, device=positions.device)]
        )
    return {"input": inputs, "positions": positions}, labels


def titan_layout(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A batch of ``[rows, seq_len]`` tensors in ``TITAN.batch_layout``: on
    main its per-token tensors laid end to end (views), else as it is."""
    if not TITAN.flat_batches:
        return batch
    return {**batch, **{key: batch[key].reshape(-1) for key in TOKEN_KEYS}}


def _pad(tensor: torch.Tensor, count: int, value: int) -> torch.Tensor:
    return torch.cat([tensor, torch.full((count,), value, dtype=tensor.dtype, device=tensor.device)])
