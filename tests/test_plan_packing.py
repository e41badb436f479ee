"""Best-fit row packing of one block (zephon_stream/plan/packing.py): every
row holds exactly seq_len tokens, every region token is read once, pieces stay
inside documents and only a row's last piece may end without EOS; the result
equals a brute-force transcription of the contract, is the same for every
token dtype, and cuts far fewer documents of real text than the windows do."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zephon_stream.errors import ConfigError
from zephon_stream.plan import packing
from zephon_stream.plan.packing import (
    PACKINGS,
    BlockRows,
    best_fit_rows,
    block_rows,
    gather_index,
    packed_rows,
    packed_tokens,
    window_rows,
)
from zephon_stream.plan.packing_cuts import CutCounts, cut_counts

VOCAB = 5


# -- the contract, transcribed with plain loops -----------------------------------


def reference_rows(tokens: list[int], seq_len: int, eos: int) -> list[list[tuple[int, int]]]:
    """Each row's ``(start, length)`` pieces, straight from the contract: O(P * R), no cleverness."""
    rows = max(0, (len(tokens) - 1) // seq_len)
    region = rows * seq_len
    documents, start = [], 0
    for i in range(region):
        if tokens[i] == eos:
            documents.append((start, i + 1))
            start = i + 1
    if start < region:
        documents.append((start, region))
    pieces = []
    for a, b in documents:
        while a < b:
            pieces.append((a, min(seq_len, b - a)))
            a += seq_len
    edge = None
    if pieces and pieces[-1][1] < seq_len and tokens[region - 1] != eos:
        edge = pieces.pop()
    pieces.sort(key=lambda piece: (-piece[1], piece[0]))
    room = [seq_len] * rows
    placed: list[list[tuple[int, int]]] = [[] for _ in range(rows)]
    left = []
    for start, length in pieces:
        best = None
        for row in range(rows):
            if room[row] >= length and (best is None or room[row] < room[best]):
                best = row
        if best is None:
            left.append((start, length))
        else:
            placed[best].append((start, length))
            room[best] -= length
    if edge is not None:
        left.append(edge)
    sequence = [(k, start + i) for k, (start, length) in enumerate(left) for i in range(length)]
    assert len(sequence) == sum(room)
    at = 0
    for row in sorted(range(rows), key=lambda row: (-room[row], row)):
        stretch, at = sequence[at : at + room[row]], at + room[row]
        for i, (k, index) in enumerate(stretch):
            if i and stretch[i - 1][0] == k:
                start, length = placed[row][-1]
                placed[row][-1] = (start, length + 1)
            else:
                placed[row].append((index, 1))
    return placed


def check_rows(tokens: np.ndarray, rows: BlockRows, eos: int) -> None:
    """Every guarantee of the contract, on rows of either packing."""
    n, length = tokens.size, rows.seq_len
    assert rows.num_rows == max(0, (n - 1) // length)
    region = rows.num_rows * length
    assert rows.row_bounds[0] == 0 and rows.row_bounds[-1] == rows.piece_starts.size
    seen = np.zeros(region, dtype=np.int64)
    packed = packed_rows(tokens, rows)
    assert packed.shape == (rows.num_rows, length + 1) and packed.dtype == tokens.dtype
    for row in range(rows.num_rows):
        pieces = rows.row_pieces(row)
        assert pieces and sum(count for _, count in pieces) == length  # nothing padded
        open_ends = []
        for k, (start, count) in enumerate(pieces):
            assert count >= 1 and start >= 0 and start + count <= region
            seen[start : start + count] += 1
            if tokens[start + count - 1] != eos:
                open_ends.append(k)
        label = sum(pieces[-1])  # The token right after the row's last piece
        assert label < n
        want = np.concatenate([tokens[s : s + c] for s, c in pieces] + [tokens[label : label + 1]])
        np.testing.assert_array_equal(packed[row], want)
        assert open_ends in ([], [len(pieces) - 1])  # only the last piece may end without EOS
    assert np.all(seen == 1)  # nothing lost, nothing read twice


def check_best_fit(tokens: np.ndarray, rows: BlockRows, eos: int) -> None:
    """The best-fit guarantees on top of ``check_rows``: pieces inside documents."""
    check_rows(tokens, rows, eos)
    for start, count in zip(rows.piece_starts.tolist(), rows.piece_lengths.tolist()):
        assert not np.any(tokens[start : start + count - 1] == eos)  # no document boundary inside
    region = rows.num_rows * rows.seq_len
    if not np.any(tokens[:region] == eos):
        assert_same_rows(rows, window_rows(tokens.size, rows.seq_len))


def assert_same_rows(got: BlockRows, want: BlockRows) -> None:
    assert (got.seq_len, got.num_rows) == (want.seq_len, want.num_rows)
    for name in ("piece_starts", "piece_lengths", "row_bounds"):
        np.testing.assert_array_equal(getattr(got, name), getattr(want, name), err_msg=name)


# -- random blocks -----------------------------------------------------------------


@st.composite
def blocks(draw, max_rows: int = 100):
    """``(tokens, seq_len, eos)``: EOS nowhere, everywhere, at random, and on the region's edges."""
    seq_len = draw(st.one_of(st.integers(1, 8), st.integers(1, 300)))
    rows = min(draw(st.one_of(st.integers(1, max_rows), st.integers(0, 3))), 3000 // seq_len)
    n = rows * seq_len + draw(st.integers(1, seq_len))
    dtype = draw(st.sampled_from([np.uint16, np.uint32]))
    eos = draw(st.sampled_from([0, 3, int(np.iinfo(dtype).max)]))
    rate = draw(st.sampled_from([0.1, 1 / seq_len, 2 / seq_len, 0.5 / seq_len, 0.5, 0.02, 0.003, 1.0, 0.0]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    values = rng.integers(0, VOCAB, n)
    values[values == eos] = (eos + 1) % VOCAB
    values[rng.random(n) < rate] = eos
    region = max(0, (n - 1) // seq_len) * seq_len
    for where in draw(st.sets(st.sampled_from(["region_end", "label", "last", "start"]))):
        index = {"region_end": region - 1, "label": region, "last": n - 1, "start": 0}[where]
        values[max(index, 0)] = eos
    return values.astype(dtype), seq_len, eos


@settings(max_examples=150, deadline=None)
@given(block=blocks())
def test_best_fit_rows_equal_the_contract_transcribed(block):
    tokens, seq_len, eos = block
    rows = best_fit_rows(tokens, seq_len, eos)
    want = reference_rows(tokens.tolist(), seq_len, eos)
    assert [rows.row_pieces(r) for r in range(rows.num_rows)] == want


def document_block(seed: int) -> tuple[np.ndarray, int, int]:
    """A block of documents of log-normal lengths around ``seq_len``, or of a few
    lengths only (many equal pieces, many over half a row)."""
    rng = np.random.default_rng(seed)
    seq_len = int(rng.integers(8, 300))
    if seed % 2:
        lengths = rng.lognormal(np.log(seq_len * rng.choice([0.05, 0.3, 1.0])), 1.1, 4000)
    else:
        lengths = rng.choice([1, 3, seq_len // 2, seq_len // 2 + 1, seq_len - 1, seq_len, 2 * seq_len + 1], 4000)
    ends = np.cumsum(np.maximum(1, np.rint(lengths).astype(np.int64))) - 1
    n = int(rng.integers(seq_len + 1, 3000))
    tokens = rng.integers(1, VOCAB, n).astype(np.uint16)
    tokens[ends[ends < n]] = 0
    return tokens, seq_len, 0


@pytest.mark.parametrize("seed", range(24))
def test_best_fit_rows_of_documents_equal_the_contract_transcribed(seed):
    tokens, seq_len, eos = document_block(seed)
    rows = best_fit_rows(tokens, seq_len, eos)
    assert [rows.row_pieces(r) for r in range(rows.num_rows)] == reference_rows(tokens.tolist(), seq_len, eos)
    check_best_fit(tokens, rows, eos)


@settings(max_examples=150, deadline=None)
@given(block=blocks(max_rows=400))
def test_best_fit_rows_keep_every_guarantee(block):
    tokens, seq_len, eos = block
    check_best_fit(tokens, best_fit_rows(tokens, seq_len, eos), eos)


@settings(max_examples=60, deadline=None)
@given(block=blocks(max_rows=400))
def test_best_fit_rows_are_the_same_twice_and_for_every_token_dtype(block):
    tokens, seq_len, eos = block
    rows = best_fit_rows(tokens, seq_len, eos)
    assert_same_rows(best_fit_rows(tokens.copy(), seq_len, eos), rows)
    if eos <= np.iinfo(np.uint16).max:
        for dtype in (np.uint16, np.uint32, np.int64):
            assert_same_rows(best_fit_rows(tokens.astype(dtype), seq_len, eos), rows)


@settings(max_examples=80, deadline=None)
@given(n=st.integers(0, 2000), seq_len=st.integers(1, 300))
def test_window_rows_and_concat_are_todays_windows(n, seq_len):
    tokens = (np.arange(n) % VOCAB).astype(np.uint16)  # No EOS (VOCAB) anywhere
    rows = window_rows(n, seq_len)
    samples = max(0, (n - 1) // seq_len)
    assert rows.num_rows == samples
    assert [rows.row_pieces(j) for j in range(samples)] == [[(j * seq_len, seq_len)] for j in range(samples)]
    assert_same_rows(block_rows("concat", tokens, seq_len, VOCAB), rows)
    windows = [tokens[j * seq_len : j * seq_len + seq_len + 1] for j in range(samples)]
    want = np.stack(windows) if windows else np.empty((0, seq_len + 1), np.uint16)
    np.testing.assert_array_equal(packed_rows(tokens, rows), want)
    check_rows(tokens, rows, VOCAB)
    # a region without EOS (even with EOS on T and past it): best fit reads the windows too
    assert_same_rows(best_fit_rows(tokens, seq_len, VOCAB), rows)
    tokens[samples * seq_len :] = VOCAB
    assert_same_rows(best_fit_rows(tokens, seq_len, VOCAB), rows)


@settings(max_examples=60, deadline=None)
@given(block=blocks(max_rows=400))
def test_packed_rows_by_slices_and_by_one_gather_agree(block):
    tokens, seq_len, eos = block
    rows = best_fit_rows(tokens, seq_len, eos)
    saved = packing.GATHER_PIECE_TOKENS
    try:
        packing.GATHER_PIECE_TOKENS = 0  # A slice copy per piece
        by_slices = packed_rows(tokens, rows)
        packing.GATHER_PIECE_TOKENS = 1 << 40  # One gather
        by_gather = packed_rows(tokens, rows)
    finally:
        packing.GATHER_PIECE_TOKENS = saved
    np.testing.assert_array_equal(by_gather, by_slices)


def test_small_block_packs_as_worked_out_by_hand():
    # region [0, 12) at L = 4 (R = 3): documents [0,3) [3,4) [4,10) [10,12) (the last runs past T = 12)
    e = 9
    tokens = np.array([1, 1, e, e, 2, 2, 2, 2, 2, e, 3, 3, 3], np.uint16)
    rows = best_fit_rows(tokens, 4, e)
    # pieces [0,3) [3,4) [4,8) [8,10) and the edge [10,12): best fit puts [4,8) in row 0,
    # [0,3) in row 1, [8,10) in row 2, [3,4) in row 1; the edge fills row 2.
    assert [rows.row_pieces(r) for r in range(3)] == [[(4, 4)], [(0, 3), (3, 1)], [(8, 2), (10, 2)]]
    np.testing.assert_array_equal(packed_rows(tokens, rows), [[2, 2, 2, 2, 2], [1, 1, e, e, 2], [2, e, 3, 3, 3]])
    out = np.zeros((3, 5), np.uint16)
    assert packed_rows(tokens, rows, out) is out and out[2].tolist() == [2, e, 3, 3, 3]
    assert block_rows("best_fit", tokens, 4, e).row_pieces(1) == [(0, 3), (3, 1)]
    assert PACKINGS == ("concat", "best_fit")


def test_a_last_piece_of_exactly_seq_len_tokens_is_placed_by_best_fit_not_left_for_the_fill():
    # docs/PACKING.md's worked case: documents [E] [E] [a,E] [b,c,d,E] in blocks of 7 tokens.
    # At L = 2 the region E E a E b c ends inside [b,c,d,E], but its piece [b,c] is L long:
    # no edge piece (rule 5), so best fit puts [a,E] in row 0, [b,c] in row 1, both [E] in row 2.
    e, a, b, c, d = 256, 97, 98, 99, 100
    tokens = np.array([e, e, a, e, b, c, d], np.uint16)
    rows = best_fit_rows(tokens, 2, e)
    assert [rows.row_pieces(r) for r in range(3)] == [[(2, 2)], [(4, 2)], [(0, 1), (1, 1)]]
    assert reference_rows(tokens.tolist(), 2, e) == [[(2, 2)], [(4, 2)], [(0, 1), (1, 1)]]
    np.testing.assert_array_equal(packed_rows(tokens, rows), [[a, e, b], [b, c, d], [e, e, a]])
    check_best_fit(tokens, rows, e)
    # A last piece shorter than L is the edge piece: it waits for the fill, after row 2's [E].
    shorter = np.array([e, e, a, e, e, b, c], np.uint16)
    rows = best_fit_rows(shorter, 2, e)
    assert [rows.row_pieces(r) for r in range(3)] == [[(2, 2)], [(0, 1), (1, 1)], [(4, 1), (5, 1)]]


def test_the_gather_index_reads_as_its_worked_example():
    # The example of gather_index's docstring: L = 3, row 0 pieces (0, 2) and (5, 1), row 1 piece (2, 3).
    rows = BlockRows(seq_len=3, num_rows=2, piece_starts=[0, 5, 2], piece_lengths=[2, 1, 3], row_bounds=[0, 2, 3])
    assert gather_index(rows).tolist() == [0, 1, 5, 6, 2, 3, 4, 5]
    tokens = np.arange(100, 110, dtype=np.uint16)
    np.testing.assert_array_equal(packed_rows(tokens, rows), [[100, 101, 105, 106], [102, 103, 104, 105]])


def test_pieces_left_over_are_cut_only_where_a_row_ends():
    # L = 10, R = 2: pieces 6, 6, 6 (each EOS-ended) and 2. The third 6 fits no row: the
    # fill lays its tokens across row 1 (room 4) then row 0 (room 2, after the 2).
    e = 0
    doc = [1] * 5 + [e]
    tokens = np.array(doc * 3 + [2, e, 4], np.uint16)
    rows = best_fit_rows(tokens, 10, e)
    assert [rows.row_pieces(r) for r in range(2)] == [[(0, 6), (18, 2), (16, 2)], [(6, 6), (12, 4)]]
    check_best_fit(tokens, rows, e)


# -- cut counts --------------------------------------------------------------------


def test_cut_counts_count_both_packings_alike():
    e = 9
    tokens = np.array([1, 1, e, e, 2, 2, 2, 2, 2, e, 3, 3, 3], np.uint16)
    windows = cut_counts(tokens, window_rows(tokens.size, 4), e)
    best = cut_counts(tokens, best_fit_rows(tokens, 4, e), e)
    # windows [0,4) [4,8) [8,12): [4,10) is cut (floor) and read from 8 without its start
    assert windows == CutCounts(
        documents=4,
        documents_cut=1,
        tokens=12,
        tokens_without_beginning=2,
        floor=1,
        edge_documents=2,
        edge_documents_cut=0,
    )
    assert best == windows
    assert windows + best == CutCounts(8, 2, 24, 4, 2, 4, 0)
    assert sum([windows, best], CutCounts()) == windows + best
    empty = np.array([1, e], np.uint16)
    assert cut_counts(empty, best_fit_rows(empty, 4, e), e) == CutCounts()


@settings(max_examples=60, deadline=None)
@given(block=blocks(max_rows=400))
def test_cut_counts_match_a_token_by_token_count(block):
    tokens, seq_len, eos = block
    for rows in (window_rows(tokens.size, seq_len), best_fit_rows(tokens, seq_len, eos)):
        got = cut_counts(tokens, rows, eos)
        region = rows.num_rows * seq_len
        doc_start = np.zeros(region, np.int64)  # each token's document start
        for i in range(1, region):
            doc_start[i] = i if tokens[i - 1] == eos else doc_start[i - 1]
        piece_start = np.zeros(region, np.int64)
        for start, count in zip(rows.piece_starts.tolist(), rows.piece_lengths.tolist()):
            piece_start[start : start + count] = start
        starts = np.unique(doc_start)
        whole = [np.all(piece_start[doc_start == a] == piece_start[a]) for a in starts.tolist()]
        assert got.documents == starts.size and got.tokens == region
        assert got.documents_cut == whole.count(False)
        assert got.tokens_without_beginning == int(np.count_nonzero(piece_start > doc_start))
        assert got.floor == int(np.count_nonzero(np.bincount(doc_start, minlength=1)[starts] > seq_len))
        if region:
            edge = {0, int(doc_start[region - 1])} if tokens[region - 1] != eos else {0}
            assert got.edge_documents == len(edge)
            assert got.edge_floor == sum(int(np.count_nonzero(doc_start == a)) > seq_len for a in edge)


# -- real text ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def stdlib_documents(stdlib_corpus, bpe_tokenizer_json):
    """BPE tokens of stdlib sources as documents of three sizes: whole files
    (~3,600 tokens), blank-line paragraphs (~85) and lines (~16)."""
    from zephon_stream.writer.tokenizers import load_tokenizer

    tokenizer = load_tokenizer(f"hf:{bpe_tokenizer_json}")
    texts = stdlib_corpus.texts
    documents = {
        "files": texts[:60],
        "paragraphs": [part for text in texts[60:110] for part in text.split("\n\n") if part.strip()],
        "lines": [line for text in texts[100:125] for line in text.splitlines() if line.strip()],
    }
    flat = {name: tokenizer.encode_documents(docs)[0].astype(np.uint16) for name, docs in documents.items()}
    return flat, tokenizer.eos_id


@pytest.mark.parametrize("documents", ["files", "paragraphs", "lines"])
@pytest.mark.parametrize("seq_len", [128, 512, 2048])
def test_best_fit_cuts_far_fewer_stdlib_documents_than_windows(stdlib_documents, documents, seq_len):
    flat, eos = stdlib_documents[0][documents], stdlib_documents[1]
    block_tokens = 32769
    windows, best = CutCounts(), CutCounts()
    for first in range(0, flat.size - block_tokens, block_tokens):
        block = flat[first : first + block_tokens]
        rows = best_fit_rows(block, seq_len, eos)
        check_best_fit(block, rows, eos)
        windows += cut_counts(block, window_rows(block.size, seq_len), eos)
        best += cut_counts(block, rows, eos)
    assert best.documents == windows.documents > 50 and best.floor == windows.floor
    assert best.tokens_without_beginning < windows.tokens_without_beginning
    if documents == "files":  # Most files are longer than seq_len: cut by any packing
        assert best.floor <= best.documents_cut <= windows.documents_cut
    else:  # past the floor best fit cuts at most a fifth as many
        assert best.documents_cut - best.floor <= (windows.documents_cut - windows.floor) / 5


# -- bad arguments -----------------------------------------------------------------


def test_bad_arguments_are_refused_naming_the_values():
    tokens = np.arange(10, dtype=np.uint16)
    with pytest.raises(ConfigError, match=r"seq_len must be an integer >= 1 \(got 0\)"):
        best_fit_rows(tokens, 0, 1)
    with pytest.raises(ConfigError, match=r"seq_len must be an integer >= 1 \(got -3\)"):
        window_rows(10, -3)
    with pytest.raises(ConfigError, match=r"packing must be one of 'concat', 'best_fit' \(got 'bestfit'\)"):
        block_rows("bestfit", tokens, 4, 1)
    with pytest.raises(ConfigError, match=r"eos_id must be an integer in \[0, 65535\] for uint16 tokens \(got 65536"):
        best_fit_rows(tokens, 4, 65536)
    with pytest.raises(ValueError, match=r"tokens must be a 1-D integer array \(got shape \(2, 5\) of uint16\)"):
        best_fit_rows(tokens.reshape(2, 5), 4, 1)
    rows = best_fit_rows(tokens, 4, 1)
    wrong_out = r"out must be a writable C-contiguous \(2, 5\) array of uint16 \(got \(2, 4\) of uint16, C-contiguous"
    with pytest.raises(ValueError, match=wrong_out):
        packed_rows(tokens, rows, np.zeros((2, 4), np.uint16))
    with pytest.raises(ValueError, match=r"rows read token 8 of a block of 8 tokens"):
        packed_rows(tokens[:8], rows)
    with pytest.raises(IndexError, match=r"row 2 outside \[0, 2\)"):
        rows.row_pieces(2)


@pytest.mark.parametrize("num_tokens, seq_len", [(0, 4), (1, 4), (5, 4), (9, 4), (2**20 + 1, 2048), (2**20 + 1, 3000)])
def test_packed_tokens_is_the_size_of_the_packed_rows(num_tokens, seq_len):
    tokens = np.zeros(num_tokens, np.uint16)
    assert packed_rows(tokens, best_fit_rows(tokens, seq_len, 1)).size == packed_tokens(num_tokens, seq_len)
