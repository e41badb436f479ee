"""The chaos check at CI scale (benchmarks/chaos.py runs it larger): the writer
and the loader through a proxy injecting 20% faults give exactly what they
give on a clean endpoint, with the faults visible in the counters."""

from __future__ import annotations

import hashlib

import pytest

from zephon_stream import StreamingLoader, write_dataset
from zephon_stream.storage import open_store

RATES_20 = {"error_500": 0.04, "error_503": 0.04, "reset": 0.04, "truncate": 0.04, "stall": 0.02, "slow_body": 0.02}
FILES = 12


def object_digests(url: str, options: dict) -> dict[str, str]:
    with open_store(url, options) as store:
        return {name: hashlib.sha256(store.read(name)).hexdigest() for name in store.list()}


def step_digests(url: str, options: dict, steps: int) -> tuple[list[str], dict]:
    with StreamingLoader(url, seq_len=128, local_batch_size=8, storage_options=options, max_steps=steps) as loader:
        digests = [hashlib.sha256(step["input"].numpy().tobytes() + step["labels"].numpy().tobytes()).hexdigest()
                   for step in loader]
        return digests, loader.stats()


@pytest.mark.slow
def test_writer_and_loader_through_20_percent_faults_lose_nothing(stdlib_corpus, s3_bucket, fault_proxy):
    clean = s3_bucket.storage_options
    with open_store(s3_bucket.url("raw"), clean) as raw:
        for path in stdlib_corpus.files[:FILES]:
            raw.write_atomic(path.name, path.read_bytes())
    settings = dict(tokenizer="bytes", block_tokens=2049, blocks_per_shard=4, progress=False)
    write_dataset([s3_bucket.url("raw/*.py")], s3_bucket.url("clean"), storage_options=clean, **settings)

    proxy = fault_proxy(rates=RATES_20, seed=20, stall_s=0.2, slow_body_s=0.05)
    faulty = s3_bucket.options_via(proxy.endpoint_url)
    write_dataset([s3_bucket.url("raw/*.py")], s3_bucket.url("faulty"), storage_options=faulty, **settings)
    after_writer = proxy.counts()
    assert object_digests(s3_bucket.url("faulty"), clean) == object_digests(s3_bucket.url("clean"), clean)

    expected, _ = step_digests(s3_bucket.url("clean"), clean, steps=80)
    got, stats = step_digests(s3_bucket.url("clean"), faulty, steps=80)
    assert len(expected) == 80 and got == expected
    loader_counts = {k: v - after_writer[k] for k, v in proxy.counts().items()}
    writer_faults = sum(v for k, v in after_writer.items() if k != "requests")
    loader_faults = sum(v for k, v in loader_counts.items() if k != "requests")
    assert writer_faults > 0 and loader_faults > 0, "no fault hit a request; the test proves nothing"
    # NOTE: a 5xx or truncated body costs a counted retry (a reset may be
    # absorbed by aiohttp's own idempotent retry, a stall only delays). Not an
    # exact count: a prefetch read cut short by close() is never retried.
    if loader_counts["error_500"] + loader_counts["error_503"] + loader_counts["truncate"]:
        assert stats["retries"] > 0
