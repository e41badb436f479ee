"""The tokenizer pool: results in submission order, worker processes that do
not start their own tokenizer thread pools, id range checks, and the inputs
that tokenize in the writer's own process (the same bytes either way)."""

from __future__ import annotations

import gzip
import os
from pathlib import Path

import numpy as np
import pytest

from zephon_stream import write_dataset
from zephon_stream.errors import TokenizerError
from zephon_stream.writer.config import DEFAULT_POOL_MIN_INPUT_BYTES
from zephon_stream.writer.pool import TokenizePool, encode_chunk
from zephon_stream.writer.tokenizers import BytesTokenizer


def dataset_files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


class EnvProbeTokenizer(BytesTokenizer):
    """Encodes each text as the worker's TOKENIZERS_PARALLELISM and process id."""

    def encode_batch(self, texts):
        probe = f"{os.environ.get('TOKENIZERS_PARALLELISM', 'unset')} {os.getpid()}"
        return [list(probe.encode()) for _ in texts]

    def encode_documents(self, texts):
        ids = self.encode_batch(texts)
        lengths = np.array([len(i) + 1 for i in ids], dtype=np.int64)
        return np.array([t for i in ids for t in i + [self.eos_id]], dtype=np.int64), lengths


class OutOfRangeTokenizer(BytesTokenizer):
    def encode_documents(self, texts):
        return np.array([300, self.eos_id], dtype=np.int64), np.array([2], dtype=np.int64)


@pytest.mark.slow
def test_worker_processes_disable_tokenizers_parallelism(monkeypatch):
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "true")  # inherited by the children, then overridden
    with TokenizePool(tokenizer=EnvProbeTokenizer(), dtype=np.dtype("<u2"), workers=2, max_in_flight=4) as pool:
        for i in range(4):
            pool.submit([f"chunk {i}"], tag=i)
        probes = []
        for i in range(4):
            tokens, lengths, tag = pool.take()
            assert tag == i
            probes.append(tokens[:-1].astype(np.uint8).tobytes().decode())
    assert all(p.split()[0] == "false" for p in probes)
    assert all(int(p.split()[1]) != os.getpid() for p in probes)


@pytest.mark.slow
def test_results_come_back_in_submission_order_with_several_workers():
    texts = [f"document number {i} " * (1 + (i * 7919) % 200) for i in range(300)]
    chunks = [texts[i : i + 7] for i in range(0, len(texts), 7)]
    got = []
    with TokenizePool(tokenizer=BytesTokenizer(), dtype=np.dtype("<u2"), workers=3, max_in_flight=8) as pool:
        for n, chunk in enumerate(chunks):
            while pool.full:
                got.append(pool.take())
            pool.submit(chunk, tag=n)
        while len(pool):
            got.append(pool.take())
    assert [tag for _, _, tag in got] == list(range(len(chunks)))
    flat = np.concatenate([tokens for tokens, _, _ in got])
    want, _ = BytesTokenizer().encode_documents(texts)
    assert np.array_equal(flat, want)


def test_in_process_pool_keeps_the_callers_environment(monkeypatch):
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "true")
    with TokenizePool(tokenizer=EnvProbeTokenizer(), dtype=np.dtype("<u2"), workers=1, max_in_flight=2) as pool:
        pool.submit(["x"], tag=None)
        tokens, _, _ = pool.take()
    assert tokens[:-1].astype(np.uint8).tobytes().decode() == f"true {os.getpid()}"


def test_ids_outside_the_vocabulary_are_refused():
    with pytest.raises(TokenizerError, match="produced id 300, outside \\[0, 257\\)"):
        encode_chunk(OutOfRangeTokenizer(), ["a"], np.dtype("<u2"))


@pytest.mark.slow
def test_small_inputs_tokenize_in_process_and_write_the_bytes_of_the_worker_processes(
    stdlib_corpus, bpe_tokenizer_json, tmp_path
):
    files = [str(p) for p in stdlib_corpus.files[:40]]
    size = sum(os.path.getsize(f) for f in files)
    spec = f"hf:{bpe_tokenizer_json}"
    settings = dict(tokenizer=spec, workers=2, block_tokens=4097, blocks_per_shard=4, progress=False)
    # An input of exactly the floor starts the processes; one byte less does not.
    pooled = write_dataset(files, str(tmp_path / "pooled"), pool_min_input_bytes=size, **settings)
    small = write_dataset(files, str(tmp_path / "small"), pool_min_input_bytes=size + 1, **settings)
    assert (pooled.tokenizer_processes, small.tokenizer_processes) == (2, 0)
    assert len(dataset_files(tmp_path / "pooled")) > 4
    assert dataset_files(tmp_path / "small") == dataset_files(tmp_path / "pooled")
    # A compressed input is small on disk but not in text: its processes start.
    gz = tmp_path / "corpus.jsonl.gz"
    gz.write_bytes(gzip.compress(stdlib_corpus.jsonl.read_bytes(), mtime=0))
    compressed = write_dataset(str(gz), str(tmp_path / "gz"), pool_min_input_bytes=gz.stat().st_size + 1, **settings)
    assert compressed.tokenizer_processes == 2 and compressed.num_documents == len(stdlib_corpus.files)


@pytest.mark.slow
def test_bytes_tokenizer_starts_no_worker_processes_unless_forced(stdlib_corpus, tmp_path):
    settings = dict(tokenizer="bytes", workers=3, block_tokens=65537, blocks_per_shard=2, progress=False)
    default = write_dataset(stdlib_corpus.glob, str(tmp_path / "default"), **settings)
    forced = write_dataset(stdlib_corpus.glob, str(tmp_path / "forced"), pool_min_input_bytes=0, **settings)
    assert stdlib_corpus.num_bytes > DEFAULT_POOL_MIN_INPUT_BYTES / 4
    assert (default.tokenizer_processes, forced.tokenizer_processes) == (0, 3)
    assert dataset_files(tmp_path / "default") == dataset_files(tmp_path / "forced")
