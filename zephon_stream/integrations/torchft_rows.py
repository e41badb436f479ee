"""Read one group rank's rows of a share (``Piece``) through ``StreamingLoader``.

A share is a rank slice of one step of the global order, so a
``StreamingLoader`` at the share's world size, seeked to its cursor, reads it
with its whole pipeline (prefetch, helper process). The loader for fresh
shares is kept while the quorum keeps the same shape, and runs ahead as
usual; a changed quorum builds another at that step. Owed shares (rare: a
group healed) are read by a short-lived loader of their own.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from zephon_stream.integrations.torchft_plan import Piece
from zephon_stream.loader import IGNORE_INDEX, Stream, StreamingLoader

# The TorchFT loader decides these; passing them in loader options would
# read another order or another share.
RESERVED_OPTIONS = (
    "rank",
    "world_size",
    "seq_len",
    "local_batch_size",
    "schedule",
    "seed",
    "lanes",
    "window",
    "max_steps",
    "max_epochs",
    "end_after_phase",
    "packing_outputs",
    "audit_log",
)


class ShareReader:
    """One group rank's reads of shares, at any number of participants.

    Args:
        streams: the loader's streams.
        group_rank: this rank inside its replica group.
        group_world_size: ranks in the replica group.
        seq_len: sample length.
        seed: order seed.
        lanes: lanes ``C``, fixed for the run (the order must not depend on the quorum).
        window: window-shuffle size.
        loader_options: other ``StreamingLoader`` keywords (storage, device, pipeline, prefetch).
    """

    def __init__(
        self,
        streams: str | Stream | Sequence[str | Stream],
        *,
        group_rank: int,
        group_world_size: int,
        seq_len: int,
        seed: int,
        lanes: int,
        window: int,
        loader_options: dict[str, Any],
    ) -> None:
        self.group_rank = group_rank
        self.group_world_size = group_world_size
        self._streams = streams
        self._common = {"seq_len": seq_len, "seed": seed, "lanes": lanes, "window": window, **loader_options}
        self._fresh: StreamingLoader | None = None
        self._fresh_key: tuple[int, int, int] | None = None
        self.rebuilds = 0

    def layout(self, global_batch: int, participants: int, index: int) -> tuple[int, int, int, int | None]:
        """``(world, rank, local_batch, rows)`` of the loader that reads participant
        ``index`` of ``participants``'s share for this group rank; ``rows`` is
        None where the loader reads the share itself.

        Where the world of group ranks divides the global batch, that world's
        rank slice is the share; else the step is read whole (world 1) and cut
        into the same contiguous pieces the rank slicing cuts, the last padded.
        """
        world = participants * self.group_world_size
        vrank = index * self.group_world_size + self.group_rank
        if global_batch % world == 0:
            return world, vrank, global_batch // world, None
        return 1, 0, global_batch, -(-global_batch // world)

    def order_state(self) -> dict[str, Any]:
        """The order config of the loaders (a state dict without ``position``)."""
        loader = self._open(global_batch=self.group_world_size, world=1, rank=0, local_batch=self.group_world_size)
        try:
            state = loader.state_dict()
        finally:
            loader.close()
        # The group's own cursor and shares are its state; the inner loaders' history is not.
        state.pop("position")
        state.pop("history", None)
        return state

    def read(self, piece: Piece, *, global_batch: int, fresh: bool) -> dict[str, torch.Tensor]:
        """This group rank's rows of ``piece``, a step of ``global_batch`` positions.

        ``fresh`` shares continue the kept loader; others use a loader of their own.
        """
        world, rank, local_batch, rows = self.layout(global_batch, piece.participants, piece.index)
        key = (global_batch, world, rank)
        if fresh or key == self._fresh_key:
            if key != self._fresh_key:
                self.close()
                self._fresh = self._open(global_batch=global_batch, world=world, rank=rank, local_batch=local_batch)
                self._fresh_key = key
                self.rebuilds += 1
            loader = self._fresh
            if loader.position != piece.cursor:
                self._seek(loader, piece.cursor)
            batch = next(loader)
        else:
            loader = self._open(
                global_batch=global_batch, world=world, rank=rank, local_batch=local_batch, prefetch_steps=1
            )
            try:
                self._seek(loader, piece.cursor)
                batch = {k: v.clone() for k, v in next(loader).items()}
            finally:
                loader.close()
        if rows is not None:
            vrank = piece.index * self.group_world_size + self.group_rank
            batch = cut_and_pad(batch, start=vrank * rows, stop=min((vrank + 1) * rows, global_batch), rows=rows)
        return batch

    def _open(self, *, global_batch: int, world: int, rank: int, local_batch: int, **extra: Any) -> StreamingLoader:
        assert global_batch == local_batch * world
        options = {**self._common, **extra}
        return StreamingLoader(self._streams, rank=rank, world_size=world, local_batch_size=local_batch, **options)

    @staticmethod
    def _seek(loader: StreamingLoader, cursor: int) -> None:
        state = loader.state_dict()
        state["position"] = cursor
        loader.load_state_dict(state)

    def close(self) -> None:
        """Close the kept loader (its helper process)."""
        if self._fresh is not None:
            self._fresh.close()
        self._fresh, self._fresh_key = None, None


def cut_and_pad(batch: dict[str, torch.Tensor], *, start: int, stop: int, rows: int) -> dict[str, torch.Tensor]:
    """Rows ``[start, stop)`` of ``batch``, padded to ``rows`` rows whose labels
    are all ``IGNORE_INDEX`` and whose ``sample_positions`` are -1.

    Padding keeps a share's shape fixed for a given number of
    participants (CUDA graphs); a loss normalized by the global count of valid
    tokens (as TorchTitan's) is unchanged by rows without valid labels.

    Either batch layout: a 1-D per-token tensor (``batch_layout="tokens"``)
    is cut at whole rows and stays 1-D.
    """
    num_rows = batch["sample_positions"].shape[0]
    out = {}
    for name, tensor in batch.items():
        # A row's entries, whatever the layout ([rows, L], [rows], or 1-D with the rows end to end).
        by_row = tensor.view(num_rows, -1)
        piece = by_row[start:stop]
        missing = rows - piece.shape[0]
        if missing:
            filler = by_row[:1].expand(missing, -1).clone()
            if name == "labels":
                filler.fill_(IGNORE_INDEX)
            elif name == "sample_positions":
                filler.fill_(-1)
            piece = torch.cat([piece, filler])
        out[name] = (piece.reshape(-1) if tensor.dim() == 1 else piece.reshape(rows, *tensor.shape[1:])).clone()
    return out
