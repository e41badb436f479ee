"""The writer streams: its memory stays near a shard plus the chunks in flight,
far below the size of the corpus."""

from __future__ import annotations

import json
import tracemalloc

from zephon_stream import write_dataset


def test_peak_memory_is_a_fraction_of_the_corpus(stdlib_corpus, tmp_path):
    big = tmp_path / "big.jsonl"
    with big.open("w", encoding="utf-8") as out:
        # 12 copies (31 MB): the writer's peak, 7.2-7.7 MB, does not grow
        # with the corpus (the same with 6), and at 6 it sat at the bound.
        for _ in range(12):
            for text in stdlib_corpus.texts:
                out.write(json.dumps({"text": text}) + "\n")
    input_bytes = big.stat().st_size
    tracemalloc.start()
    try:
        summary = write_dataset(
            str(big), str(tmp_path / "out"), tokenizer="bytes", block_tokens=65537, blocks_per_shard=8, progress=False
        )
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    raw_token_bytes = summary.num_tokens * 2
    assert summary.num_shards > 40 and raw_token_bytes > 2 * input_bytes * 0.9
    # Holding the corpus or its tokens would need >= input_bytes; the
    # writer holds a shard (1 MiB raw here) plus the chunks of 256 Ki chars in
    # flight with their token arrays.
    assert peak < input_bytes / 2, f"peak {peak:,} bytes for {input_bytes:,} bytes of input"
