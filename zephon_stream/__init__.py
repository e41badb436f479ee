"""zephon_stream: token shards for LLM pretraining, streamed into every
data-parallel rank and resumable bit-identically at any world size.

The public names are imported lazily so that ``import zephon_stream`` stays
cheap and the pure packages (``format``, ``plan``) never pull in torch.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_PUBLIC = {
    "Manifest": "zephon_stream.format.manifest",
    "write_dataset": "zephon_stream.writer.api",
    "merge_parts": "zephon_stream.writer.merge",
    "read_block": "zephon_stream.reader",
    "StreamingLoader": "zephon_stream.loader",
    "Stream": "zephon_stream.loader",
    "Phase": "zephon_stream.loader",
    "EvalLoader": "zephon_stream.loader",
}

__all__ = sorted(_PUBLIC) + ["__version__"]


def __getattr__(name: str) -> Any:
    module_name = _PUBLIC.get(name)
    if module_name is None:
        raise AttributeError(f"module 'zephon_stream' has no attribute {name!r}")
    return getattr(importlib.import_module(module_name), name)
