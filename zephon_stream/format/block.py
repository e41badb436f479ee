"""Block codec: one block of tokens <-> one zstd frame.

A block is encoded as exactly one zstd frame whose header carries the content
size and whose content checksum is on. Decoding refuses anything else; it is
the loader's hot path, so it decompresses once into a fresh ``bytes`` and views
it with ``np.frombuffer`` (no extra copy). zstd releases the GIL while it works.
"""

from __future__ import annotations

import threading

import numpy as np
import zstandard

from zephon_stream.errors import CorruptBlockError, TruncatedObjectError
from zephon_stream.format.spec import DEFAULT_ZSTD_LEVEL

ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
_BLOCK_HEADER_BYTES = 3
_CHECKSUM_BYTES = 4
_RESERVED_BLOCK_TYPE = 3
_RLE_BLOCK_TYPE = 1

# zstd contexts are not safe to share between threads; decoding runs in a
# thread pool, so each thread keeps its own.
_local = threading.local()


def _compressor(level: int) -> zstandard.ZstdCompressor:
    cache = getattr(_local, "compressors", None)
    if cache is None:
        cache = _local.compressors = {}
    compressor = cache.get(level)
    if compressor is None:
        compressor = cache[level] = zstandard.ZstdCompressor(
            level=level, write_checksum=True, write_content_size=True, threads=0
        )
    return compressor


def _decompressor() -> zstandard.ZstdDecompressor:
    decompressor = getattr(_local, "decompressor", None)
    if decompressor is None:
        decompressor = _local.decompressor = zstandard.ZstdDecompressor()
    return decompressor


def encode_block(tokens: np.ndarray, *, level: int = DEFAULT_ZSTD_LEVEL) -> bytes:
    """Encode one block of tokens as one zstd frame.

    Args:
        tokens: 1-D array of ``<u2`` or ``<u4`` tokens (any byte order is
            converted to little-endian).
        level: zstd compression level.

    Returns:
        The frame: content size in its header, content checksum on.
    """
    if tokens.ndim != 1:
        raise ValueError(f"a block is 1-D, got shape {tokens.shape}")
    if tokens.dtype.kind != "u" or tokens.dtype.itemsize not in (2, 4):
        raise ValueError(f"block tokens must be uint16 or uint32, got {tokens.dtype}")
    if len(tokens) == 0:
        raise ValueError("a block holds at least one token")
    little = np.ascontiguousarray(tokens, dtype=tokens.dtype.newbyteorder("<"))
    return _compressor(level).compress(memoryview(little).cast("B"))


def frame_end(data: bytes | memoryview, *, where: str) -> int:
    """Byte length of the zstd frame at the start of ``data``, from its headers.

    Walks the frame header and block headers without decompressing, so
    trailing bytes and truncation are found before any allocation.

    Raises:
        CorruptBlockError: not a zstd frame, or a reserved block type.
        TruncatedObjectError: ``data`` ends inside the frame.
    """
    view = memoryview(data)
    size = len(view)
    if size < 4 or bytes(view[:4]) != ZSTD_MAGIC:
        if size < 4 and bytes(view[:size]) == ZSTD_MAGIC[:size]:
            raise TruncatedObjectError(f"{where}: truncated zstd frame ({size} bytes, no complete magic number)")
        raise CorruptBlockError(
            f"{where}: not a zstd frame (magic {bytes(view[:4]).hex()!r}, expected {ZSTD_MAGIC.hex()!r})"
        )
    if size < 5:
        raise TruncatedObjectError(f"{where}: truncated zstd frame header ({size} bytes)")
    descriptor = view[4]
    has_checksum = bool(descriptor & 0x04)
    try:
        pos = zstandard.frame_header_size(bytes(view[:18]))
    except zstandard.ZstdError as exc:
        raise CorruptBlockError(f"{where}: bad zstd frame header: {exc}") from None
    if pos > size:
        raise TruncatedObjectError(f"{where}: truncated zstd frame header ({size} of {pos} bytes)")
    while True:
        if pos + _BLOCK_HEADER_BYTES > size:
            raise TruncatedObjectError(
                f"{where}: truncated zstd frame (ends at byte {size} inside a block header at {pos})"
            )
        header = view[pos] | (view[pos + 1] << 8) | (view[pos + 2] << 16)
        pos += _BLOCK_HEADER_BYTES
        last = header & 1
        block_type = (header >> 1) & 3
        block_size = header >> 3
        if block_type == _RESERVED_BLOCK_TYPE:
            raise CorruptBlockError(f"{where}: reserved zstd block type at byte {pos - _BLOCK_HEADER_BYTES}")
        pos += 1 if block_type == _RLE_BLOCK_TYPE else block_size
        if pos > size:
            raise TruncatedObjectError(f"{where}: truncated zstd frame (needs at least {pos} bytes, has {size})")
        if last:
            break
    if has_checksum:
        pos += _CHECKSUM_BYTES
        if pos > size:
            raise TruncatedObjectError(f"{where}: truncated zstd frame (checksum needs {pos} bytes, has {size})")
    return pos


def decode_block(data: bytes | memoryview, *, num_tokens: int, dtype: np.dtype | str, where: str) -> np.ndarray:
    """Decode one block frame into its tokens.

    Args:
        data: exactly one zstd frame, nothing before or after it.
        num_tokens: the block's token count, from the manifest.
        dtype: the dataset's token dtype (``<u2``/``<u4`` or "uint16"/"uint32").
        where: names the object and block in errors, e.g.
            ``"shard shards/00000003.zst block 7 (bytes 123..456)"``.

    Returns:
        A read-only 1-D little-endian array of ``num_tokens`` tokens.

    Raises:
        CorruptBlockError: bad magic, no checksum, missing or wrong declared
            size, checksum mismatch, output past the declared size, or
            trailing bytes after the frame.
        TruncatedObjectError: ``data`` ends inside the frame.
    """
    if num_tokens < 1:
        raise ValueError(f"{where}: a block holds at least one token, asked to decode {num_tokens}")
    token_type = np.dtype(dtype).newbyteorder("<")
    expected_bytes = num_tokens * token_type.itemsize
    end = frame_end(data, where=where)
    if end != len(data):
        raise CorruptBlockError(
            f"{where}: {len(data) - end} trailing bytes after the zstd frame (frame ends at byte {end} of {len(data)})"
        )
    header = bytes(data[:18])
    if not header[4] & 0x04:
        raise CorruptBlockError(f"{where}: zstd frame has no content checksum")
    try:
        declared = zstandard.frame_content_size(header)
    except zstandard.ZstdError as exc:
        raise CorruptBlockError(f"{where}: bad zstd frame header: {exc}") from None
    if declared < 0:
        raise CorruptBlockError(f"{where}: zstd frame header does not declare its content size")
    if declared != expected_bytes:
        raise CorruptBlockError(
            f"{where}: declared content size {declared} bytes, expected {expected_bytes} "
            f"({num_tokens} tokens of {token_type.itemsize} bytes)"
        )
    try:
        raw = _decompressor().decompress(data, max_output_size=expected_bytes)
    except zstandard.ZstdError as exc:
        if "checksum" in str(exc):
            stored = int.from_bytes(bytes(data[end - _CHECKSUM_BYTES : end]), "little")
            raise CorruptBlockError(
                f"{where}: checksum mismatch (frame stores {stored:#010x}, decoded content hashes differently)"
            ) from None
        raise CorruptBlockError(f"{where}: zstd decoding failed: {exc}") from None
    if len(raw) != expected_bytes:
        raise CorruptBlockError(f"{where}: decoded {len(raw)} bytes, expected {expected_bytes}")
    return np.frombuffer(raw, dtype=token_type)
