"""What a committed dataset is, and the error for a place that holds none.

A dataset is a folder or object-store prefix holding ``manifest`` and
``shards/``; writing its manifest, last, commits it (docs/FORMAT.md). The
error says what the place is instead (a file, nothing, or a folder without a
manifest), so that a file or a typo given as the dataset reads as such.
"""

from __future__ import annotations

from typing import Any

from zephon_stream.errors import ObjectMissingError, StorageError
from zephon_stream.format.spec import MANIFEST_NAME, SHARDS_DIR

WHAT_A_DATASET_IS = (
    f"a dataset is a folder or prefix holding '{MANIFEST_NAME}' and '{SHARDS_DIR}/', written by `zephon-stream write`"
)


def no_dataset_error(store: Any) -> ObjectMissingError:
    """The error for a store whose ``manifest`` is not there, naming what its root is.

    Args:
        store: a store rooted where the dataset was looked for (``url``, ``root_kind()``).
    """
    try:
        kind = store.root_kind()
    except StorageError:
        kind = "folder"  # What the root is could not be learned; say what is known
    if kind == "file":
        what = "it is a file, not a folder"
    elif kind == "missing":
        what = "nothing is there (no such folder or prefix)"
    else:
        what = f"{MANIFEST_NAME!r} is missing (a dataset is committed when its manifest is written, last)"
    return ObjectMissingError(f"no committed dataset at {store.url}: {what}; {WHAT_A_DATASET_IS}")
