"""The on-disk format (docs/FORMAT.md), pure: bytes in, bytes out.

- ``spec``: constants, naming and dtype rules.
- ``block``: one block of tokens <-> one zstd frame.
- ``manifest``: the dataset manifest codec, validation and block arithmetic
  (``block_arithmetic``: block ids to shards, byte ranges and token offsets).
- ``docindex``: per-shard document-index sidecars and document lookup.
"""
