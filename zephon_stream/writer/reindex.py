"""Give a dataset of format 1.0 the index objects of format 1.1, in place.

Nothing but the index objects and the manifest is written: no shard, sidecar
or rejects list is touched, and the fingerprint (which depends on the major
version only) stays. The index objects go first, named by their content;
the manifest is replaced last, atomically, so a reader sees the old dataset
or the new one, and a reindex killed part way leaves the 1.0 dataset as it
was (its unreferenced index objects are overwritten, byte for byte, by the
next attempt).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from zephon_stream.format.manifest import Manifest
from zephon_stream.format.spec import FORMAT_VERSION, INDEXED_VERSION
from zephon_stream.storage import open_store


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ReindexResult:
    """What ``reindex`` did.

    Attributes:
        url: the dataset root (no secrets).
        before: the format version it had.
        manifest: the manifest now committed (the same one if nothing was done).
        written: the objects written, by path and size (empty if nothing was done).
    """

    url: str
    before: tuple[int, int]
    manifest: Manifest
    written: dict[str, int]


def reindex(url: str, *, storage_options: Mapping[str, Any] | None = None) -> ReindexResult:
    """Rewrite the manifest of the dataset at ``url`` in the current format, adding its index objects.

    A dataset already in the indexed form is left as it is.

    Raises:
        ObjectMissingError: no committed dataset at ``url``.
        ManifestError: its manifest is malformed (nothing is written).
    """
    with open_store(url, dict(storage_options or {}) or None) as store:
        manifest = Manifest.read(store)
        if manifest.version >= INDEXED_VERSION:
            return ReindexResult(url=store.url, before=manifest.version, manifest=manifest, written={})
        new = dataclasses.replace(manifest, version=FORMAT_VERSION)
        assert new.fingerprint == manifest.fingerprint
        objects = new.objects()
        new.write(store)
        return ReindexResult(
            url=store.url,
            before=manifest.version,
            manifest=new,
            written={path: len(data) for path, data in objects.items()},
        )
