"""Device delivery's decisions, on CPU: which GPU ``device="cuda"`` means, how
token ids are widened, and when a slot whose host labels the consumer viewed
may go back to the producer (tests/test_loader_cuda.py runs them on a GPU)."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from zephon_stream.loader.delivery.device import MAX_HELD_BATCHES, PENDING_RELEASE_SLOTS, cuda_index, ring_slots
from zephon_stream.loader.delivery.handback import SlotReturns
from zephon_stream.loader.delivery.widen import copy_ids, copy_ids_masked, direct_unsigned_copy, release
from zephon_stream.loader.ring.free_slots import FreeSlots, hand_back, reset_returned
from zephon_stream.loader.ring.shared_ring import SharedRing, SlotLayout

# -- which GPU -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("device_count", "current_device", "env", "expected"),
    [
        (1, 0, {}, 0),
        (8, 3, {}, 3),  # No torchrun: the current device, whatever it is
        (8, 5, {"LOCAL_RANK": "5"}, 5),  # set_device(LOCAL_RANK) came first
        (1, 0, {"LOCAL_RANK": "3"}, 0),  # one GPU visible per rank (CUDA_VISIBLE_DEVICES)
    ],
)
def test_cuda_without_an_index_is_the_current_device(device_count, current_device, env, expected):
    assert cuda_index(device_count=device_count, current_device=current_device, env=env) == expected


def test_cuda_without_an_index_under_torchrun_refuses_another_gpu_than_local_rank():
    with pytest.raises(ValueError) as raised:
        cuda_index(device_count=4, current_device=0, env={"LOCAL_RANK": "2"})
    message = str(raised.value)
    assert "LOCAL_RANK is 2" in message and "current CUDA device is 0" in message
    assert "torch.cuda.set_device(2)" in message and "device='cuda:2'" in message
    with pytest.raises(ValueError, match=r"LOCAL_RANK='x' is not an integer.*cuda:N"):
        cuda_index(device_count=2, current_device=0, env={"LOCAL_RANK": "x"})


# -- widening ----------------------------------------------------------------------------


def test_the_unsigned_copy_is_chosen_from_the_torch_version_and_the_device():
    assert release("2.11.0+cu130") == (2, 11) and release("2.3.0a0+git1234") == (2, 3)
    assert direct_unsigned_copy(torch_version="2.4.0", device_type="cuda")
    assert direct_unsigned_copy(torch_version="2.13.0+cpu", device_type="cpu")
    assert not direct_unsigned_copy(torch_version="2.2.2", device_type="cuda")
    assert not direct_unsigned_copy(torch_version="2.13.0", device_type="mps")
    with pytest.raises(ValueError, match="'nightly'"):
        release("nightly")


@pytest.mark.parametrize("dtype", [torch.uint16, torch.uint32])
def test_both_widening_paths_keep_ids_above_the_signed_range(dtype):
    top = 0xFFFF if dtype == torch.uint16 else 0xFFFFFFFF
    values = np.array([0, 1, top // 2, top // 2 + 1, top - 1, top], dtype=np.int64)
    ids = torch.from_numpy(values).to(dtype)
    for copy in (copy_ids, copy_ids_masked):
        out = torch.full((values.size,), -7, dtype=torch.int64)
        copy(out, ids)
        np.testing.assert_array_equal(out.numpy(), values, err_msg=copy.__name__)


# -- handing back slots whose host labels were viewed -------------------------------------


class StreamEvent:
    """Stands for an event recorded on a CUDA stream: complete once the test
    says the stream has run past it."""

    def __init__(self, *, done: bool) -> None:
        self.done = done
        self.waited = False

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:
        self.waited = True
        self.done = True


class Consumer:
    """A consumer stream: each release event recorded on it stays pending
    until :meth:`run` (the stream gets past the copies queued before it)."""

    def __init__(self) -> None:
        self.recorded: list[StreamEvent] = []

    def record(self) -> StreamEvent:
        self.recorded.append(StreamEvent(done=False))
        return self.recorded[-1]

    def run(self) -> None:
        for event in self.recorded:
            event.done = True


MAX_VIEWED = MAX_HELD_BATCHES + PENDING_RELEASE_SLOTS


def labels_ring(num_slots: int) -> SharedRing:
    return SharedRing.create(
        num_slots=num_slots, layout=SlotLayout(rows=2, seq_len=8, token_dtype="<u2", wide_keys=("labels",))
    )


def returns_for(ring: SharedRing, consumer: Consumer) -> SlotReturns:
    # As CUDA delivery builds it: the ring says whether a slot is viewed.
    return SlotReturns(referenced=ring.slot_in_use, record_release=consumer.record, max_viewed=MAX_VIEWED)


def host_labels(ring: SharedRing, index: int) -> torch.Tensor:
    """What CUDA delivery hands the consumer as ``labels`` for a viewed slot."""
    return torch.from_numpy(ring.slot(index).wide["labels"])


def test_a_slot_whose_labels_copy_is_pending_is_not_refilled_until_the_consumer_stream_passes_it():
    ring, consumer = labels_ring(ring_slots(prefetch_steps=1, host_views=True)), Consumer()
    try:
        returns = returns_for(ring, consumer)
        free, stop = FreeSlots(ring), threading.Event()
        assert returns.add(0, copied=StreamEvent(done=True), host_keys=True), "the first batch's labels are views"
        reset_returned(ring, busy=(0,))
        labels = host_labels(ring, 0)
        labels.fill_(41)
        assert returns.reclaim() == [] and consumer.recorded == [], "views held: nothing recorded, nothing freed"
        # The consumer queues labels.to(device, non_blocking=True) and
        # drops its views while that copy waits behind its compute.
        del labels
        assert returns.reclaim() == [] and len(consumer.recorded) == 1
        for slot in returns.reclaim():
            hand_back(ring, slot)
        taken = [free.acquire(stop) for _ in range(ring.num_slots - 1)]
        assert sorted(taken) == list(range(1, ring.num_slots))
        stop.set()
        assert free.acquire(stop) is None, "the producer got the slot the pending copy reads"
        assert (ring.slot(0).wide["labels"] == 41).all()
        consumer.run()
        back = returns.reclaim()
        assert back == [0] and len(consumer.recorded) == 1
        for slot in back:
            hand_back(ring, slot)
        assert free.acquire(stop) == 0
        assert returns.reclaim() == [], "a slot goes back once"
    finally:
        ring.close()


def test_pending_releases_count_as_held_so_later_labels_are_copies_and_the_ring_never_runs_dry():
    ring, consumer = labels_ring(ring_slots(prefetch_steps=1, host_views=True)), Consumer()
    try:
        returns = returns_for(ring, consumer)
        held = list(range(MAX_VIEWED))
        assert all(returns.add(index, copied=StreamEvent(done=True), host_keys=True) for index in held)
        assert returns.reclaim() == [], "every slot's views are dropped (none kept here), releases pending"
        assert len(consumer.recorded) == MAX_VIEWED
        # A delivery while they are all pending gets copies; its slot goes
        # back once its device copy is done, without waiting for them.
        extra = MAX_VIEWED
        assert not returns.add(extra, copied=StreamEvent(done=True), host_keys=True)
        assert returns.reclaim() == [extra]
        # The producer keeps the rest: the queue ahead and the step it assembles.
        assert ring.num_slots - (MAX_VIEWED + 1) == 1 + 1
        assert returns.settle() == tuple(held), "a new producer must not be given them either"
        returns.wait()
        assert all(event.waited for event in consumer.recorded), "close() waits for the consumer's stream"
        assert returns.views_handed_out
        assert sorted(returns.reclaim()) == held
    finally:
        ring.close()


def test_without_host_labels_a_slot_goes_back_when_its_copy_is_done_and_only_the_last_copy_is_not_waited_for():
    ring, consumer = labels_ring(4), Consumer()
    try:
        returns = returns_for(ring, consumer)
        copies = [StreamEvent(done=False) for _ in range(3)]
        assert not any(returns.add(index, copied=copies[index], host_keys=False) for index in range(3))
        assert returns.reclaim() == [0, 1], "earlier copies are waited for, so the producer has slots"
        assert [event.waited for event in copies] == [True, True, False]
        copies[2].done = True
        assert returns.reclaim() == [2]
        assert consumer.recorded == [] and not returns.views_handed_out
    finally:
        ring.close()
