"""The streaming loader: one rank's share of every global batch, from the datasets' blocks to the trainer's tensors.

A batch passes through the sub-packages in this order, each importing only
those before it (``tests/test_import_graph.py`` checks it): ``blocks`` (the
open datasets, block reads and decodes, the block cache), ``planning`` (which
rows of which blocks each of this rank's steps takes, and the memory that
holds), ``ring`` (the shared memory a step is written into and handed over
through), ``producer`` (the pipeline that fills the ring, in the helper
process or on threads, and the helper process itself), ``delivery`` (a ring
slot as the tensors the consumer gets, on CPU or CUDA), ``runs`` (the
trainer's side: producer runs, their rings, and switching between them) and
``front`` (``StreamingLoader``, ``EvalLoader``, their state, counters and
audit log). docs/ARCHITECTURE.md draws the map.

The names below are imported lazily, so that a process importing one part
(the helper process imports ``producer.helper_main``) loads neither torch nor
the rest.
"""

from __future__ import annotations

import importlib
from typing import Any

_PUBLIC = {
    # What users and the integrations import.
    "StreamingLoader": "zephon_stream.loader.front.api",
    "PIPELINE_MODES": "zephon_stream.loader.front.args",
    "BATCH_LAYOUTS": "zephon_stream.loader.delivery.widen",
    "HELPER_PROCESS_BYTES": "zephon_stream.loader.front.api",
    "Stream": "zephon_stream.loader.blocks.streams",
    "Phase": "zephon_stream.loader.planning.schedule",
    "EvalLoader": "zephon_stream.loader.front.evaluation",
    "PackingSpec": "zephon_stream.loader.ring.row_documents",
    "IGNORE_INDEX": "zephon_stream.loader.ring.row_documents",
    "PACKING_KEYS": "zephon_stream.loader.ring.row_documents",
    "AuditLog": "zephon_stream.loader.front.audit",
    "read_audit_log": "zephon_stream.loader.front.audit",
    "first_divergence": "zephon_stream.loader.front.audit",
    "union_sha256": "zephon_stream.loader.front.audit",
    "addresses_sha256": "zephon_stream.loader.front.audit",
    # The parts the benchmarks time on their own.
    "StepAssembler": "zephon_stream.loader.producer.assembler",
    "SharedRing": "zephon_stream.loader.ring.shared_ring",
    "SlotLayout": "zephon_stream.loader.ring.shared_ring",
    "WIDE_KEYS": "zephon_stream.loader.ring.shared_ring",
    "SlotReturns": "zephon_stream.loader.delivery.handback",
    "MAX_HELD_BATCHES": "zephon_stream.loader.delivery.device",
    "PENDING_RELEASE_SLOTS": "zephon_stream.loader.delivery.device",
    "ring_slots": "zephon_stream.loader.delivery.device",
}

__all__ = sorted(_PUBLIC)


def __getattr__(name: str) -> Any:
    module_name = _PUBLIC.get(name)
    if module_name is None:
        raise AttributeError(f"module 'zephon_stream.loader' has no attribute {name!r}")
    return getattr(importlib.import_module(module_name), name)
