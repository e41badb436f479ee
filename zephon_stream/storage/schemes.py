"""Which URL schemes each client library serves, and this package's own storage options.

The bottom of ``storage/``: every module that picks a client by scheme reads
these names here.
"""

from __future__ import annotations

S3_PROTOCOLS = ("s3", "s3a")
GCS_PROTOCOLS = ("gs", "gcs")
AZURE_PROTOCOLS = ("az", "abfs", "abfss")
# Storage options of this package's own (storage/presigned.py, and
# RetryPolicy.throttle_limiter for a store opened from options alone: a
# loader's, the command line's): no client library knows them, so none is
# given them.
PRESIGNED_READS_OPTION = "zephon_presigned_reads"
THROTTLE_LIMITER_OPTION = "zephon_throttle_limiter"
OWN_OPTIONS = (PRESIGNED_READS_OPTION, THROTTLE_LIMITER_OPTION)
