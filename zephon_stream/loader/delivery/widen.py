"""Narrow token rows -> the int64 tensors a model takes, on whatever device
they are (the GPU, after one narrow copy; CPU tensors in tests).

One slot's first part (``SlotLayout.device_bytes``) holds the ``L + 1``-token
window of each row at the stored width, each row's EOS id and each row's
global position. From it: ``input`` = the first ``L`` tokens, ``labels`` = the
last ``L``, ``positions`` = each input token's position in its document
(0 on a row's first token and on every token after an EOS), the same values
the host assembler computes (loader/producer/assembler.py).

A batch comes in one of two layouts (``BATCH_LAYOUTS``), chosen when the
loader is built: ``"rows"``, ``[rows, L]`` tensors, or ``"tokens"``, the
same rows laid end to end as 1-D ``[rows * L]`` tensors (what TorchTitan
main trains). Only the per-token keys change shape (:func:`laid_out`):
``sample_positions`` stays one per row, and the document outputs keep their
rows (``cu_seqlens`` is already 1-D).
"""

from __future__ import annotations

import functools
import re

import torch

from zephon_stream.loader.ring.row_documents import ignore_eos_targets, packing_tensors
from zephon_stream.loader.ring.shared_ring import WIDE_KEYS, SlotLayout

BATCH_LAYOUTS = ("rows", "tokens")

_TORCH_DTYPES = {"<u2": torch.uint16, "<u4": torch.uint32}
_SIGNED = {torch.uint16: (torch.int16, 0xFFFF), torch.uint32: (torch.int32, 0xFFFFFFFF)}
# torch 2.3 gave uint16 and uint32 copy kernels (to and from the other
# dtypes) on CPU and CUDA; the project requires torch >= 2.4, so on the two
# devices the loader delivers to the direct copy always applies.
_UNSIGNED_COPY_SINCE = (2, 3)
_UNSIGNED_COPY_DEVICES = ("cpu", "cuda")


def release(version: str) -> tuple[int, int]:
    """``(major, minor)`` of a torch version string (``"2.11.0+cu130"`` -> ``(2, 11)``)."""
    found = re.match(r"(\d+)\.(\d+)", version)
    if found is None:
        raise ValueError(f"torch version {version!r}: expected MAJOR.MINOR...")
    return int(found[1]), int(found[2])


@functools.cache  # Asked on every copy; the answer is fixed per process and device
def direct_unsigned_copy(*, torch_version: str, device_type: str) -> bool:
    """Whether ``copy_`` widens uint16/uint32 to int64 on ``device_type`` in this torch.

    Decided from the version and the device, not by trying: a failed kernel
    launch is not a way to ask, since it can leave a CUDA error behind that
    the next launch raises.
    """
    return device_type in _UNSIGNED_COPY_DEVICES and release(torch_version) >= _UNSIGNED_COPY_SINCE


def copy_ids(out: torch.Tensor, ids: torch.Tensor) -> None:
    """``out`` (int64) = ``ids`` (uint16 or uint32), on their device.

    The signed-view-and-mask path is for a torch older than 2.3 (one
    installed without the project's requirements) or another device type;
    neither reaches here in a supported install, and tests run it on CPU.
    """
    if direct_unsigned_copy(torch_version=torch.__version__, device_type=ids.device.type):
        out.copy_(ids)
    else:
        copy_ids_masked(out, ids)


def copy_ids_masked(out: torch.Tensor, ids: torch.Tensor) -> None:
    """``out`` (int64) = ``ids`` (uint16 or uint32) through a signed view and a mask."""
    signed, mask = _SIGNED[ids.dtype]
    out.copy_(ids.view(signed))
    out.bitwise_and_(mask)


def laid_out(arrays: dict, batch_layout: str) -> dict:
    """``arrays`` (numpy arrays or tensors by key) in ``batch_layout``: under
    ``"tokens"`` the per-token keys (``input``, ``labels``, ``positions``)
    become 1-D views, the rows end to end; every other key, and every key
    under ``"rows"``, is left as it is."""
    if batch_layout == "rows":
        return arrays
    return {key: value.reshape(-1) if key in WIDE_KEYS else value for key, value in arrays.items()}


def slot_parts(raw: torch.Tensor, layout: SlotLayout) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Views of a slot's first part: ``(tokens [rows, L+1], eos [rows], sample_positions [rows])``.

    Args:
        raw: ``uint8`` tensor of at least ``layout.device_bytes`` bytes, starting at the slot.
        layout: the ring's slot layout.
    """
    offsets = layout.offsets()
    rows = layout.rows
    tokens = raw[: layout.tokens_bytes].view(_TORCH_DTYPES[layout.token_dtype]).view(rows, layout.seq_len + 1)
    eos = raw[offsets["eos"] : offsets["eos"] + rows * 8].view(torch.int64)
    sample_positions = raw[offsets["sample_positions"] : offsets["sample_positions"] + rows * 8].view(torch.int64)
    return tokens, eos, sample_positions


def document_positions(inputs: torch.Tensor, eos: torch.Tensor) -> torch.Tensor:
    """Position of each input token in its document.

    Args:
        inputs: ``int64 [rows, L]`` token ids.
        eos: ``int64 [rows]`` the EOS id of each row.

    Returns:
        ``int64 [rows, L]`` on ``inputs``' device.
    """
    rows, seq_len = inputs.shape
    ramp = torch.arange(seq_len, dtype=torch.int64, device=inputs.device)
    out = torch.empty_like(inputs)
    out[:, 0] = 0
    if seq_len > 1:
        # A document starts on the token after an EOS; the running
        # maximum of those start columns is each token's document start.
        starts = (inputs[:, :-1] == eos[:, None]) * ramp[1:]
        torch.sub(ramp[1:], torch.cummax(starts, dim=1).values, out=out[:, 1:])
    return out


def widen(raw: torch.Tensor, layout: SlotLayout, batch_layout: str = "rows") -> dict[str, torch.Tensor]:
    """``input``, ``labels``, ``positions`` and ``sample_positions`` (int64)
    from a slot's first part, on ``raw``'s device; labels of input EOS tokens
    -100 under ``cross_document_targets="ignore"``, and the document outputs
    when the layout holds them (loader/ring/row_documents.py).

    Args:
        raw: ``uint8`` tensor of ``layout.device_bytes`` bytes.
        layout: the ring's slot layout.
        batch_layout: ``"rows"`` or ``"tokens"`` (:func:`laid_out`: views of the widened rows).
    """
    tokens, eos, sample_positions = slot_parts(raw, layout)
    shape = (layout.rows, layout.seq_len)
    inputs = torch.empty(shape, dtype=torch.int64, device=raw.device)
    labels = torch.empty(shape, dtype=torch.int64, device=raw.device)
    copy_ids(inputs, tokens[:, :-1])
    copy_ids(labels, tokens[:, 1:])
    if layout.packing.ignore:
        ignore_eos_targets(labels, inputs, eos)
    batch = {
        "input": inputs,
        "labels": labels,
        "positions": document_positions(inputs, eos),
        "sample_positions": sample_positions,
    }
    if layout.packing.outputs:
        # The producer wrote them on the host from its EOS scan; they
        # crossed in the same transfer as the tokens.
        batch.update(packing_tensors(raw, layout.offsets()["packing"], layout.rows, layout.seq_len))
    return laid_out(batch, batch_layout)
