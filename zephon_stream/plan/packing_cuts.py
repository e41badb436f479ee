"""How a packing cuts a block's documents: the figures of ``inspect --packing-report``.

The rows of either packing (``plan/packing.py``: windows or best fit) are
compared on the same blocks the same way: a document is cut when its tokens
are not all in one piece of one row, and a token is read without its
document's beginning when its piece starts after that document's first
token.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from zephon_stream.plan.packing import BlockRows, block_documents, check_tokens, stable_order


@dataclasses.dataclass(frozen=True, slots=True)
class CutCounts:
    """How a packing cuts documents, summed over the blocks counted (``+`` adds two).

    Documents are those of each block's region (module docstring): a region's
    first document may have begun in the block before and its last may run
    on past ``T``; both packings count each as a document that begins at token
    0 and ends at ``T``. ``edge_documents`` (the first document, and the last
    when it does not end on EOS), ``edge_documents_cut`` and ``edge_floor``
    let a report leave them out.

    Attributes:
        documents: documents in the counted regions.
        documents_cut: documents whose tokens are not all in one piece (one
            contiguous stretch of one row).
        tokens: input tokens (the regions' tokens).
        tokens_without_beginning: input tokens whose piece does not reach back
            to their document's first token: they are read without it.
        floor: documents longer than ``L``, which any packing must cut.
        edge_documents: documents touching a region's edge (in ``documents`` too).
        edge_documents_cut: those of them cut (in ``documents_cut`` too).
        edge_floor: those of them longer than ``L`` (in ``floor`` too).
    """

    documents: int = 0
    documents_cut: int = 0
    tokens: int = 0
    tokens_without_beginning: int = 0
    floor: int = 0
    edge_documents: int = 0
    edge_documents_cut: int = 0
    edge_floor: int = 0

    def __add__(self, other: CutCounts) -> CutCounts:
        if not isinstance(other, CutCounts):
            return NotImplemented
        return CutCounts(*(getattr(self, f.name) + getattr(other, f.name) for f in dataclasses.fields(self)))


def cut_counts(tokens: np.ndarray, rows: BlockRows, eos_id: int) -> CutCounts:
    """How ``rows`` (of either packing) cut the documents of ``tokens``' region.

    Args:
        tokens: the block the rows were computed from.
        rows: its rows; their pieces must cover the region once.
        eos_id: the end-of-document token.
    """
    tokens = check_tokens(tokens, eos_id)
    region = rows.num_rows * rows.seq_len
    if region == 0:
        return CutCounts()
    doc_starts, doc_ends = block_documents(tokens, region, eos_id)
    by_start = stable_order(rows.piece_starts, region)
    piece_starts = rows.piece_starts[by_start]
    piece_ends = piece_starts + rows.piece_lengths[by_start]
    assert piece_starts[0] == 0 and piece_ends[-1] == region and np.array_equal(piece_starts[1:], piece_ends[:-1])
    # A document is whole when the piece holding its first token also holds its last.
    cut = piece_ends[np.searchsorted(piece_starts, doc_starts, side="right") - 1] < doc_ends
    # A piece starting past its document's first token reads the rest
    # of that document, up to the piece's end, without its beginning.
    doc = np.searchsorted(doc_starts, piece_starts, side="right") - 1
    headless = doc_starts[doc] < piece_starts
    without = np.minimum(piece_ends, doc_ends[doc])[headless] - piece_starts[headless]
    edge = [0] if tokens[region - 1] == eos_id or doc_starts.size == 1 else [0, doc_starts.size - 1]
    longer = doc_ends - doc_starts > rows.seq_len
    return CutCounts(
        documents=int(doc_starts.size),
        documents_cut=int(np.count_nonzero(cut)),
        tokens=region,
        tokens_without_beginning=int(without.sum()),
        floor=int(np.count_nonzero(longer)),
        edge_documents=len(edge),
        edge_documents_cut=int(np.count_nonzero(cut[edge])),
        edge_floor=int(np.count_nonzero(longer[edge])),
    )
