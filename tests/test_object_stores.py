"""The user journeys on real object-store servers on loopback: S3 on SeaweedFS,
GCS on fake-gcs-server, Azure Blob on Azurite. Each step's data must equal the
same run on local disk: the written shards byte for byte, the streamed batches,
``verify``, ``which``, and a torchrun job SIGKILLed and resumed at another
world size."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from fixtures_corpus import SMALL_BLOCK_TOKENS, SMALL_BLOCKS_PER_SHARD, SMALL_DATASET_FILES
from loader_reference import run_step_hashes
from tools.reliability import crash
from tools.reliability.common import committed_objects, step_hashes
from zephon_stream import Manifest, StreamingLoader, write_dataset
from zephon_stream.cli import main
from zephon_stream.reader import DatasetReader
from zephon_stream.storage import copy_dataset, open_store
from zephon_stream.writer.distributed import part_name, rank_share
from zephon_stream.writer.merge import merge_parts

SEQ_LEN = 64
BATCH = 8
STEPS = 12
MiB = 2**20


def local_objects(root: str) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(Path(root).rglob("*")) if p.is_file()}


def normalized(samples: list[dict]) -> list[dict]:
    """``which`` samples without the dataset URL, each source by file name only."""
    return [
        {**s, "dataset": None, "documents": [{**d, "source": d["source"].rsplit("/", 1)[-1]} for d in s["documents"]]}
        for s in samples
    ]


def stream(url: str, storage_options: dict | None, steps: int = STEPS) -> list[str]:
    with StreamingLoader(
        url, seq_len=SEQ_LEN, local_batch_size=BATCH, seed=3, storage_options=storage_options
    ) as loader:
        return step_hashes(loader, steps)


def test_cli_write_stream_verify_which_match_local_disk(object_store, small_dataset, capsys):
    """Written with the CLI from inputs on the store to the store, the dataset
    has the local run's shards byte for byte and its fingerprint; it streams the
    local batches, verifies clean and traces samples to the same documents."""
    url = object_store.url("ds")
    options = object_store.cli_options()
    with open_store(object_store.url("raw"), object_store.storage_options) as raw:
        for path in small_dataset.sources[:SMALL_DATASET_FILES]:
            raw.write_atomic(path.name, path.read_bytes())
    args = ["write", object_store.url("raw/*.py"), "--output", url, "--tokenizer", "bytes",
            "--block-tokens", str(SMALL_BLOCK_TOKENS), "--blocks-per-shard", str(SMALL_BLOCKS_PER_SHARD),
            "--no-progress", *options]  # fmt: skip
    assert main(args) == 0
    remote = Manifest.load(url, object_store.storage_options)
    assert remote.fingerprint == small_dataset.manifest.fingerprint
    local = local_objects(small_dataset.url)
    got = committed_objects(url, object_store.storage_options)
    # The .idx sidecars name each document's source: here an object URL.
    shards = [p for p in local if p.endswith(".zst")]
    assert shards and {p: got.get(p) for p in shards} == {p: local[p] for p in shards}

    assert stream(url, object_store.storage_options) == stream(small_dataset.url, None)

    capsys.readouterr()
    assert main(["verify", url, *options]) == 0
    assert "OK" in capsys.readouterr().out

    which = ["--step", "3", "--seq-len", str(SEQ_LEN), "--global-batch", str(BATCH), "--json"]
    assert main(["which", url, *which, *options]) == 0
    remote_samples = json.loads(capsys.readouterr().out)["samples"]
    assert main(["which", small_dataset.url, *which]) == 0
    local_samples = json.loads(capsys.readouterr().out)["samples"]
    assert len(remote_samples) == BATCH
    assert normalized(remote_samples) == normalized(local_samples)


@pytest.mark.parametrize("object_store", ["azure"], indirect=True)
def test_abfs_urls_reach_the_same_blobs_as_az(object_store, small_dataset):
    url = object_store.url("ds")
    copy_dataset(small_dataset.url, url, dst_options=object_store.storage_options)
    abfs = object_store.url("ds", scheme="abfs")
    assert stream(abfs, object_store.storage_options, steps=4) == stream(small_dataset.url, None, steps=4)


@pytest.mark.parametrize("object_store", ["seaweedfs"], indirect=True)
def test_shard_over_the_multipart_threshold_is_uploaded_in_parts_and_reads_back_identically(
    object_store, stdlib_corpus, tmp_path
):
    # s3fs sends an object of two parts or more as a multipart upload;
    # the part size follows s3fs's default_block_size, and S3 (SeaweedFS too)
    # refuses parts under 5 MiB. 16 copies of the corpus give a ~11 MB shard.
    corpus = tmp_path / "corpus.txt"
    with corpus.open("wb") as out:
        for _ in range(16):
            for path in stdlib_corpus.files:
                out.write(path.read_bytes())
    settings = {"tokenizer": "bytes", "blocks_per_shard": 64, "progress": False}
    local = tmp_path / "local"
    write_dataset([str(corpus)], str(local), **settings)
    options = {**object_store.storage_options, "default_block_size": 5 * MiB}
    url = object_store.url("big")
    write_dataset([str(corpus)], url, storage_options=options, **settings)

    manifest = Manifest.load(str(local))
    assert manifest.num_shards == 1 and manifest.shards[0].num_bytes > 2 * 5 * MiB
    shard = manifest.shards[0].path
    client = object_store.server.client()
    head = client.head_object(Bucket=object_store.bucket, Key=f"big/{shard}")
    client.close()
    # A multipart object's ETag is "<md5 of part md5s>-<number of parts>".
    assert head["ETag"].strip('"').endswith("-3"), head["ETag"]
    assert committed_objects(url, options) == local_objects(str(local))
    with DatasetReader.open(url, options) as remote, DatasetReader.open(str(local)) as disk:
        np.testing.assert_array_equal(
            remote.read_tokens(0, manifest.num_tokens), disk.read_tokens(0, manifest.num_tokens)
        )


@pytest.mark.parametrize("object_store", ["seaweedfs"], indirect=True)
def test_distributed_write_and_merge_match_one_local_process(object_store, small_dataset):
    files = [str(p) for p in small_dataset.sources]
    out = object_store.url("merged")
    options = object_store.storage_options
    parts = []
    for rank in range(3):
        part = f"{out}/{part_name(rank, 3)}"
        write_dataset(
            rank_share(files, rank, 3),
            part,
            tokenizer="bytes",
            block_tokens=SMALL_BLOCK_TOKENS,
            blocks_per_shard=SMALL_BLOCKS_PER_SHARD,
            storage_options=options,
            progress=False,
        )
        parts.append(part)
    merged = merge_parts(parts, out, storage_options=options)
    assert merged.num_tokens == small_dataset.manifest.num_tokens
    assert merged.num_documents == small_dataset.manifest.num_documents
    with DatasetReader.open(out, options) as remote, DatasetReader.open(small_dataset.url) as disk:
        n = merged.num_tokens
        np.testing.assert_array_equal(remote.read_tokens(0, n), disk.read_tokens(0, n))
    assert main(["verify", out, *object_store.cli_options()]) == 0


@pytest.mark.slow
@pytest.mark.torchrun
@pytest.mark.parametrize("object_store", ["seaweedfs"], indirect=True)
def test_torchrun_job_killed_resumes_at_another_world_size_on_the_store(
    object_store, small_dataset, tmp_path, monkeypatch
):
    """A torchrun job checkpointing with DCP, reading from the store, is SIGKILLed
    and resumed at another world size; every step before and after equals the
    single-process run, which equals the run on local disk."""
    url = object_store.url("ds")
    copy_dataset(small_dataset.url, url, dst_options=object_store.storage_options)
    # The ranks reach the server as a user's job would: through the
    # backend's standard environment variables.
    for name, value in object_store.env.items():
        monkeypatch.setenv(name, value)
    total_steps, resume_steps, seq_len, batch, seed = 10, 4, 256, 12, 11
    with (
        StreamingLoader(url, seq_len=seq_len, local_batch_size=batch, seed=seed) as remote,
        StreamingLoader(small_dataset.url, seq_len=seq_len, local_batch_size=batch, seed=seed) as local,
    ):
        assert step_hashes(remote, total_steps + resume_steps) == step_hashes(local, total_steps + resume_steps)
    result = crash.loader_kill_resume(
        data=url,
        work=tmp_path,
        runs=1,
        seed=seed,
        total_steps=total_steps,
        resume_steps=resume_steps,
        worlds=(1, 2),
        global_batch=batch,
        seq_len=seq_len,
    )
    assert [(r["from_world"] != r["to_world"]) for r in result["resumed"]] == [True]
    assert result["steps_checked"] >= resume_steps


@pytest.mark.parametrize("object_store", ["gcs", "azure"], indirect=True)
def test_state_saved_at_2_ranks_resumes_at_3_ranks_on_the_store(object_store, small_dataset):
    """Ranks as loaders in one process (the torchrun journey runs on SeaweedFS):
    a state taken at W = 2 loads at W = 3 and the global batches go on as the
    uninterrupted run on local disk reads them."""
    url = object_store.url("ds")
    options = object_store.storage_options
    copy_dataset(small_dataset.url, url, dst_options=options)
    seq_len, batch, seed, saved_at, after = 256, 12, 5, 5, 4

    def ranks(data: str, world: int, storage_options: dict | None) -> list[StreamingLoader]:
        return [
            StreamingLoader(
                data,
                seq_len=seq_len,
                local_batch_size=batch // world,
                seed=seed,
                rank=r,
                world_size=world,
                storage_options=storage_options,
                pipeline="threads",
            )
            for r in range(world)
        ]

    def run(loaders: list[StreamingLoader], steps: int) -> list[str]:
        try:
            return run_step_hashes(loaders, steps)
        finally:
            for loader in loaders:
                loader.close()

    expected = run(ranks(small_dataset.url, 1, None), saved_at + after)
    two = ranks(url, 2, options)
    assert run_step_hashes(two, saved_at) == expected[:saved_at]
    state = two[0].state_dict()
    assert state == two[1].state_dict()
    for loader in two:
        loader.close()
    three = ranks(url, 3, options)
    for loader in three:
        loader.load_state_dict(state)
    assert run(three, after) == expected[saved_at:]
