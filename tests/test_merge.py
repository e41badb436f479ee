"""Distributed conversion: ranks of a launcher each write a part; merge joins them.

The merged dataset must decode to the token stream and document index one
process writes from the same inputs, with its shards left where the ranks
wrote them.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from zephon_stream.errors import ConfigError, ManifestError, ObjectMissingError, PathEscapeError
from zephon_stream.format.docindex import DocIndex
from zephon_stream.format.manifest import Manifest, compute_fingerprint
from zephon_stream.reader import DatasetReader
from zephon_stream.storage import expand_inputs, open_store
from zephon_stream.writer.api import write_dataset
from zephon_stream.writer.distributed import launcher_rank, part_name, rank_share
from zephon_stream.writer.merge import merge_parts

BLOCK_TOKENS = 4097
BLOCKS_PER_SHARD = 4
NUM_FILES = 30
_LAUNCHER_VARS = (
    "RANK",
    "WORLD_SIZE",
    "SLURM_PROCID",
    "SLURM_NTASKS",
    "SLURM_ARRAY_TASK_ID",
    "SLURM_ARRAY_TASK_COUNT",
    "SLURM_ARRAY_TASK_MIN",
)


def token_stream(url: str, storage_options: dict | None = None) -> np.ndarray:
    with DatasetReader.open(url, storage_options) as reader:
        return reader.read_tokens(0, reader.manifest.num_tokens)


def documents(url: str, storage_options: dict | None = None) -> list[tuple[int, str, int]]:
    """Every document as (global token offset, source path, record number), in order."""
    manifest = Manifest.load(url, storage_options)
    found = []
    with open_store(url, storage_options) as store:
        for i, shard in enumerate(manifest.shards):
            index = DocIndex.from_bytes(
                store.read(shard.index_path), where=shard.index_path, shard_num_tokens=shard.num_tokens
            )
            base = int(manifest.shard_token_offsets[i])
            for start, source, record in zip(index.doc_starts, index.doc_source, index.doc_record):
                found.append((base + int(start), index.sources[int(source)], int(record)))
    return found


def assert_same_dataset_content(merged_url: str, single_url: str, storage_options: dict | None = None) -> None:
    merged = Manifest.load(merged_url, storage_options)
    single = Manifest.load(single_url, storage_options)
    assert merged.num_tokens == single.num_tokens
    assert merged.num_documents == single.num_documents
    assert [s.to_obj() for s in merged.sources] == [s.to_obj() for s in single.sources]
    assert merged.tokenizer == single.tokenizer
    np.testing.assert_array_equal(token_stream(merged_url, storage_options), token_stream(single_url, storage_options))
    assert documents(merged_url, storage_options) == documents(single_url, storage_options)
    assert merged.fingerprint == compute_fingerprint(
        dtype=merged.dtype,
        tokenizer_fingerprint=merged.tokenizer.fingerprint,
        block_tokens=merged.block_tokens,
        shards=[(s.num_tokens, s.sha256) for s in merged.shards],
    )


def test_rank_shares_are_contiguous_balanced_and_cover_the_inputs():
    inputs = [f"f{i:02d}" for i in range(11)]
    for world_size in (1, 2, 3, 4, 11):
        shares = [rank_share(inputs, rank, world_size) for rank in range(world_size)]
        assert [x for share in shares for x in share] == inputs
        assert max(map(len, shares)) - min(map(len, shares)) <= 1
    with pytest.raises(ConfigError, match="12 ranks but only 11 input files"):
        rank_share(inputs, 0, 12)


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, None),
        ({"RANK": "2", "WORLD_SIZE": "3"}, (2, 3)),
        ({"SLURM_ARRAY_TASK_ID": "7", "SLURM_ARRAY_TASK_MIN": "5", "SLURM_ARRAY_TASK_COUNT": "4"}, (2, 4)),
        ({"SLURM_PROCID": "1", "SLURM_NTASKS": "2"}, (1, 2)),
        ({"RANK": "0", "WORLD_SIZE": "2", "SLURM_PROCID": "5", "SLURM_NTASKS": "8"}, (0, 2)),
    ],
)
def test_launcher_rank_reads_torchrun_and_slurm_variables(env, expected):
    found = launcher_rank(env)
    assert (None if found is None else (found.rank, found.world_size)) == expected


def test_launcher_rank_refuses_a_rank_outside_the_world():
    with pytest.raises(ConfigError, match=r"rank 3 is outside \[0, 3\)"):
        launcher_rank({"RANK": "3", "WORLD_SIZE": "3"})
    with pytest.raises(ConfigError, match="RANK='x' is not an integer"):
        launcher_rank({"RANK": "x", "WORLD_SIZE": "3"})


def _write_parts(files: list[str], out: Path, world_size: int, tokenizer: str = "bytes", **options) -> list[str]:
    urls = []
    for rank in range(world_size):
        url = f"{out}/{part_name(rank, world_size)}"
        write_dataset(
            rank_share(files, rank, world_size),
            url,
            tokenizer=tokenizer,
            block_tokens=BLOCK_TOKENS,
            blocks_per_shard=BLOCKS_PER_SHARD,
            progress=False,
            **options,
        )
        urls.append(url)
    return urls


def test_merge_refuses_a_part_outside_the_output_root(stdlib_corpus, tmp_path):
    files = [str(p) for p in stdlib_corpus.files[:4]]
    parts = _write_parts(files, tmp_path / "elsewhere", 2)
    with pytest.raises(PathEscapeError, match="is not inside the output") as info:
        merge_parts(parts, str(tmp_path / "merged"))
    assert "elsewhere/part-00000-of-00002" in str(info.value)
    assert not (tmp_path / "merged" / "manifest").exists()


def test_merge_refuses_parts_written_with_different_tokenizers(stdlib_corpus, bpe_tokenizer_json, tmp_path):
    files = [str(p) for p in stdlib_corpus.files[:2]]
    for rank, tokenizer in enumerate(("bytes", f"hf:{bpe_tokenizer_json}")):
        write_dataset([files[rank]], tmp_path / part_name(rank, 2), tokenizer=tokenizer, progress=False)
    with pytest.raises(ManifestError, match="part part-00001-of-00002: .*differs from part part-00000-of-00002"):
        merge_parts([], str(tmp_path))


def test_merge_without_parts_names_the_missing_rank(stdlib_corpus, tmp_path):
    files = [str(p) for p in stdlib_corpus.files[:6]]
    _write_parts(files, tmp_path, 3)
    (tmp_path / part_name(1, 3) / "manifest").unlink()
    with pytest.raises(ObjectMissingError, match=r"parts of ranks \[1\] of 3 have no manifest"):
        merge_parts([], str(tmp_path))


def test_merge_on_s3_matches_one_process(stdlib_corpus, bpe_tokenizer_json, s3_url, s3_options):
    files = [str(p) for p in stdlib_corpus.files[:NUM_FILES]]
    tokenizer = f"hf:{bpe_tokenizer_json}"
    single = s3_url("single")
    write_dataset(
        files,
        single,
        tokenizer=tokenizer,
        block_tokens=BLOCK_TOKENS,
        blocks_per_shard=BLOCKS_PER_SHARD,
        storage_options=s3_options,
        progress=False,
    )
    out = s3_url("merged")
    parts = _write_parts(files, out, 3, tokenizer=tokenizer, storage_options=s3_options)
    merged = merge_parts(parts, out, storage_options=s3_options)
    assert [s.path.split("/")[0] for s in merged.shards][0] == "part-00000-of-00003"
    assert_same_dataset_content(out, single, s3_options)
    # The shards stay where the ranks wrote them; only the manifest, its index objects and rejects are new.
    with open_store(out, s3_options) as store:
        new = sorted(p for p in store.list() if not p.startswith("part-"))
        assert [p for p in new if not p.startswith("index/")] == ["manifest", "rejects.jsonl"]
        assert sorted(p.split("-")[0] for p in new if p.startswith("index/")) == [
            "index/blocks",
            "index/shards",
            "index/sources",
        ]


def _cli(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "zephon_stream", *args], env=env, capture_output=True, text=True, timeout=300
    )


@pytest.mark.slow
def test_three_cli_ranks_and_merge_decode_like_one_process(stdlib_corpus, tmp_path):
    pattern = stdlib_corpus.glob
    common = [
        "--tokenizer",
        "bytes",
        "--block-tokens",
        str(BLOCK_TOKENS),
        "--blocks-per-shard",
        str(BLOCKS_PER_SHARD),
        "--no-progress",
    ]
    base_env = {k: v for k, v in os.environ.items() if k not in _LAUNCHER_VARS}

    single = tmp_path / "single"
    done = _cli(["write", pattern, "--output", str(single), *common], base_env)
    assert done.returncode == 0, done.stderr

    out = tmp_path / "merged"
    ranks = [
        subprocess.Popen(
            [sys.executable, "-m", "zephon_stream", "write", pattern, "--output", str(out), *common],
            env={**base_env, "RANK": str(rank), "WORLD_SIZE": "3"},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(3)
    ]
    for rank, process in enumerate(ranks):
        stdout, stderr = process.communicate(timeout=300)
        assert process.returncode == 0, stderr
        assert (out / part_name(rank, 3) / "manifest").exists()
    assert not (out / "manifest").exists()

    done = _cli(["merge", "--output", str(out)], base_env)
    assert done.returncode == 0, done.stderr
    assert "merged 3 parts" in done.stdout
    assert_same_dataset_content(str(out), str(single))
    # Every rank wrote a different contiguous third of the inputs.
    part_sources = [[s.path for s in Manifest.load(str(out / part_name(r, 3))).sources] for r in range(3)]
    all_files = expand_inputs([pattern])
    assert part_sources == [rank_share(all_files, r, 3) for r in range(3)]

    again = _cli(["merge", "--output", str(out)], base_env)
    assert again.returncode == 0, again.stderr

    done = _cli(["verify", str(out)], base_env)
    assert done.returncode == 0, done.stdout + done.stderr


def test_merged_dataset_streams_the_samples_of_every_part(stdlib_corpus, tmp_path):
    from zephon_stream import StreamingLoader

    seq_len, batch = 64, 4
    _write_parts([str(p) for p in stdlib_corpus.files[:12]], tmp_path, 3)
    manifest = merge_parts([], str(tmp_path))
    samples_per_block = (manifest.block_token_counts() - 1) // seq_len
    # Every part ends in a short block, so the merged dataset has short blocks mid-stream.
    short_inside = {
        int(manifest.shard_first_block[i + 1]) - 1
        for i, s in enumerate(manifest.shards[:-1])
        if s.num_tokens % BLOCK_TOKENS
    }
    assert short_inside

    seen = set()
    with (
        StreamingLoader(str(tmp_path), seq_len=seq_len, local_batch_size=batch, rank=0, world_size=1) as loader,
        DatasetReader.open(str(tmp_path)) as reader,
    ):
        steps = int(samples_per_block.sum()) // loader.lanes * loader.lanes // batch
        for step, got in zip(range(steps), loader):
            _, blocks, samples = loader.order.sample_at(np.arange(step * batch, (step + 1) * batch))
            for row, (block, sample) in enumerate(zip(blocks.tolist(), samples.tolist())):
                tokens = reader.read_block(block)[sample * seq_len : sample * seq_len + seq_len + 1].astype(np.int64)
                np.testing.assert_array_equal(got["input"][row].numpy(), tokens[:-1])
                np.testing.assert_array_equal(got["labels"][row].numpy(), tokens[1:])
                seen.add((block, sample))
    assert len(seen) == steps * batch
    assert {block for block, _ in seen} & short_inside
