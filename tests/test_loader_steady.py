"""The trainer's short way to a step: steps a helper posts in the ring's
header come in the helper's order, and the loader hands over the same
batches by the short way, by the full way and over the socket, to the end of
a finite run."""

from __future__ import annotations

import socket
import time

import pytest
import torch

from loader_reference import steps_until_the_helper_serves
from zephon_stream import StreamingLoader
from zephon_stream.loader.front.audit import union_sha256
from zephon_stream.loader.producer.pipeline import EndOfData
from zephon_stream.loader.producer.reports import READY, WAKE, HelperReports, encode, frame
from zephon_stream.loader.ring.shared_ring import SharedRing, SlotLayout
from zephon_stream.loader.ring.step_board import StepBoard, board_bytes
from zephon_stream.loader.runs import feed as feed_module
from zephon_stream.loader.runs.producer_run import SteadySteps


def small_ring(num_slots: int) -> SharedRing:
    return SharedRing.create(num_slots=num_slots, layout=SlotLayout(rows=1, seq_len=8, token_dtype="<u2", wide_keys=()))


def test_posts_come_in_order_around_the_ring_and_a_waiting_trainer_is_woken_once():
    ring = small_ring(3)
    try:
        board, slots = ring.board, [(7 * k) % 3 for k in range(10)]
        taken = []
        for k, slot in enumerate(slots):
            assert not board.post(slot), "nobody waits: no byte to send"
            if k % 2:  # The trainer reads behind, never more than the ring's slots
                taken += [board.take(), board.take()]
        assert board.take() is None and not board.posted()
        assert taken == slots
        board.waiting[0] = 1
        assert board.post(2), "the trainer waits: the post says so"
        assert not board.post(1), "and only once"
        assert [board.take(), board.take(), board.take()] == [2, 1, None]
    finally:
        ring.close()


class LateBoard(StepBoard):
    """A board whose helper posts a step just after the trainer found none (a race, made to happen)."""

    late_slot: int | None = None

    def take(self) -> int | None:
        slot = super().take()
        if slot is None and self.late_slot is not None:
            self.post(self.late_slot)
            self.late_slot = None
        return slot


def test_an_end_sent_after_posts_the_trainer_has_not_read_comes_after_them():
    ours, theirs = socket.socketpair()
    board = LateBoard(memoryview(bytearray(board_bytes(4))), 4)
    try:
        reports = HelperReports(ours)
        reports.board, reports.posts = board, True
        theirs.sendall(frame(READY))
        assert reports.ready()
        board.post(3)
        theirs.sendall(frame(WAKE) + frame(encode(EndOfData())))
        assert reports.take() == 3
        assert reports.take() is None, "what was sent is received by sleep(), not by take()"
        reports.sleep()
        assert board.waiting[0] == 1, "a trainer that sleeps says so on the board"
        board.late_slot = 1
        # The board looked empty, then the end came: the post made in between comes first.
        assert reports.take() == 1
        assert isinstance(reports.take(), EndOfData)
        assert reports.take() is None
        theirs.close()
        with pytest.raises(EOFError):
            reports.sleep()
    finally:
        ours.close()
        theirs.close()
        board.release()


class ShortWaySteps(list):
    """What ``SteadySteps.take`` answered, once :meth:`watch` starts: per call,
    None when it stepped aside, else the stall it counted."""

    def watch(self, monkeypatch: pytest.MonkeyPatch) -> None:
        take = SteadySteps.take

        def recorded(steady: SteadySteps):
            batch = take(steady)
            self.append(None if batch is None else steady.stall_s)
            return batch

        monkeypatch.setattr(SteadySteps, "take", recorded)

    def served(self) -> int:
        return sum(answer is not None for answer in self)


def step_hash(batch) -> str:
    return union_sha256([(batch["sample_positions"].numpy(), batch["input"].numpy(), batch["labels"].numpy())])


def read_to_the_end(loader: StreamingLoader) -> list[str]:
    """Every step's hash, pausing while the run is on threads so the helper takes it over."""
    hashes = []
    for batch in loader:
        hashes.append(step_hash(batch))
        if loader.pipeline_mode == "process" and loader.helper_pid is None:
            time.sleep(0.02)
    return hashes


@pytest.mark.parametrize("local_batch_size", [4, 1], ids=["a_slot_a_step", "16_steps_a_slot"])
def test_the_short_way_posts_and_the_socket_hand_over_the_same_steps_to_the_end(
    small_dataset, local_batch_size, monkeypatch
):
    steps = 600

    def loader(pipeline: str) -> StreamingLoader:
        return StreamingLoader(
            small_dataset.url,
            seq_len=128,
            local_batch_size=local_batch_size,
            seed=5,
            max_steps=steps,
            pipeline=pipeline,
        )

    with loader("threads") as reference:
        expected = read_to_the_end(reference)
    assert len(expected) == steps
    served = ShortWaySteps()
    served.watch(monkeypatch)
    with loader("process") as posted:
        assert read_to_the_end(posted) == expected
        assert posted.helper_pid is not None
    # The run begins on threads until the helper is loaded (later on a busy machine).
    assert served.served() >= 100, "the short way served the helper's steps"
    served.clear()
    # Where the machine's memory order does not allow posts, steps come over the socket.
    monkeypatch.setattr(feed_module, "board_is_safe", lambda: False)
    with loader("process") as sent:
        assert read_to_the_end(sent) == expected
        assert sent.helper_pid is not None
    assert not served, "no short way without posts"


def test_a_step_the_short_way_waited_for_counts_its_stall(small_dataset, monkeypatch):
    answers = ShortWaySteps()
    answers.watch(monkeypatch)
    # A consumer with nothing to do between steps outruns the helper: its steps wait for their posts.
    with StreamingLoader(small_dataset.url, seq_len=128, local_batch_size=4, prefetch_steps=1) as loader:
        steps_until_the_helper_serves(loader)
        before = loader.stats()
        for _ in range(300):
            next(loader)
        after = loader.stats()
    waits = [stall_s for stall_s in answers if stall_s]
    assert waits, "no step by the short way waited"
    assert after["stall_s"] - before["stall_s"] >= sum(waits) * 0.999
    assert after["stalled_steps"] - before["stalled_steps"] >= sum(wait > 1e-4 for wait in waits)
    assert after["steps"] - before["steps"] == 300


def test_a_consumer_that_keeps_one_batch_still_takes_the_short_way_and_the_batch_stays_whole(
    small_dataset, monkeypatch
):
    served = ShortWaySteps()
    # 16 x 1024 tokens fill a slot: one step a slot, each handed back on its own.
    with StreamingLoader(small_dataset.url, seq_len=1024, local_batch_size=16) as loader:
        steps_until_the_helper_serves(loader)
        for _ in range(20):
            next(loader)
            time.sleep(0.001)
        kept = next(loader)
        copy = {key: tensor.clone() for key, tensor in kept.items()}
        served.watch(monkeypatch)
        for _ in range(200):
            # Each batch used and dropped before the next step (a kept
            # one and the last one held would be two: the next a copy).
            assert next(loader)["input"].shape == (16, 1024)
            time.sleep(0.0005)  # The helper keeps up: the steps are plain
    assert all(torch.equal(kept[key], copy[key]) for key in copy), "a kept batch was overwritten"
    assert served.served() >= 150, f"{served.served()} of 200 steps by the short way while one batch is kept"
