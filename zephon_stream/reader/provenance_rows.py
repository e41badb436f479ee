"""The pieces of a packed row (``packing="best_fit"``), named by their source documents.

A best-fit row (``plan/packing.py``) is the block's pieces laid one after
another, then the label of its last input. Each piece lies inside one
EOS-delimited document of the block, which is one document of the dataset's
document index; this module places each piece in its document: the document
that began in an earlier block owns the block's first tokens, so a piece
there is that document's tail (or a middle part), never a whole document.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass, fields

import numpy as np

from zephon_stream.format.docindex import DocumentSpan
from zephon_stream.plan.packing import BlockRows, block_rows, packed_rows
from zephon_stream.reader.dataset import DatasetReader


def plain_fields(entry: object) -> dict:
    """A provenance entry's fields, its bases' included, as a dict (for JSON)."""
    return {f.name: getattr(entry, f.name) for f in fields(entry)}


# What a piece holds of its document, by which of its ends it reaches.
CUT_KINDS = ("whole", "head", "tail", "middle")


def cut_kind(document_token_start: int, document_token_end: int, num_tokens: int) -> str:
    """``"whole"``, ``"head"``, ``"tail"`` or ``"middle"``: which ends of its document a piece holds."""
    headless, tailless = document_token_start > 0, document_token_end < num_tokens
    return CUT_KINDS[2 * headless + tailless]


@dataclass(frozen=True, slots=True)
class DocumentPart:
    """The part of one source document inside a sample.

    Attributes:
        source: input file or URL the document came from.
        record: record number of the document within that source.
        token_start: first token of the document in the dataset's token stream.
        token_end: one past its last token (its EOS).
        sample_token_start: first token of the document inside the sample (0-based).
        sample_token_end: one past its last token inside the sample.
        document_token_start: the same first token, counted from the
            document's first token (0 when the sample holds its start).
        document_token_end: one past the same last token, counted the same
            way (``token_end - token_start`` when the sample holds its end).
    """

    source: str
    record: int
    token_start: int
    token_end: int
    sample_token_start: int
    sample_token_end: int
    document_token_start: int
    document_token_end: int

    @property
    def num_tokens(self) -> int:
        """Tokens of the whole document, its EOS included."""
        return self.token_end - self.token_start


@dataclass(frozen=True, slots=True)
class RowPiece(DocumentPart):
    """One piece of a packed row: a stretch of one source document, its
    ``DocumentPart`` fields counted within the row (``sample_token_end`` at
    most ``seq_len``), and:

    Attributes:
        block_token_start: the piece's first token, counted from its block's first token.
        cut: ``"whole"`` (the whole document), ``"head"`` (its beginning, not
            its end), ``"tail"`` (its end, not its beginning) or ``"middle"``.
    """

    block_token_start: int
    cut: str


@dataclass(frozen=True, slots=True)
class LabelToken:
    """The row's last token: the label of its last input, the token right after its last piece in the block.

    Attributes:
        source: input file or URL of the document it belongs to.
        record: that document's record number within its source.
        token_start: first token of the document in the dataset's token stream.
        token_end: one past its last token.
        document_token: the label's index in its document.
        block_token: the label's index in its block.
    """

    source: str
    record: int
    token_start: int
    token_end: int
    document_token: int
    block_token: int


@dataclass(frozen=True, eq=False)
class PackedBlock:
    """One block's tokens, its rows under a packing and the documents it overlaps."""

    tokens: np.ndarray
    rows: BlockRows
    token_offset: int  # global offset of the block's first token
    documents: list[DocumentSpan]
    document_starts: list[int]  # each document's ``token_start``, for bisection

    @classmethod
    def read(cls, reader: DatasetReader, block: int, seq_len: int, packing: str) -> PackedBlock:
        """Read block ``block`` and lay out its rows at ``seq_len`` under ``packing``."""
        tokens = reader.read_block(block)
        rows = block_rows(packing, tokens, seq_len, int(reader.manifest.tokenizer.eos_id))
        documents = reader.documents_of_block(block)
        return cls(
            tokens=tokens,
            rows=rows,
            token_offset=reader.manifest.token_offset_of_block(block),
            documents=documents,
            document_starts=[d.token_start for d in documents],
        )

    def _document(self, global_token: int) -> DocumentSpan:
        return self.documents[bisect_right(self.document_starts, global_token) - 1]

    def row_pieces(self, row: int) -> list[RowPiece]:
        """Row ``row``'s pieces, in row order, each placed in its document.

        A piece lies in one document when every document ends on its EOS
        (the writer's framing); should one not, the piece is listed once per
        document it holds part of, each part with its own cut.
        """
        out, at = [], 0
        for start, length in self.rows.row_pieces(row):
            first, end = self.token_offset + start, self.token_offset + start + length
            while first < end:
                doc = self._document(first)
                last = min(end, doc.token_end)
                into, until = first - doc.token_start, last - doc.token_start
                out.append(
                    RowPiece(
                        source=doc.source,
                        record=doc.record,
                        token_start=doc.token_start,
                        token_end=doc.token_end,
                        sample_token_start=at,
                        sample_token_end=at + last - first,
                        document_token_start=into,
                        document_token_end=until,
                        block_token_start=first - self.token_offset,
                        cut=cut_kind(into, until, doc.token_end - doc.token_start),
                    )
                )
                at += last - first
                first = last
        return out

    def label(self, row: int) -> LabelToken:
        """The label of row ``row``'s last input, placed in its document."""
        block_token = int(self.rows.label_indices()[row])
        doc = self._document(self.token_offset + block_token)
        return LabelToken(
            source=doc.source,
            record=doc.record,
            token_start=doc.token_start,
            token_end=doc.token_end,
            document_token=self.token_offset + block_token - doc.token_start,
            block_token=block_token,
        )

    def row_tokens(self, row: int) -> np.ndarray:
        """Row ``row``'s ``seq_len + 1`` tokens as the loader delivers them: its pieces, then its label."""
        rows = self.rows
        one = BlockRows(
            seq_len=rows.seq_len,
            num_rows=1,
            piece_starts=rows.piece_starts[rows.row_bounds[row] : rows.row_bounds[row + 1]],
            piece_lengths=rows.piece_lengths[rows.row_bounds[row] : rows.row_bounds[row + 1]],
            row_bounds=[0, rows.row_bounds[row + 1] - rows.row_bounds[row]],
        )
        return packed_rows(self.tokens, one)[0]
