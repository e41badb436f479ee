"""Which URL schemes each client library serves, and this package's own storage option.

The bottom of ``storage/``: every module that picks a client by scheme reads
these names here.
"""

from __future__ import annotations

S3_PROTOCOLS = ("s3", "s3a")
GCS_PROTOCOLS = ("gs", "gcs")
AZURE_PROTOCOLS = ("az", "abfs", "abfss")
# NOTE: a storage option of this package's own (storage/presigned.py): no
# client library knows it, so none is given it.
PRESIGNED_READS_OPTION = "zephon_presigned_reads"
