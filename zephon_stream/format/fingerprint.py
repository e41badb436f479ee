"""The dataset fingerprint (docs/FORMAT.md, section 5.4).

It identifies the token content and block layout, so a loader can refuse to
resume against a different dataset; merge reuses it for merged manifests.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

from zephon_stream.format.spec import FORMAT_VERSION

FINGERPRINT_HEADER = "zephon-stream dataset fingerprint"


def compute_fingerprint(
    *,
    dtype: str,
    tokenizer_fingerprint: str,
    block_tokens: int,
    shards: Iterable[tuple[int, str]],
    format_major: int = FORMAT_VERSION[0],
) -> str:
    """The dataset fingerprint: sha256 of the canonical content description.

    The hashed text is UTF-8, one ``\\n``-terminated line each:
    ``zephon-stream dataset fingerprint``, ``format_major=<int>``,
    ``dtype=<dtype>``, ``tokenizer=<tokenizer fingerprint>``,
    ``block_tokens=<int>``, then ``shard=<num_tokens> <sha256>`` per shard in
    manifest order. Integers are decimal without leading zeros.

    Args:
        dtype: "uint16" or "uint32".
        tokenizer_fingerprint: the tokenizer's fingerprint string.
        block_tokens: tokens per full block.
        shards: ``(num_tokens, sha256_hex)`` per shard, in manifest order.
        format_major: the format's major version.

    Returns:
        64 lowercase hex digits.
    """
    digest = hashlib.sha256()
    head = (
        f"{FINGERPRINT_HEADER}\nformat_major={int(format_major)}\ndtype={dtype}\n"
        f"tokenizer={tokenizer_fingerprint}\nblock_tokens={int(block_tokens)}\n"
    )
    digest.update(head.encode("utf-8"))
    for num_tokens, sha256 in shards:
        digest.update(f"shard={int(num_tokens)} {sha256}\n".encode())
    return digest.hexdigest()
