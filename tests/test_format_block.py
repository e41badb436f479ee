"""Block codec: round trips and every way a frame can be wrong."""

from __future__ import annotations

import numpy as np
import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from test_format_dataset import stdlib_documents
from zephon_stream.errors import CorruptBlockError, TruncatedObjectError
from zephon_stream.format.block import decode_block, encode_block, frame_end

WHERE = "shard shards/00000003.zst block 7 (bytes 123..456)"


def real_tokens(dtype: str, count: int = 5000) -> np.ndarray:
    text = b"".join(t for _, t in stdlib_documents(5))[:count]
    tokens = np.frombuffer(text, dtype=np.uint8).astype(dtype)
    if np.dtype(dtype).itemsize == 4:
        tokens = tokens * 70001 % 100_000
    return tokens.astype(dtype)


@pytest.mark.parametrize("dtype", ["<u2", "<u4"])
def test_block_round_trip_preserves_tokens(dtype: str) -> None:
    tokens = real_tokens(dtype)
    frame = encode_block(tokens)
    decoded = decode_block(frame, num_tokens=len(tokens), dtype=dtype, where=WHERE)
    assert decoded.dtype == np.dtype(dtype)
    assert np.array_equal(decoded, tokens)
    params = zstandard.get_frame_parameters(frame)
    assert params.has_checksum and params.content_size == tokens.nbytes
    assert len(frame) < tokens.nbytes


def test_big_endian_input_is_stored_little_endian() -> None:
    tokens = real_tokens("<u2")
    frame = encode_block(tokens.astype(">u2"))
    assert frame == encode_block(tokens)
    assert zstandard.ZstdDecompressor().decompress(frame) == tokens.tobytes()


def test_encoding_is_deterministic() -> None:
    tokens = real_tokens("<u2")
    assert encode_block(tokens) == encode_block(tokens.copy())


def test_flipped_byte_is_a_checksum_error_naming_the_block() -> None:
    tokens = real_tokens("<u2")
    frame = bytearray(encode_block(tokens))
    frame[len(frame) // 2] ^= 0x40
    with pytest.raises(CorruptBlockError, match=r"shard shards/00000003\.zst block 7 \(bytes 123\.\.456\)"):
        decode_block(bytes(frame), num_tokens=len(tokens), dtype="<u2", where=WHERE)


def test_flipped_checksum_byte_is_reported_as_checksum_mismatch() -> None:
    tokens = real_tokens("<u2")
    frame = bytearray(encode_block(tokens))
    frame[-1] ^= 0x01
    with pytest.raises(CorruptBlockError, match="checksum mismatch"):
        decode_block(bytes(frame), num_tokens=len(tokens), dtype="<u2", where=WHERE)


@pytest.mark.parametrize("keep", [0, 3, 5, 10, -1, -4, -50])
def test_truncated_frame_is_a_truncation_error(keep: int) -> None:
    tokens = real_tokens("<u2")
    frame = encode_block(tokens)
    with pytest.raises((TruncatedObjectError, CorruptBlockError), match="block 7") as info:
        decode_block(frame[:keep], num_tokens=len(tokens), dtype="<u2", where=WHERE)
    if keep != 0:
        assert info.type is TruncatedObjectError


def test_trailing_bytes_after_the_frame_are_refused() -> None:
    tokens = real_tokens("<u2")
    frame = encode_block(tokens)
    with pytest.raises(CorruptBlockError, match="7 trailing bytes"):
        decode_block(frame + b"garbage", num_tokens=len(tokens), dtype="<u2", where=WHERE)
    with pytest.raises(CorruptBlockError, match="trailing bytes"):
        decode_block(frame + frame, num_tokens=len(tokens), dtype="<u2", where=WHERE)


def test_declared_size_other_than_the_manifest_count_is_refused() -> None:
    tokens = real_tokens("<u2")
    frame = encode_block(tokens)
    with pytest.raises(
        CorruptBlockError, match=f"declared content size {tokens.nbytes} bytes, expected {tokens.nbytes - 2}"
    ):
        decode_block(frame, num_tokens=len(tokens) - 1, dtype="<u2", where=WHERE)
    with pytest.raises(CorruptBlockError, match="declared content size"):
        decode_block(frame, num_tokens=len(tokens), dtype="<u4", where=WHERE)


def test_frame_without_declared_size_is_refused() -> None:
    tokens = real_tokens("<u2")
    frame = zstandard.ZstdCompressor(write_checksum=True, write_content_size=False).compress(tokens.tobytes())
    with pytest.raises(CorruptBlockError, match="does not declare its content size"):
        decode_block(frame, num_tokens=len(tokens), dtype="<u2", where=WHERE)


def test_streamed_frame_without_declared_size_is_refused() -> None:
    tokens = real_tokens("<u2")
    cobj = zstandard.ZstdCompressor(write_checksum=True).compressobj()
    frame = cobj.compress(tokens.tobytes()) + cobj.flush()
    with pytest.raises(CorruptBlockError, match="does not declare its content size"):
        decode_block(frame, num_tokens=len(tokens), dtype="<u2", where=WHERE)


def test_frame_without_checksum_is_refused() -> None:
    tokens = real_tokens("<u2")
    frame = zstandard.ZstdCompressor(write_checksum=False).compress(tokens.tobytes())
    with pytest.raises(CorruptBlockError, match="no content checksum"):
        decode_block(frame, num_tokens=len(tokens), dtype="<u2", where=WHERE)


def test_frame_that_decompresses_past_its_declared_size_is_refused() -> None:
    # A frame whose header claims 100 bytes of content but whose blocks hold more.
    tokens = real_tokens("<u2", 4000)
    frame = bytearray(zstandard.ZstdCompressor(write_checksum=True).compress(tokens.tobytes()))
    descriptor = frame[4]
    assert descriptor >> 6 == 1  # 2-byte content size field, stored as size - 256
    header_at = 5 if descriptor & 0x20 else 6
    frame[header_at : header_at + 2] = (300 - 256).to_bytes(2, "little")
    assert zstandard.frame_content_size(bytes(frame[:18])) == 300
    with pytest.raises(CorruptBlockError, match="block 7"):
        decode_block(bytes(frame), num_tokens=150, dtype="<u2", where=WHERE)


def test_not_a_zstd_frame_is_refused() -> None:
    with pytest.raises(CorruptBlockError, match="not a zstd frame"):
        decode_block(b"PK\x03\x04 definitely not zstd", num_tokens=4, dtype="<u2", where=WHERE)


def test_frame_end_finds_the_first_frame_boundary() -> None:
    first = encode_block(real_tokens("<u2", 3000))
    second = encode_block(real_tokens("<u2", 1000))
    assert frame_end(first + second, where=WHERE) == len(first)


def test_decoded_block_is_a_view_without_copy() -> None:
    tokens = real_tokens("<u2")
    decoded = decode_block(encode_block(tokens), num_tokens=len(tokens), dtype="uint16", where=WHERE)
    assert not decoded.flags.writeable
    assert isinstance(decoded.base, bytes)


FUZZ_TOKENS = real_tokens("<u2", 3000)
FUZZ_FRAME = encode_block(FUZZ_TOKENS)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.tuples(st.integers(0, len(FUZZ_FRAME) - 1), st.integers(0, 255)), min_size=1, max_size=4),
    st.integers(0, len(FUZZ_FRAME) + 8),
    st.binary(max_size=8),
)
def test_fuzz_mutated_frames_raise_only_block_errors(edits, cut: int, tail: bytes) -> None:
    data = bytearray(FUZZ_FRAME)
    for at, value in edits:
        data[at] = value
    candidate = bytes(data[:cut]) + tail
    try:
        decoded = decode_block(candidate, num_tokens=len(FUZZ_TOKENS), dtype="<u2", where=WHERE)
    except (CorruptBlockError, TruncatedObjectError) as exc:
        assert WHERE in str(exc)
        return
    # Accepted only if the checksum vouches for the content.
    assert np.array_equal(decoded, FUZZ_TOKENS)
