"""How each packing would cut a dataset's documents: ``zephon-stream inspect --packing-report``.

Reads blocks of a dataset (all, or a number spread evenly over it), lays out
each block's rows at each seq_len under both packings (``plan/packing.py``)
and sums ``plan/packing_cuts.cut_counts`` over the blocks. Documents are
those of each block (split after every EOS): a document that crosses a block
edge is cut there whatever the packing, so the shares of documents cut are
given for the documents inside a block, and those at a block edge are
counted apart.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from zephon_stream.errors import ConfigError
from zephon_stream.plan.packing import PACKINGS, block_rows
from zephon_stream.plan.packing_cuts import CutCounts, cut_counts
from zephon_stream.reader.dataset import DatasetReader


def spread_blocks(num_blocks: int, count: int | None) -> list[int]:
    """``count`` block ids spread evenly over ``num_blocks``, the first included; all when ``count`` is None or more."""
    if count is None or count >= num_blocks:
        return list(range(num_blocks))
    if count < 1:
        raise ConfigError(f"--blocks must be >= 1, got {count}")
    return [k * num_blocks // count for k in range(count)]


def _share(part: int, whole: int) -> float | None:
    return part / whole if whole else None


def figures(counts: CutCounts) -> dict[str, int | float | None]:
    """The report's figures of one packing at one seq_len, from its summed counts.

    ``documents``, ``documents_cut`` and ``floor`` (documents longer than a
    row, which any packing cuts) count the documents inside a block, edge
    documents left out; ``edge_documents`` and ``edge_documents_cut`` count
    those at a block edge. Shares are ``None`` where there is nothing to share.
    """
    inside = counts.documents - counts.edge_documents
    inside_cut = counts.documents_cut - counts.edge_documents_cut
    inside_floor = counts.floor - counts.edge_floor
    return {
        "documents": inside,
        "documents_cut": inside_cut,
        "documents_cut_share": _share(inside_cut, inside),
        "floor": inside_floor,
        "floor_share": _share(inside_floor, inside),
        "edge_documents": counts.edge_documents,
        "edge_documents_cut": counts.edge_documents_cut,
        "edge_documents_cut_share": _share(counts.edge_documents_cut, counts.edge_documents),
        "tokens": counts.tokens,
        "tokens_without_beginning": counts.tokens_without_beginning,
        "tokens_without_beginning_share": _share(counts.tokens_without_beginning, counts.tokens),
    }


@dataclasses.dataclass(frozen=True, slots=True)
class PackingReport:
    """Cut counts of both packings over the same blocks, per seq_len.

    Attributes:
        url: the dataset.
        num_blocks: blocks in the dataset.
        blocks: the blocks read, in order.
        counts: ``{seq_len: {packing: CutCounts}}``, summed over ``blocks``.
    """

    url: str
    num_blocks: int
    blocks: tuple[int, ...]
    counts: dict[int, dict[str, CutCounts]]

    def blocks_read(self) -> str:
        """Which blocks were read, in words."""
        if len(self.blocks) == self.num_blocks:
            return f"all {self.num_blocks:,} blocks"
        shown = ", ".join(map(str, self.blocks[:12])) + (", ..." if len(self.blocks) > 12 else "")
        return f"{len(self.blocks):,} of {self.num_blocks:,} blocks, spread evenly (ids {shown})"

    def figures(self, seq_len: int) -> dict[str, dict[str, int | float | None]]:
        """The figures of each packing at ``seq_len`` (:func:`figures`), by packing name."""
        return {packing: figures(counts) for packing, counts in self.counts[seq_len].items()}

    def conclusion(self, seq_len: int) -> str:
        """One line: what the figures at ``seq_len`` say."""
        by_packing = self.figures(seq_len)
        concat, best_fit = by_packing["concat"], by_packing["best_fit"]
        if not concat["documents"]:
            return f"seq_len {seq_len}: no document lies inside a block's rows; nothing to compare"
        pct = "{:.1%}".format
        return (
            f"seq_len {seq_len}: best_fit cuts {pct(best_fit['documents_cut_share'])} of the documents inside a "
            f"block, concat {pct(concat['documents_cut_share'])} (the floor, those longer than a row, is "
            f"{pct(concat['floor_share'])}); {pct(best_fit['tokens_without_beginning_share'])} of tokens are read "
            f"without their document's beginning, against {pct(concat['tokens_without_beginning_share'])}"
        )

    def to_dict(self) -> dict:
        """Plain values, for JSON."""
        return {
            "blocks": list(self.blocks),
            "num_blocks": self.num_blocks,
            "counting": "documents, documents_cut and floor count the documents inside a block; edge_documents "
            "those crossing a block edge, once per block they reach",
            "seq_lens": [
                {"seq_len": seq_len, **self.figures(seq_len), "conclusion": self.conclusion(seq_len)}
                for seq_len in self.counts
            ],
        }

    def text(self) -> str:
        """The report as a table per seq_len, both packings side by side."""
        lines = [
            f"packing report of {self.url}: {self.blocks_read()}",
            "  a document crossing a block edge is cut there by any packing: such documents are counted apart,",
            "  once per block they reach; a block's first document is counted from the block's start",
        ]
        for seq_len in self.counts:
            by_packing = self.figures(seq_len)
            rows = [(f"seq_len {seq_len}", *_COLUMNS)]
            rows += [(label, *(shown(by_packing[p][key]) for p in _COLUMNS)) for label, key, shown in _TABLE]
            width = max(len(row[0]) for row in rows)
            lines.append("")
            lines.extend(f"{name:<{width}}  {left:>10}  {right:>10}" for name, left, right in rows)
            lines.append(self.conclusion(seq_len))
        return "\n".join(lines)


def _count(value: int | float | None) -> str:
    return f"{value:,}"


def _share_of(value: int | float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


# The table's columns, by packing name, and its rows: a label, the
# figure it shows and how.
_COLUMNS = ("concat", "best_fit")
_TABLE = (
    ("documents inside a block", "documents", _count),
    ("  cut", "documents_cut_share", _share_of),
    ("  longer than a row (the floor)", "floor_share", _share_of),
    ("documents at a block edge", "edge_documents", _count),
    ("  also cut inside the block", "edge_documents_cut_share", _share_of),
    ("tokens read without their document's beginning", "tokens_without_beginning_share", _share_of),
)


def _blocks_ahead(reader: DatasetReader, blocks: Sequence[int], workers: int) -> Iterator[np.ndarray]:
    """The blocks' tokens in order, read ``workers`` at a time (at most twice that many held)."""
    with ThreadPoolExecutor(max_workers=workers) as pool:
        pending: deque = deque()
        for block in blocks:
            pending.append(pool.submit(reader.read_block, block))
            if len(pending) >= 2 * workers:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()


def packing_report(
    reader: DatasetReader,
    seq_lens: Sequence[int],
    *,
    blocks: int | None = None,
    workers: int = 4,
    progress: Callable[[int], None] | None = None,
) -> PackingReport:
    """Count how ``concat`` and ``best_fit`` cut the documents of the dataset's blocks.

    Args:
        reader: the opened dataset.
        seq_lens: the seq_lens to lay out rows at (each block is read once).
        blocks: how many blocks to read, spread evenly over the dataset
            (:func:`spread_blocks`); None: all of them.
        workers: blocks read and decoded at once.
        progress: called with 1 after each block.

    Raises:
        ConfigError: no seq_len, a seq_len below 1, or ``blocks`` below 1.
    """
    lengths = list(dict.fromkeys(int(v) for v in seq_lens))
    if not lengths or min(lengths) < 1:
        raise ConfigError(f"the packing report needs seq_lens >= 1 (got {list(seq_lens)})")
    chosen = spread_blocks(reader.manifest.num_blocks, blocks)
    eos = int(reader.manifest.tokenizer.eos_id)
    counts = {length: {p: CutCounts() for p in PACKINGS} for length in lengths}
    for tokens in _blocks_ahead(reader, chosen, max(1, workers)):
        for length in lengths:
            for packing in PACKINGS:
                counts[length][packing] += cut_counts(tokens, block_rows(packing, tokens, length, eos), eos)
        if progress is not None:
            progress(1)
    return PackingReport(url=reader.url, num_blocks=reader.manifest.num_blocks, blocks=tuple(chosen), counts=counts)
