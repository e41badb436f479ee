"""The TorchTitan loader's checkpoint entry: the global loader state under one
rank-independent key.

TorchTitan's own loaders store one state per data-parallel rank
(``dp_rank_3``) and refuse a checkpoint saved at another dp degree. This
state is the global cursor of :class:`zephon_stream.StreamingLoader`, the
same on every rank, stored as one JSON string under :data:`STATE_KEY`, so
``torch.distributed.checkpoint`` writes it once and every rank of any dp
degree reads it back.
"""

from __future__ import annotations

import json
from typing import Any

from zephon_stream.errors import StateMismatchError

__all__ = ["STATE_KEY", "loader_state_from_titan", "titan_state"]

STATE_KEY = "zephon"
"""The one key of :meth:`ZephonDataLoader.state_dict` (identical on every rank)."""


def titan_state(loader_state: dict[str, Any]) -> dict[str, Any]:
    """``{"zephon": <JSON of the global loader state>}``, equal on every rank."""
    return {STATE_KEY: json.dumps(loader_state, sort_keys=True)}


def loader_state_from_titan(state_dict: dict[str, Any]) -> Any:
    """The loader state inside a (non-empty) checkpoint entry, JSON decoded.

    Raises:
        StateMismatchError: no ``"zephon"`` key (naming the keys found, and a
            TorchTitan per-rank state as such), or a value that is not JSON.
    """
    if STATE_KEY not in state_dict:
        found = ", ".join(sorted(map(str, state_dict)))
        per_rank = any(str(k).startswith("dp_rank_") for k in state_dict)
        hint = " (a TorchTitan per-rank loader state)" if per_rank else ""
        raise StateMismatchError(
            f"dataloader state: expected key {STATE_KEY!r}, found [{found}]{hint}; "
            "was this checkpoint written by another dataloader?"
        )
    value = state_dict[STATE_KEY]
    if isinstance(value, (str, bytes)):
        try:
            value = json.loads(value)
        except ValueError as exc:
            raise StateMismatchError(f"dataloader state {STATE_KEY!r}: not the JSON of a loader state ({exc})") from exc
    return value
