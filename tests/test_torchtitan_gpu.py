"""ZephonDataLoader with ``device="cuda"``: ``input`` and ``positions`` arrive on
the GPU from the pinned ring, copied narrow and non-blocking on a side stream
that overlaps the consumer's work; ``labels`` stay a pinned CPU tensor, as
TorchTitan 0.3.0's trainer needs. Skipped without CUDA (tools/gpu_check.sh
runs it on a GPU machine)."""

from __future__ import annotations

import time

import pytest
import torch

pytest.importorskip("torchtitan", reason="needs the [torchtitan] extra")
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

from titan_forms import trainer_keywords  # noqa: E402
from zephon_stream.integrations.torchtitan import ZephonDataLoader  # noqa: E402
from zephon_stream.loader.delivery.device import MAX_HELD_BATCHES, PENDING_RELEASE_SLOTS  # noqa: E402

# About 2.5-5 s of GPU time at 1-2 GHz: long enough that copies finishing
# while it runs cannot be a timing accident.
_SLEEP_CYCLES = 5_000_000_000


def build(config: ZephonDataLoader.Config) -> ZephonDataLoader:
    return config.build(dp_world_size=1, dp_rank=0, tokenizer=None, **trainer_keywords(256, 8))


def test_cuda_batches_come_from_pinned_buffers_over_a_side_stream(small_bpe_dataset):
    cpu_config = ZephonDataLoader.Config(dataset_path=small_bpe_dataset.url, seed=1)
    with build(cpu_config) as cpu_loader:
        batches = iter(cpu_loader)
        expected = [next(batches) for _ in range(7)]

    gpu_config = ZephonDataLoader.Config(dataset_path=small_bpe_dataset.url, seed=1, device="cuda", prefetch_steps=3)
    with build(gpu_config) as loader:
        delivery = loader.streaming_loader.delivery
        assert delivery.slots_pinned(), "host staging buffers must be page-locked"
        consumer = torch.cuda.current_stream()
        assert delivery.copy_stream != consumer, "copies must run on a side stream"

        batches = iter(loader)
        got = [next(batches)]
        torch.cuda.synchronize()
        # Occupy the consumer stream. Taking three queued batches must not block
        # the host; it frees queue room, so the producer assembles and copies
        # the next three while the consumer stream is still busy.
        torch.cuda._sleep(_SLEEP_CYCLES)
        started = time.perf_counter()
        got += [next(batches) for _ in range(3)]
        host_s = time.perf_counter() - started
        time.sleep(0.3)
        delivery.copy_stream.synchronize()
        consumer_busy = not consumer.query()
        got += [next(batches) for _ in range(3)]
        torch.cuda.synchronize()
        # The first ones are views of the pinned ring; the test keeps all
        # seven, so the loader copied the labels of the rest.
        views = MAX_HELD_BATCHES + PENDING_RELEASE_SLOTS
        assert [labels.is_pinned() for _, labels in got] == [True] * views + [False] * (7 - views)

    assert consumer_busy, "the copies waited for the consumer stream: no overlap"
    assert host_s < 0.5, f"taking 3 prefetched batches blocked the host for {host_s:.3f}s"
    for (want_dict, want_labels), (got_dict, got_labels) in zip(expected, got, strict=True):
        for key in ("input", "positions"):
            assert got_dict[key].is_cuda and got_dict[key].device.index == torch.cuda.current_device()
            assert torch.equal(got_dict[key].cpu(), want_dict[key])
        assert got_labels.device.type == "cpu" and torch.equal(got_labels, want_labels)
    # close() unregistered the ring; the views the test kept still read
    # their batches (compared above) from memory that is no longer pinned.
    assert not any(labels.is_pinned() for _, labels in got)
