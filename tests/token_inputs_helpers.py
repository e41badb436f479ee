"""Writers of pre-tokenized inputs with the tools people use (numpy, pyarrow,
``datasets``), and a Megatron ``.bin``/``.idx`` pair built from the published
layout. Imported by the token-input tests."""

from __future__ import annotations

import gzip
import json
import struct
from pathlib import Path

import numpy as np

MEGATRON_MAGIC = b"MMIDIDX\x00\x00"
MEGATRON_CODES = {np.dtype("u1"): 1, np.dtype("i1"): 2, np.dtype("<i2"): 3, np.dtype("<i4"): 4, np.dtype("<i8"): 5,
                  np.dtype("<f8"): 6, np.dtype("<f4"): 7, np.dtype("<u2"): 8}  # fmt: skip


def megatron_index_bytes(
    sequence_lengths: list[int], document_index: list[int], *, dtype: np.dtype, version: int = 1
) -> bytes:
    """An ``.idx`` file: magic, version, dtype code, counts, lengths, pointers, document index."""
    dtype = np.dtype(dtype)
    lengths = np.asarray(sequence_lengths, dtype="<i4")
    pointers = np.concatenate([[0], np.cumsum(lengths.astype(np.int64))[:-1]]).astype("<i8") * dtype.itemsize
    pointers = pointers[: len(lengths)]
    head = MEGATRON_MAGIC + struct.pack("<QBQQ", version, MEGATRON_CODES[dtype], len(lengths), len(document_index))
    return head + lengths.tobytes() + pointers.tobytes() + np.asarray(document_index, dtype="<i8").tobytes()


def write_megatron(prefix: Path, docs: list[np.ndarray], *, dtype=np.uint16, sentences: int = 1) -> None:
    """``prefix.bin`` + ``prefix.idx``; each document split into up to ``sentences`` sequences."""
    dtype = np.dtype(dtype).newbyteorder("<")
    lengths, document_index = [], [0]
    for doc in docs:
        cuts = np.linspace(0, len(doc), min(sentences, max(len(doc), 1)) + 1).astype(int)
        lengths.extend(int(b - a) for a, b in zip(cuts[:-1], cuts[1:]))
        document_index.append(len(lengths))
    prefix.with_suffix(".bin").write_bytes(np.concatenate(docs).astype(dtype).tobytes() if docs else b"")
    prefix.with_suffix(".idx").write_bytes(megatron_index_bytes(lengths, document_index, dtype=dtype))


def write_parquet(path: Path, docs: list[np.ndarray], field: str = "input_ids") -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(
        pa.table({field: pa.array([d.tolist() for d in docs], type=pa.list_(pa.int32()))}), path, row_group_size=50
    )


def write_jsonl(path: Path, docs: list[np.ndarray], field: str = "input_ids") -> None:
    lines = "".join(json.dumps({field: d.tolist(), "n": len(d)}) + "\n" for d in docs).encode()
    path.write_bytes(gzip.compress(lines, mtime=0) if path.suffix == ".gz" else lines)


def write_datasets(path: Path, docs: list[np.ndarray], field: str = "input_ids") -> None:
    import datasets

    datasets.disable_progress_bars()
    datasets.Dataset.from_dict({field: [d.tolist() for d in docs]}).save_to_disk(str(path))


def with_eos(docs: list[np.ndarray], eos: int) -> list[np.ndarray]:
    return [np.append(d, eos).astype(d.dtype) for d in docs]


def token_stream(docs: list[np.ndarray], eos: int) -> np.ndarray:
    """What a dataset of ``docs`` must hold: each document, then EOS."""
    return np.concatenate(with_eos(docs, eos)) if docs else np.zeros(0, np.int64)
