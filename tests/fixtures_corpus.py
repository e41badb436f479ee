"""Shared corpus fixtures: real text (the Python stdlib sources on this
machine), a small BPE tokenizer trained on it, and small written datasets.

Loaded as a pytest plugin by tests/conftest.py. Everything is session scoped
and deterministic: the same Python install gives the same files in the same
order, so the same datasets byte for byte.
"""

from __future__ import annotations

import json
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

CORPUS_STRIDE = 7
CORPUS_MAX_FILE_BYTES = 64 * 1024
BPE_VOCAB_SIZE = 2000
BPE_TRAIN_FILES = 60
EOS_TOKEN = "<|endoftext|>"
SMALL_DATASET_FILES = 40
SMALL_BLOCK_TOKENS = 4097
SMALL_BLOCKS_PER_SHARD = 4


@dataclass(frozen=True)
class StdlibCorpus:
    """A copy of a deterministic subset of the stdlib ``.py`` sources.

    Attributes:
        root: folder holding the copies, flat, named so that sorting the paths
            keeps the corpus order (``0000_abc.py``, ``0001_...``).
        files: the copies, in corpus order.
        texts: each file's text (valid UTF-8, non-empty), in corpus order.
        jsonl: one ``{"text": ..., "path": ...}`` line per file, same order.
        glob: a glob that matches exactly ``files``.
        num_bytes: total UTF-8 bytes of ``texts``.
    """

    root: Path
    files: tuple[Path, ...]
    texts: tuple[str, ...]
    jsonl: Path
    glob: str
    num_bytes: int


@dataclass(frozen=True)
class WrittenDataset:
    """A dataset written by a fixture.

    Attributes:
        url: the dataset root (a local folder path as a string).
        manifest: its loaded ``Manifest``.
        sources: the input files, in input order.
        texts: each input document's text, in input order.
        tokenizer: the spec it was written with (``bytes`` or ``hf:...``).
        summary: the ``WriteSummary`` the writer returned.
    """

    url: str
    manifest: Any
    sources: tuple[Path, ...]
    texts: tuple[str, ...]
    tokenizer: str
    summary: Any


def select_stdlib_files() -> list[tuple[str, bytes]]:
    """Every CORPUS_STRIDE-th stdlib ``.py`` file (sorted by relative path) that
    is non-empty valid UTF-8 of at most CORPUS_MAX_FILE_BYTES."""
    root = Path(sysconfig.get_paths()["stdlib"])
    candidates = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if "site-packages" in rel.split("/") or not path.is_file():
            continue
        data = path.read_bytes()
        if not 0 < len(data) <= CORPUS_MAX_FILE_BYTES:
            continue
        try:
            data.decode("utf-8")
        except UnicodeDecodeError:
            continue
        candidates.append((rel, data))
    return candidates[::CORPUS_STRIDE]


@pytest.fixture(scope="session")
def stdlib_corpus(tmp_path_factory: pytest.TempPathFactory) -> StdlibCorpus:
    """About 230 stdlib source files, 2.5 MB, copied flat into a temp folder."""
    root = tmp_path_factory.mktemp("stdlib_corpus")
    files, texts = [], []
    for i, (rel, data) in enumerate(select_stdlib_files()):
        path = root / f"{i:04d}_{rel.replace('/', '_')}"
        path.write_bytes(data)
        files.append(path)
        texts.append(data.decode("utf-8"))
    jsonl = tmp_path_factory.mktemp("stdlib_jsonl") / "corpus.jsonl"
    with jsonl.open("w", encoding="utf-8") as out:
        for path, text in zip(files, texts):
            out.write(json.dumps({"text": text, "path": path.name}) + "\n")
    return StdlibCorpus(
        root=root,
        files=tuple(files),
        texts=tuple(texts),
        jsonl=jsonl,
        glob=str(root / "*.py"),
        num_bytes=sum(len(t.encode("utf-8")) for t in texts),
    )


@pytest.fixture(scope="session")
def bpe_tokenizer_json(stdlib_corpus: StdlibCorpus, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A byte-level BPE (vocab BPE_VOCAB_SIZE, special ``<|endoftext|>``) trained
    on the first BPE_TRAIN_FILES corpus files, saved as ``tokenizer.json``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=BPE_VOCAB_SIZE,
        special_tokens=[EOS_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(stdlib_corpus.texts[:BPE_TRAIN_FILES], trainer=trainer)
    path = tmp_path_factory.mktemp("bpe") / "tokenizer.json"
    tokenizer.save(str(path))
    return path


def write_small_dataset(
    corpus: StdlibCorpus, out: Path, tokenizer: str, *, num_files: int = SMALL_DATASET_FILES
) -> WrittenDataset:
    """Write the first ``num_files`` corpus files with small blocks and shards."""
    from zephon_stream import Manifest, write_dataset

    sources = corpus.files[:num_files]
    summary = write_dataset(
        [str(p) for p in sources],
        str(out),
        tokenizer=tokenizer,
        block_tokens=SMALL_BLOCK_TOKENS,
        blocks_per_shard=SMALL_BLOCKS_PER_SHARD,
        progress=False,
    )
    return WrittenDataset(
        url=str(out),
        manifest=Manifest.load(str(out)),
        sources=tuple(sources),
        texts=corpus.texts[:num_files],
        tokenizer=tokenizer,
        summary=summary,
    )


@pytest.fixture(scope="session")
def small_dataset(stdlib_corpus: StdlibCorpus, tmp_path_factory: pytest.TempPathFactory) -> WrittenDataset:
    """40 corpus files (~310 kB) written with the ``bytes`` tokenizer,
    block_tokens 4097 and 4 blocks a shard: about 77 blocks in 20 shards."""
    return write_small_dataset(stdlib_corpus, tmp_path_factory.mktemp("small_dataset"), "bytes")


@pytest.fixture(scope="session")
def small_bpe_dataset(
    stdlib_corpus: StdlibCorpus, bpe_tokenizer_json: Path, tmp_path_factory: pytest.TempPathFactory
) -> WrittenDataset:
    """The same 40 files written with the BPE fixture tokenizer (uint16 tokens),
    block_tokens 4097 and 4 blocks a shard."""
    return write_small_dataset(stdlib_corpus, tmp_path_factory.mktemp("small_bpe_dataset"), f"hf:{bpe_tokenizer_json}")


@pytest.fixture(scope="session")
def definitions_dataset(
    stdlib_corpus: StdlibCorpus, bpe_tokenizer_json: Path, tmp_path_factory: pytest.TempPathFactory
) -> WrittenDataset:
    """The first 40 corpus files cut at top-level definitions (about 1,400
    documents from a line to a few thousand tokens), one JSONL record each,
    written with the BPE fixture tokenizer, block_tokens 4097 and 4 blocks a shard."""
    from benchmarks.bench_packing import split_at_definitions
    from zephon_stream import Manifest, write_dataset

    texts = tuple(d for text in stdlib_corpus.texts[:SMALL_DATASET_FILES] for d in split_at_definitions(text))
    out = tmp_path_factory.mktemp("definitions_dataset")
    jsonl = out.parent / f"{out.name}.jsonl"
    jsonl.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts), encoding="utf-8")
    summary = write_dataset(
        str(jsonl),
        str(out),
        tokenizer=f"hf:{bpe_tokenizer_json}",
        block_tokens=SMALL_BLOCK_TOKENS,
        blocks_per_shard=SMALL_BLOCKS_PER_SHARD,
        progress=False,
    )
    return WrittenDataset(
        url=str(out),
        manifest=Manifest.load(str(out)),
        sources=(jsonl,),
        texts=texts,
        tokenizer=f"hf:{bpe_tokenizer_json}",
        summary=summary,
    )
