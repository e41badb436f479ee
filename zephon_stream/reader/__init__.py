"""A committed dataset read back to look at it: random access, and the reports built on it.

``DatasetReader`` (``dataset.py``) pairs a validated manifest with the store it
came from; the reports read through it: ``verify.py`` (every byte re-hashed,
every block decoded), ``provenance.py`` with ``provenance_rows.py`` (the
samples of a step, the documents of each row's pieces) and
``packing_report.py`` (how each packing cuts the dataset's documents).
"""

from zephon_stream.reader.dataset import DatasetReader, read_block

__all__ = ["DatasetReader", "read_block"]
