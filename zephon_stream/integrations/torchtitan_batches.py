"""What a step hands TorchTitan's trainer: ``input_dict`` and where its tensors live.

The loader delivers ``input`` and ``positions`` on the configured device (a
CUDA device: copied at their stored width from the pinned ring and widened
there) and ``labels`` on the host (TorchTitan 0.3.0's trainer counts valid
labels into a CPU tensor before it moves the batch itself); the trainer moves
every tensor of ``input_dict`` to its device, so scalars a kernel wants on the
host go in as Python ints.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["titan_input_dict"]


def titan_input_dict(batch: dict[str, torch.Tensor], *, packing_outputs: bool) -> dict[str, Any]:
    """TorchTitan's ``input_dict`` from a loader batch: ``input`` and
    ``positions``, and with ``packing_outputs`` the document outputs, the two
    scalars as Python ints (TorchTitan's trainer moves every tensor of
    ``input_dict`` to the device, and a kernel wants them on the host)."""
    out: dict[str, Any] = {"input": batch["input"], "positions": batch["positions"]}
    if packing_outputs:
        for key in ("segment_ids", "document_lengths", "cu_seqlens"):
            out[key] = batch[key]
        for key in ("num_cu_seqlens", "max_seqlen"):
            out[key] = int(batch[key])
    return out
