"""The output folder before a conversion: a committed dataset there is refused, or uncommitted first.

Every engine (the process pool, launcher ranks, Ray units) starts here, so
that a run killed at any later point leaves no manifest over shards it was
replacing.
"""

from __future__ import annotations

from zephon_stream.errors import ConfigError
from zephon_stream.format.spec import MANIFEST_NAME
from zephon_stream.storage import Store


def prepare_output(store: Store, *, overwrite: bool) -> None:
    """Refuse an output that holds a committed dataset, or uncommit it with ``overwrite``."""
    if store.exists(MANIFEST_NAME):
        if not overwrite:
            raise ConfigError(
                f"output {store.url} already holds a committed dataset ({MANIFEST_NAME} exists); "
                "remove it or pass --overwrite"
            )
        # Uncommit first, so a run killed from here on leaves no manifest over half-replaced shards.
        store.delete(MANIFEST_NAME)
