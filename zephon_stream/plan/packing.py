"""Row packing of one block: which block tokens each of its rows reads.

A block of ``n`` tokens holds ``R = max(0, (n - 1) // L)`` rows at seq_len
``L``; its region is tokens ``[0, T)``, ``T = R * L``, and token ``T`` (which
exists) is label only. Under ``packing="concat"`` row ``j`` reads the window
``[j * L, (j + 1) * L)``. Under ``packing="best_fit"`` the same ``R`` rows are
filled with the region's documents by best-fit decreasing:

- Documents: the region split after every EOS; the first may start before
  the block and the last may run past ``T``: both count as documents.
- Pieces: a document of at most ``L`` tokens is one piece; a longer one is cut
  from its start into pieces of ``L`` tokens, the last shorter (or ``L``).
- The edge piece (the region's last piece when it does not end on EOS and is
  shorter than ``L``) waits for the fill. Every other piece, by length
  descending then start ascending, goes whole into the row with the smallest
  room that holds it (lowest row on ties), or, when none does, to the fill.
- Fill: the pieces left over (same order), then the edge piece, read as one
  token sequence, are laid across the rows with room left (most room first,
  lowest row on ties), each taking the next ``room`` tokens; a piece is cut
  only where such a gap ends.
- A row holds its best-fit pieces in placement order, then its fill stretch.

So every row holds exactly ``L`` tokens, every region token is read once, a
piece never crosses a document boundary, and in a row only the last piece can
end on a token other than EOS. A row's last input is labelled by the token
right after its last piece in the block. A region without EOS gives the
windows. Integer arithmetic and stable sorts with explicit keys only: the
rows are the same on every machine and numpy version.
"""

from __future__ import annotations

import dataclasses
from bisect import bisect_left, insort

import numpy as np

from zephon_stream.errors import ConfigError

PACKINGS = ("concat", "best_fit")
# Below this mean piece length one gather of the whole output beats a
# slice copy per piece (~0.25 us a piece against ~2 ms for 2**20 tokens).
GATHER_PIECE_TOKENS = 128


@dataclasses.dataclass(frozen=True, slots=True, eq=False)
class BlockRows:
    """Which block tokens each row reads.

    Attributes:
        seq_len: tokens per row input (``L``).
        num_rows: rows of the block (``R``).
        piece_starts: ``int64 [P]``, each piece's first token (index in the
            block); rows in order, each row's pieces in order.
        piece_lengths: ``int64 [P]``, each piece's token count (``>= 1``).
        row_bounds: ``int64 [R + 1]``; row ``r`` holds pieces
            ``row_bounds[r]:row_bounds[r + 1]``, their lengths summing to ``L``.
    """

    seq_len: int
    num_rows: int
    piece_starts: np.ndarray
    piece_lengths: np.ndarray
    row_bounds: np.ndarray

    def __post_init__(self) -> None:
        for name in ("piece_starts", "piece_lengths", "row_bounds"):
            array = np.array(getattr(self, name), dtype=np.int64).reshape(-1)
            array.setflags(write=False)
            object.__setattr__(self, name, array)
        if self.row_bounds.size != self.num_rows + 1 or self.piece_starts.size != self.piece_lengths.size:
            raise ValueError(
                f"{self.num_rows} rows need {self.num_rows + 1} row bounds (got {self.row_bounds.size})"
                f" and as many piece starts as lengths (got {self.piece_starts.size}, "
                f"{self.piece_lengths.size})"
            )

    def row_pieces(self, row: int) -> list[tuple[int, int]]:
        """``(start, length)`` of row ``row``'s pieces, in order."""
        if not 0 <= row < self.num_rows:
            raise IndexError(f"row {row} outside [0, {self.num_rows})")
        lo, hi = int(self.row_bounds[row]), int(self.row_bounds[row + 1])
        return list(zip(self.piece_starts[lo:hi].tolist(), self.piece_lengths[lo:hi].tolist()))

    def label_indices(self) -> np.ndarray:
        """Block index of the label of each row's last input (right after its last piece)."""
        last = self.row_bounds[1:] - 1
        return self.piece_starts[last] + self.piece_lengths[last]


def packed_tokens(num_tokens: int, seq_len: int) -> int:
    """Tokens a block of ``num_tokens`` holds as packed rows (:func:`packed_rows`): ``R x (L + 1)``."""
    return max(0, (num_tokens - 1) // seq_len) * (seq_len + 1)


def window_rows(num_tokens: int, seq_len: int) -> BlockRows:
    """Today's windows (``packing="concat"``): row ``j`` is one piece ``[j * L, (j + 1) * L)``.

    Raises:
        ConfigError: ``seq_len < 1``.
    """
    _check_seq_len(seq_len)
    rows = max(0, (int(num_tokens) - 1) // seq_len)
    return BlockRows(
        seq_len=seq_len,
        num_rows=rows,
        piece_starts=np.arange(rows, dtype=np.int64) * seq_len,
        piece_lengths=np.full(rows, seq_len),
        row_bounds=np.arange(rows + 1),
    )


def block_rows(packing: str, tokens: np.ndarray, seq_len: int, eos_id: int) -> BlockRows:
    """The rows of one block under ``packing`` (one of ``PACKINGS``).

    Raises:
        ConfigError: an unknown packing, ``seq_len < 1``, or a bad ``eos_id``.
    """
    if packing == "concat":
        return window_rows(np.asarray(tokens).size, seq_len)
    if packing == "best_fit":
        return best_fit_rows(tokens, seq_len, eos_id)
    raise ConfigError(f"packing must be one of {', '.join(map(repr, PACKINGS))} (got {packing!r})")


def best_fit_rows(tokens: np.ndarray, seq_len: int, eos_id: int) -> BlockRows:
    """The block's documents packed into its rows by best-fit decreasing (module docstring).

    Args:
        tokens: the block's tokens, a 1-D integer array.
        seq_len: tokens per row input (``L >= 1``).
        eos_id: the end-of-document token; must fit ``tokens``' dtype.

    Raises:
        ConfigError: ``seq_len < 1`` or an ``eos_id`` outside the token dtype.
        ValueError: ``tokens`` is not a 1-D integer array.
    """
    tokens = check_tokens(tokens, eos_id)
    _check_seq_len(seq_len)
    rows = max(0, (tokens.size - 1) // seq_len)
    region = rows * seq_len
    if rows == 0:
        return window_rows(tokens.size, seq_len)
    starts, lengths = _block_pieces(tokens, region, seq_len, eos_id)
    # The edge piece runs on past T; filled last, it is cut only where
    # its row ends, never in front of a whole document.
    has_edge_piece = bool(int(lengths[-1]) < seq_len and tokens[region - 1] != eos_id)
    rest = starts.size - 1 if has_edge_piece else starts.size
    edge_start, edge_length = starts[rest:], lengths[rest:]
    starts, lengths = starts[:rest], lengths[:rest]
    # The pieces are in start order, so a stable sort on length alone
    # breaks ties by start ascending.
    order = stable_order(seq_len - lengths, seq_len)
    sorted_starts, sorted_lengths = starts[order], lengths[order]
    placed_rows, room = _place_best_fit(sorted_lengths, rows, seq_len)

    gap_rows = np.flatnonzero(room > 0)
    gap_rows = gap_rows[stable_order((seq_len - room[gap_rows]) * rows + gap_rows, seq_len * rows)]
    left = placed_rows < 0
    fill_starts = np.concatenate([sorted_starts[left], edge_start])
    fill_lengths = np.concatenate([sorted_lengths[left], edge_length])
    fill_rows, fill_starts, fill_lengths = _lay_fill(fill_starts, fill_lengths, gap_rows, room[gap_rows])

    placed = ~left
    all_rows = np.concatenate([placed_rows[placed], fill_rows])
    # Within a row, best-fit pieces in placement order (= sorted order),
    # then the fill stretch in sequence order: a stable sort on the row keeps both.
    by_row = stable_order(all_rows, rows)
    bounds = np.zeros(rows + 1, dtype=np.int64)
    np.cumsum(np.bincount(all_rows, minlength=rows), out=bounds[1:])
    return BlockRows(
        seq_len=seq_len,
        num_rows=rows,
        piece_starts=np.concatenate([sorted_starts[placed], fill_starts])[by_row],
        piece_lengths=np.concatenate([sorted_lengths[placed], fill_lengths])[by_row],
        row_bounds=bounds,
    )


def _place_best_fit(lengths: np.ndarray, rows: int, capacity: int) -> tuple[np.ndarray, np.ndarray]:
    """Best fit of pieces in decreasing order: each piece's row (-1: none) and each row's room left."""
    room = np.full(rows, capacity, dtype=np.int64)
    # Two pieces longer than L/2 never share a row, so in decreasing
    # order each takes the lowest empty row while one is left, and no row after.
    num_big = int(np.count_nonzero(2 * lengths > capacity))
    num_first = min(num_big, rows)
    room[:num_first] -= lengths[:num_first]
    placed = [np.arange(num_first, dtype=np.int64), np.full(num_big - num_first, -1, dtype=np.int64)]
    small = lengths[num_big:]
    if small.size == 0:
        return np.concatenate(placed), room
    run_firsts = np.concatenate([[0], np.flatnonzero(np.diff(small)) + 1])
    run_sizes = np.diff(np.append(run_firsts, small.size)).tolist()
    # One sorted list of keys room * R + row: the smallest room that
    # holds s, lowest row on ties, is the first key >= s * R.
    open_rows = np.flatnonzero(room > 0)
    keys = np.sort(room[open_rows] * rows + open_rows).tolist()
    out_rows, out_counts = [], []
    for size, count in zip(small[run_firsts].tolist(), run_sizes):
        # ``take`` pieces of ``size`` lower a row's key by ``take * size
        # * R``; equal pieces fill the same row while it holds them, as its
        # room then drops below every other room that holds them.
        bar = size * rows
        while count:
            i = bisect_left(keys, bar)
            if i == len(keys):
                out_rows.append(-1)
                out_counts.append(count)
                break
            key = keys.pop(i)
            take = 1 if count == 1 else min(count, key // bar)
            key -= take * bar
            out_rows.append(key % rows)
            out_counts.append(take)
            count -= take
            if key >= rows:
                insort(keys, key, 0, i)
    placed.append(np.repeat(np.array(out_rows, dtype=np.int64), out_counts))
    room[:] = 0
    keys_array = np.array(keys, dtype=np.int64)
    room[keys_array % rows] = keys_array // rows
    return np.concatenate(placed), room


def _lay_fill(
    starts: np.ndarray, lengths: np.ndarray, gap_rows: np.ndarray, gap_rooms: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The fill pieces' tokens, as one sequence, laid across the gaps in order: ``(row, start, length)``."""
    piece_edges = np.concatenate([[0], np.cumsum(lengths)])
    gap_edges = np.concatenate([[0], np.cumsum(gap_rooms)])
    assert piece_edges[-1] == gap_edges[-1], f"fill of {piece_edges[-1]} tokens for gaps of {gap_edges[-1]}"
    cuts = np.union1d(piece_edges, gap_edges)
    firsts = cuts[:-1]
    piece = np.searchsorted(piece_edges, firsts, side="right") - 1
    gap = np.searchsorted(gap_edges, firsts, side="right") - 1
    return gap_rows[gap], starts[piece] + (firsts - piece_edges[piece]), np.diff(cuts)


def block_documents(tokens: np.ndarray, region: int, eos_id: int) -> tuple[np.ndarray, np.ndarray]:
    """``(starts, ends)`` of the documents of tokens ``[0, region)``: split after every EOS."""
    ends = np.flatnonzero(tokens[:region] == eos_id) + 1
    if ends.size == 0 or ends[-1] != region:
        ends = np.append(ends, region)
    return np.concatenate([[0], ends[:-1]]), ends


def _block_pieces(tokens: np.ndarray, region: int, seq_len: int, eos_id: int) -> tuple[np.ndarray, np.ndarray]:
    """``(starts, lengths)`` of the region's pieces in start order."""
    doc_starts, doc_ends = block_documents(tokens, region, eos_id)
    doc_lengths = doc_ends - doc_starts
    per_doc = (doc_lengths + seq_len - 1) // seq_len
    if per_doc.size == int(per_doc.sum()):
        return doc_starts, doc_lengths
    doc = np.repeat(np.arange(per_doc.size), per_doc)
    first = np.cumsum(per_doc) - per_doc
    starts = doc_starts[doc] + (np.arange(doc.size) - first[doc]) * seq_len
    return starts, np.minimum(seq_len, doc_ends[doc] - starts)


def stable_order(keys: np.ndarray, bound: int) -> np.ndarray:
    """A stable argsort of integer keys in ``[0, bound)``.

    A stable sort has one result whatever its algorithm; numpy radix
    sorts 16-bit keys (10x faster), so keys under 2**32 take two such passes.
    """
    if bound <= 1 << 16:
        return np.argsort(keys.astype(np.uint16), kind="stable")
    if bound <= 1 << 32:
        low = np.argsort((keys & 0xFFFF).astype(np.uint16), kind="stable")
        return low[np.argsort((keys[low] >> 16).astype(np.uint16), kind="stable")]
    return np.argsort(keys, kind="stable")


def packed_rows(tokens: np.ndarray, rows: BlockRows, out: np.ndarray | None = None) -> np.ndarray:
    """The rows' tokens, ``[R, L + 1]`` at ``tokens``' dtype.

    Row ``r`` is its pieces' tokens concatenated, then the label of its last
    input (the token right after its last piece). For window rows this is
    today's windows stacked.

    Args:
        tokens: the block the rows were computed from.
        rows: its rows.
        out: where to write, a writable C-contiguous ``[R, L + 1]`` array of
            ``tokens``' dtype; None: a new array.

    Raises:
        ValueError: a wrong ``out``, or rows that read past the end of ``tokens``.
    """
    tokens = np.ascontiguousarray(tokens)
    num_rows, seq_len = rows.num_rows, rows.seq_len
    shape = (num_rows, seq_len + 1)
    if out is None:
        out = np.empty(shape, dtype=tokens.dtype)
    elif out.shape != shape or out.dtype != tokens.dtype or not (out.flags.c_contiguous and out.flags.writeable):
        raise ValueError(
            f"out must be a writable C-contiguous {shape} array of {tokens.dtype} (got {out.shape} of {out.dtype}, "
            f"{'' if out.flags.c_contiguous else 'not '}C-contiguous, {'' if out.flags.writeable else 'not '}writable)"
        )
    if num_rows == 0:
        return out
    labels = rows.label_indices()
    if int(labels.max()) >= tokens.size:
        raise ValueError(f"rows read token {int(labels.max())} of a block of {tokens.size} tokens")
    starts, lengths = rows.piece_starts, rows.piece_lengths
    if starts.size * GATHER_PIECE_TOKENS > num_rows * seq_len:
        np.take(tokens, gather_index(rows), out=out.reshape(-1))
        return out
    out[:, seq_len] = tokens[labels]
    dest = _piece_slots(rows)
    # memoryview slice copies of bytes measured faster than numpy slice copies.
    item = tokens.dtype.itemsize
    target, source = memoryview(out.reshape(-1)).cast("B"), memoryview(tokens).cast("B")
    for to, start, count in zip((dest * item).tolist(), (starts * item).tolist(), (lengths * item).tolist()):
        target[to : to + count] = source[start : start + count]
    return out


def gather_index(rows: BlockRows) -> np.ndarray:
    """Which block token each slot of the rows' output reads: ``packed_rows`` is ``tokens[gather_index(rows)]``.

    The output is ``[R, L + 1]``, flattened: each row's pieces, then its
    label. The index is a running sum of steps: ``+1`` from one slot to the
    next, except at a piece's first slot, which jumps to the piece's start. A
    row's label slot steps on from its last piece (the token right after it),
    so the next row's first jump is one shorter.

    Example, ``L = 3``: row 0 holds the pieces ``(start 0, length 2)`` and
    ``(start 5, length 1)``, row 1 the piece ``(start 2, length 3)``. The
    pieces' first slots are ``0, 2, 4``; their jumps ``0`` (to token 0),
    ``5 - (0 + 2) + 1 = 4`` and ``2 - (5 + 1) + 1 - 1 = -4`` (after a label).
    The steps ``[0, 1, 4, 1, -4, 1, 1, 1]`` sum to ``[0, 1, 5, 6, 2, 3, 4, 5]``:
    row 0 reads tokens 0, 1, 5 and the label 6; row 1 tokens 2, 3, 4 and the
    label 5.
    """
    starts, lengths = rows.piece_starts, rows.piece_lengths
    steps = np.ones(rows.num_rows * (rows.seq_len + 1), dtype=np.int64)
    jumps = np.concatenate([starts[:1], starts[1:] - (starts + lengths)[:-1] + 1])
    jumps[rows.row_bounds[1:-1]] -= 1
    steps[_piece_slots(rows)] = jumps
    return np.cumsum(steps, out=steps)


def _piece_slots(rows: BlockRows) -> np.ndarray:
    """Each piece's first slot in the flattened ``[R, L + 1]`` output."""
    piece_rows = np.repeat(np.arange(rows.num_rows, dtype=np.int64), np.diff(rows.row_bounds))
    # The pieces before it fill ``r * L`` slots of the rows before and its
    # offset in its row; each row before it adds one label slot, ``r`` in all.
    return piece_rows + np.cumsum(rows.piece_lengths) - rows.piece_lengths


def _check_seq_len(seq_len: int) -> None:
    if isinstance(seq_len, bool) or not isinstance(seq_len, (int, np.integer)) or seq_len < 1:
        raise ConfigError(f"seq_len must be an integer >= 1 (got {seq_len!r})")


def check_tokens(tokens: np.ndarray, eos_id: int) -> np.ndarray:
    """``tokens`` as a numpy array, checked: a block's tokens with the EOS id that splits them into documents.

    Args:
        tokens: a block's tokens, a 1-D integer array (or what ``np.asarray`` makes one of).
        eos_id: the end-of-document token; it must be a value of ``tokens``' dtype.

    Raises:
        ValueError: ``tokens`` is not a 1-D integer array.
        ConfigError: ``eos_id`` is not an integer of the tokens' dtype (a bool is not one).
    """
    tokens = np.asarray(tokens)
    if tokens.ndim != 1 or tokens.dtype.kind not in "iu":
        raise ValueError(f"tokens must be a 1-D integer array (got shape {tokens.shape} of {tokens.dtype})")
    info = np.iinfo(tokens.dtype)
    if isinstance(eos_id, bool) or not isinstance(eos_id, (int, np.integer)) or not info.min <= eos_id <= info.max:
        raise ConfigError(
            f"eos_id must be an integer in [{info.min}, {info.max}] for {tokens.dtype} tokens (got {eos_id!r})"
        )
    return tokens
