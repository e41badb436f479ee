"""Device delivery on CUDA: the pinned ring, narrow copies on a side stream that
overlap compute on the consumer's stream, widened on the device, host labels
that stay intact under the consumer's non_blocking copies (close() included),
which GPU ``"cuda"`` means, and nothing left registered after close(). No CUDA
call here is meant to fail: an error left pending would surface in a later
test. Skipped without CUDA (tests/test_loader_device.py runs the decisions on CPU)."""

from __future__ import annotations

import pytest
import torch

from zephon_stream import StreamingLoader
from zephon_stream.loader.delivery.device import resolve_device
from zephon_stream.loader.delivery.widen import copy_ids, direct_unsigned_copy

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def test_cuda_batches_equal_cpu_batches_and_come_from_a_pinned_ring(small_dataset):
    with (
        StreamingLoader(small_dataset.url, seq_len=256, local_batch_size=8) as cpu,
        StreamingLoader(small_dataset.url, seq_len=256, local_batch_size=8, device="cuda") as gpu,
    ):
        delivery = gpu.delivery
        assert delivery.slots_pinned()
        assert delivery.copy_stream != torch.cuda.current_stream()
        for _ in range(10):
            want, got = next(cpu), next(gpu)
            for key in want:
                assert got[key].is_cuda
                assert torch.equal(got[key].cpu(), want[key])


def test_copies_overlap_compute_on_the_consumer_stream(small_dataset):
    with StreamingLoader(small_dataset.url, seq_len=256, local_batch_size=8, device="cuda", prefetch_steps=4) as gpu:
        next(gpu)
        main = torch.cuda.current_stream()
        # About a second of work on the consumer's stream; the copies of
        # the batches published meanwhile must not wait for it.
        torch.cuda._sleep(2_000_000_000)
        busy = torch.cuda.Event()
        busy.record(main)
        # the queue holds 4 batches, so at least 2 of these 6 were copied after the sleep began
        batches = [next(gpu) for _ in range(6)]
        copied = torch.cuda.Event()
        copied.record(gpu.delivery.copy_stream)
        copied.synchronize()
        assert not busy.query(), "a copy waited for compute on the consumer stream"
        torch.cuda.synchronize()
        assert all(b["input"].is_cuda and b["input"].shape == (8, 256) for b in batches)


@pytest.mark.parametrize("pipeline", ["process", "threads"])
def test_ids_cross_at_their_stored_width_and_close_unregisters_the_ring(small_dataset, pipeline):
    with StreamingLoader(small_dataset.url, seq_len=256, local_batch_size=8, device="cuda", pipeline=pipeline) as gpu:
        layout = gpu.ring.layout
        # uint16 ids of 8 rows of 257 tokens, the EOS ids and positions:
        # about a quarter of the int64 input, labels and positions.
        assert layout.wide_keys == () and layout.device_bytes < 8 * 257 * 2 + 64 + 16 * 8
        batch = next(gpu)
        assert batch["input"].dtype == torch.int64 and batch["labels"].is_cuda
        # A tensor over the whole ring keeps its mapping after close();
        # is_pinned() asks CUDA (cudaPointerGetAttributes) whether the memory
        # is registered, a query that leaves no error behind.
        ring_memory = torch.from_numpy(gpu.ring.as_array())
        assert ring_memory.is_pinned()
    assert not ring_memory.is_pinned(), "close() left the ring registered"


def test_host_labels_stay_on_the_cpu_and_equal_the_device_rows(small_dataset):
    with StreamingLoader(small_dataset.url, seq_len=256, local_batch_size=8, device="cuda", host_labels=True) as gpu:
        for _ in range(5):
            batch = next(gpu)
            assert batch["labels"].device.type == "cpu" and batch["labels"].is_pinned()
            assert torch.equal(batch["labels"][:, :-1], batch["input"][:, 1:].cpu())


def test_the_tokens_layout_on_cuda_equals_cpus_with_host_labels_kept_on_the_cpu(small_dataset):
    settings = {"seq_len": 256, "local_batch_size": 8, "batch_layout": "tokens"}
    with (
        StreamingLoader(small_dataset.url, **settings) as cpu,
        StreamingLoader(small_dataset.url, device="cuda", host_labels=True, **settings) as gpu,
    ):
        for _ in range(10):
            want, got = next(cpu), next(gpu)
            assert got["input"].is_cuda and got["labels"].device.type == "cpu" and got["labels"].is_pinned()
            for key in want:
                assert got[key].shape == want[key].shape and torch.equal(got[key].cpu(), want[key]), key


def test_a_schedule_on_cuda_reads_what_cpu_reads_across_shape_changes(small_dataset, small_bpe_dataset):
    # At each boundary the pinned ring is unregistered and a new one, laid
    # out for the next phase, registered; host labels (TorchTitan's) stay valid.
    from zephon_stream import Phase

    urls = [small_dataset.url, small_bpe_dataset.url]
    schedule = [
        Phase(start_step=0, global_batch=8, seq_len=256),
        Phase(start_step=3, global_batch=16, seq_len=128, weights=(1, 3)),
        Phase(start_step=6, global_batch=4, seq_len=512, weights=(0, 1)),
    ]
    with (
        StreamingLoader(urls, schedule=schedule) as cpu,
        StreamingLoader(urls, schedule=schedule, device="cuda", host_labels=True) as gpu,
    ):
        kept = []
        for _ in range(9):
            want, got = next(cpu), next(gpu)
            assert got["input"].is_cuda and not got["labels"].is_cuda
            for key in want:
                assert torch.equal(got[key].cpu(), want[key])
            kept.append((want["labels"].clone(), got["labels"]))
        assert gpu.delivery.slots_pinned()
        for want, got in kept:  # Earlier phases' rings are closed, their batches still valid
            assert torch.equal(got, want)


# About 2-4 s of GPU time at 1-2 GHz, far longer than the host loop below.
_SLEEP_CYCLES = 4_000_000_000


def test_unsigned_ids_widen_on_the_device_with_the_direct_copy():
    assert direct_unsigned_copy(torch_version=torch.__version__, device_type="cuda")
    for dtype, top in ((torch.uint16, 0xFFFF), (torch.uint32, 0xFFFFFFFF)):
        values = torch.tensor([0, 1, top // 2 + 1, top], dtype=torch.int64)
        out = torch.empty(4, dtype=torch.int64, device="cuda")
        copy_ids(out, values.to(dtype).cuda())
        assert torch.equal(out.cpu(), values), dtype


def test_host_labels_copied_behind_a_long_kernel_arrive_intact(small_dataset):
    # labels.to(device, non_blocking=True) from a view of the pinned ring
    # runs when the consumer's stream gets to it, here after a long kernel.
    # The consumer drops its views meanwhile and the loop goes round the ring
    # several times: a slot handed back on the drop would be refilled before
    # the copy reads it.
    config = dict(seq_len=256, local_batch_size=8, prefetch_steps=2)
    with StreamingLoader(small_dataset.url, **config) as cpu:
        want = [next(cpu)["labels"].clone() for _ in range(40)]
    with StreamingLoader(small_dataset.url, device="cuda", host_labels=True, **config) as gpu:
        num_slots = gpu.ring.num_slots
        first = next(gpu)  # The helper is running and its queue filling
        assert torch.equal(first["labels"], want[0])
        del first
        torch.cuda.synchronize()
        consumer = torch.cuda.current_stream()
        torch.cuda._sleep(_SLEEP_CYCLES)
        copies, copied_on_host = [], 0
        for step in range(1, 1 + 3 * num_slots):
            labels = next(gpu)["labels"]
            if labels.is_pinned():
                copies.append((step, labels.to("cuda", non_blocking=True)))
            else:
                # The loader copied these labels (views still out); a
                # non_blocking copy from pageable memory would wait for the stream.
                copied_on_host += 1
                assert torch.equal(labels, want[step])
            del labels
        assert copies, "no labels were views of the ring: the race was not exercised"
        assert not consumer.query(), "the copies ran before the views were dropped: the check proves nothing"
        torch.cuda.synchronize()
        for step, on_device in copies:
            assert torch.equal(on_device.cpu(), want[step]), f"step {step}: labels changed under the copy"
        assert copied_on_host > 0


def test_close_waits_for_copies_the_consumer_queued_from_host_labels(small_dataset):
    with StreamingLoader(small_dataset.url, seq_len=256, local_batch_size=8, device="cuda", host_labels=True) as gpu:
        labels = next(gpu)["labels"]
        assert labels.is_pinned()
        want = labels.clone()
        consumer = torch.cuda.current_stream()
        torch.cuda._sleep(_SLEEP_CYCLES)
        on_device = labels.to("cuda", non_blocking=True)
        del labels
        busy = not consumer.query()
    # close() stops the helper first (well under the kernel's seconds),
    # then must wait for the stream before it unregisters and unmaps the ring.
    assert busy, "the copy ran before close(): the check proves nothing"
    assert consumer.query(), "close() unregistered the ring before the consumer's stream was done with it"
    assert torch.equal(on_device.cpu(), want)


def test_cuda_without_an_index_under_torchrun_is_local_ranks_gpu_or_refused(monkeypatch):
    current, count = torch.cuda.current_device(), torch.cuda.device_count()
    monkeypatch.setenv("LOCAL_RANK", str(current))
    assert resolve_device("cuda") == torch.device("cuda", current)
    assert resolve_device(f"cuda:{current}") == torch.device("cuda", current)
    if count > 1:  # The refusal needs a second GPU; tests/test_loader_device.py covers it on CPU
        other = (current + 1) % count
        monkeypatch.setenv("LOCAL_RANK", str(other))
        with pytest.raises(ValueError, match=rf"torch.cuda.set_device\({other}\)"):
            resolve_device("cuda")
        assert resolve_device(f"cuda:{other}") == torch.device("cuda", other)
