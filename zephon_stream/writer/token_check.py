"""Checking pre-tokenized documents against the tokenizer's vocabulary and
framing them with EOS, vectorised over a batch of documents.

A document becomes a reject (never a crash, never a clamp) when it is empty,
holds an id outside ``[0, vocab_size)`` or a value that is not an integer
(NaN, infinity, a fraction; an integral float such as ``7.0`` is the id 7),
or does not end with the EOS id while EOS is not to be appended. With
``append_eos`` every document that does not already end with EOS gets one.
A batch in which no document ends with EOS, without ``append_eos``, is an
error: the source has no document ends and the caller must say what to do.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from zephon_stream.errors import InputError
from zephon_stream.writer.readers import Reject

LOOP_MIN_TOKENS_PER_DOC = 512
TOKEN_REJECT_REASONS = ("empty", "bad_token", "no_eos", "not_token_list", "missing_field", "bad_json", "undecodable")


@dataclass(slots=True, kw_only=True)
class RawDocuments:
    """Documents as a source stores them, before any check.

    Attributes:
        source: the input they come from.
        tokens: every document's values back to back (any numeric dtype).
        lengths: values in each document.
        records: record number of each document in its source.
        offsets: token offset of each document in its source (flat and
            indexed sources), or None where records are rows or lines.
        rejects: records the source already refused (a missing field,
            malformed JSON...), in record order.
        num_records: records this batch accounts for (documents + rejects).
        split_at_eos: the source found document ends by EOS itself, so a
            document without one here is a reject, never a missing convention.
    """

    source: str
    tokens: np.ndarray
    lengths: np.ndarray
    records: np.ndarray
    offsets: np.ndarray | None = None
    rejects: list[Reject] = field(default_factory=list)
    num_records: int = 0
    split_at_eos: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class FramedDocuments:
    """Documents ready for the shard builder."""

    tokens: np.ndarray
    lengths: np.ndarray
    records: np.ndarray
    rejects: list[Reject]


def _bad_positions(tokens: np.ndarray, vocab_size: int) -> np.ndarray:
    """Positions of values that are not ids of the vocabulary (fast when there are none)."""
    if tokens.size == 0:
        return np.zeros(0, np.int64)
    kind = tokens.dtype.kind
    if kind in "iu":
        # Unsigned ids need no lower bound, and uint16 ids none at all under a 65536+ vocabulary.
        if kind == "u" and 256**tokens.dtype.itemsize <= vocab_size:
            return np.zeros(0, np.int64)
        if (kind == "u" or int(tokens.min()) >= 0) and int(tokens.max()) < vocab_size:
            return np.zeros(0, np.int64)
        return np.flatnonzero((tokens < 0) | (tokens >= vocab_size))
    if kind == "f":
        with np.errstate(invalid="ignore"):
            good = np.isfinite(tokens) & (tokens >= 0) & (tokens < vocab_size) & (np.floor(tokens) == tokens)
        return np.flatnonzero(~good)
    return np.arange(tokens.size, dtype=np.int64)  # Bool, complex, object: nothing here is an id


def _describe(value: object, vocab_size: int) -> str:
    if isinstance(value, (float, np.floating)) and not (np.isfinite(value) and float(value).is_integer()):
        return f"{value!r} is not an integer"
    if isinstance(value, (bool, np.bool_)):
        return f"{value!r} is a boolean, not an id"
    return f"id {int(value)} is outside [0, {vocab_size})"  # type: ignore[call-overload]


def frame_documents(
    raw: RawDocuments, *, vocab_size: int, eos_id: int, append_eos: bool, dtype: np.dtype
) -> FramedDocuments:
    """Check ``raw`` and frame its good documents.

    Args:
        raw: documents as read.
        vocab_size: ids must lie in ``[0, vocab_size)``.
        eos_id: the tokenizer's end-of-document id.
        append_eos: append EOS to documents that do not end with it.
        dtype: the dataset's token dtype.

    Returns:
        The good documents (tokens of ``dtype``) and every reject, in record order.

    Raises:
        InputError: no document of the batch ends with EOS and ``append_eos`` is off.
    """
    lengths = np.asarray(raw.lengths, dtype=np.int64)
    tokens = raw.tokens
    count = len(lengths)
    ends = np.cumsum(lengths)
    starts = ends - lengths
    keep = lengths > 0
    reasons: dict[int, tuple[str, str]] = {}
    for i in np.flatnonzero(~keep):
        reasons[int(i)] = ("empty", "no token ids")
    bad = _bad_positions(tokens, vocab_size)
    if len(bad):
        docs, first = np.unique(np.searchsorted(ends, bad, side="right"), return_index=True)
        for doc, position in zip(docs.tolist(), bad[first].tolist()):
            at = position - int(starts[doc])
            where = f"token {at} of the document"
            if raw.offsets is not None:
                where += f" (token {int(raw.offsets[doc]) + at} of the source)"
            reasons[doc] = ("bad_token", f"{where}: {_describe(tokens[position].item(), vocab_size)}")
            keep[doc] = False
    last = np.zeros(count, dtype=bool)
    nonempty = lengths > 0
    last[nonempty] = tokens[ends[nonempty] - 1] == eos_id
    missing_eos = keep & ~last
    if not append_eos and missing_eos.any():
        if not raw.split_at_eos and not (keep & last).any():
            first_record = int(raw.records[0]) if count else 0
            raise InputError(
                f"input {raw.source} records {first_record}..{int(raw.records[-1])}: no document ends with the "
                f"EOS id {eos_id}, so the source has no document ends; pass --append-eos (append_eos=True) "
                "to end each document with EOS, or give the documents' boundaries"
            )
        for doc in np.flatnonzero(missing_eos).tolist():
            reasons[doc] = ("no_eos", f"last id is {tokens[ends[doc] - 1].item()}, not the EOS id {eos_id}")
        keep &= ~missing_eos
        missing_eos[:] = False
    rejects = _merge_rejects(raw, reasons)
    if keep.all() and not missing_eos.any():
        return FramedDocuments(
            tokens=tokens.astype(dtype, copy=False),
            lengths=lengths,
            records=np.asarray(raw.records, np.int64),
            rejects=rejects,
        )
    if keep.all():
        kept_tokens, kept_lengths, add = tokens.astype(dtype, copy=False), lengths, missing_eos
    else:
        kept_tokens = tokens[np.repeat(keep, lengths)].astype(dtype, copy=False)
        kept_lengths, add = lengths[keep], missing_eos[keep]
    if add.any():
        kept_tokens = _with_eos(kept_tokens, kept_lengths, add, eos_id)
        kept_lengths = kept_lengths + add
    return FramedDocuments(
        tokens=kept_tokens, lengths=kept_lengths, records=np.asarray(raw.records, np.int64)[keep], rejects=rejects
    )


def _with_eos(tokens: np.ndarray, lengths: np.ndarray, add: np.ndarray, eos_id: int) -> np.ndarray:
    """``tokens`` with ``eos_id`` inserted after each document flagged in ``add``."""
    out = np.empty(len(tokens) + int(add.sum()), dtype=tokens.dtype)
    if len(lengths) and add.all() and lengths.min() == lengths.max():
        # Rows of one length (packed sequences) are the common token input:
        # one strided copy, 2.5x less CPU than the copy per document below.
        width = int(lengths[0])
        rows = out.reshape(len(lengths), width + 1)
        rows[:, :width] = tokens.reshape(len(lengths), width)
        rows[:, width] = eos_id
        return out
    ends = np.cumsum(lengths)
    # One slice copy per document beats a boolean mask (~0.5 ns a token)
    # once documents average a few hundred tokens; short ones take the mask.
    if len(tokens) >= LOOP_MIN_TOKENS_PER_DOC * len(lengths):
        src = dst = 0
        for end, extra in zip(ends.tolist(), add.tolist()):
            n = end - src
            out[dst : dst + n] = tokens[src:end]
            dst += n
            if extra:
                out[dst] = eos_id
                dst += 1
            src = end
        return out
    eos_at = (ends + np.cumsum(add) - 1)[add]
    body = np.ones(len(out), dtype=bool)
    body[eos_at] = False
    out[body] = tokens
    out[eos_at] = eos_id
    return out


def _merge_rejects(raw: RawDocuments, reasons: dict[int, tuple[str, str]]) -> list[Reject]:
    found = [Reject(raw.source, int(raw.records[doc]), reason, detail) for doc, (reason, detail) in reasons.items()]
    if not raw.rejects:
        return sorted(found, key=lambda r: r.record)
    return sorted([*raw.rejects, *found], key=lambda r: r.record)
