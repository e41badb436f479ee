"""The node's request-rate limiter (storage/request_rate.py) on a clock of the test's own, and its record's file
(storage/limiter.py) under real processes: one record for the node, nothing held or torn by a rank that
dies in the middle of an update."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time
from pathlib import Path

import pytest

from zephon_stream.storage import open_store
from zephon_stream.storage.cloud_clients import client_options
from zephon_stream.storage.limiter import (
    FILE_BYTES,
    Limiter,
    LocalRecord,
    SharedRecord,
    limiter_file_name,
    pack_record,
    unpack_record,
)
from zephon_stream.storage.node_cache import NodeCache
from zephon_stream.storage.request_rate import BETA, CUBIC_C, INITIAL_RATE, MIN_RATE, QUIET_S, RateRecord

CTX = mp.get_context("fork")
BEFORE_ANY_TICKET = float("-inf")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def limiter_on_a_clock() -> tuple[Limiter, Clock]:
    clock = Clock()
    return Limiter(LocalRecord(), clock=clock), clock


def go_times(lim: Limiter, clock: Clock, count: int, step_s: float = 0.001) -> list[float]:
    """When each of ``count`` requests, asking at once, gets its turn (the clock moved in ``step_s`` steps)."""
    tickets = [lim.ticket() for _ in range(count)]
    times = []
    for ticket in tickets:
        while lim.wait_s(ticket) > 0:
            clock.now += step_s
        times.append(clock.now)
    return times


def test_off_until_the_first_throttling_answer_then_requests_go_one_a_tick_at_the_initial_rate():
    lim, clock = limiter_on_a_clock()
    assert lim.ticket() is None, "no throttling yet: requests go without a ticket"
    assert lim.throttled(BEFORE_ANY_TICKET) == "on"
    times = go_times(lim, clock, 8, step_s=0.0005)
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert all(gap == pytest.approx(1 / (BETA * INITIAL_RATE), abs=0.002) for gap in gaps), gaps


def test_answers_to_requests_sent_before_the_cut_cut_nothing_more():
    lim, clock = limiter_on_a_clock()
    lim.throttled(BEFORE_ANY_TICKET)
    # The first burst's other answers: sent before the limiter was on.
    assert [lim.throttled(BEFORE_ANY_TICKET) for _ in range(20)] == ["seen"] * 20
    assert lim.snapshot().rate == pytest.approx(BETA * INITIAL_RATE, rel=1e-3)
    sent_at = go_times(lim, clock, 1)[0]
    clock.now += 0.01
    assert lim.throttled(sent_at) == "cut"
    cut_rate = lim.snapshot().rate
    assert cut_rate == pytest.approx(BETA * BETA * INITIAL_RATE, rel=0.02)
    # The requests in flight when it was cut come back throttled too: one congestion event, one cut.
    assert [lim.throttled(sent_at) for _ in range(5)] == ["seen"] * 5
    assert lim.snapshot().rate == pytest.approx(cut_rate, rel=1e-3)


def test_the_rate_grows_back_along_cubic_then_probes_only_while_requests_wait():
    lim, clock = limiter_on_a_clock()
    lim.throttled(BEFORE_ANY_TICKET)
    clock.now += 5.0
    assert lim.wait_s(lim.ticket()) == 0.0, "after a pause the next request goes at once"
    assert lim.snapshot().rate == pytest.approx(BETA * INITIAL_RATE, rel=1e-3), "idle: the rate must not grow"
    backlog = [lim.ticket() for _ in range(10_000)]
    clock.now += 0.4
    lim.wait_s(backlog[-1])
    record = lim.snapshot()
    k = (record.w_max * (1 - BETA) / CUBIC_C) ** (1 / 3)
    assert record.grown_s == pytest.approx(0.4)
    assert record.rate == pytest.approx(CUBIC_C * (0.4 - k) ** 3 + record.w_max, rel=1e-6)
    assert BETA * INITIAL_RATE < record.rate < INITIAL_RATE
    clock.now += 1.1  # 1.5 s since the cut: the probe, 0.5 s in, has doubled 4 times
    lim.wait_s(backlog[-1])
    assert lim.snapshot().rate == pytest.approx(BETA * INITIAL_RATE * 2**4, rel=1e-6)


def test_a_node_left_with_the_store_to_itself_probes_past_where_it_was_cut():
    lim, clock = limiter_on_a_clock()
    lim.throttled(BEFORE_ANY_TICKET)
    sent_at = go_times(lim, clock, 1)[0]
    for _ in range(6):  # Cut to a small share, as at 16,384 ranks' contention
        clock.now += 0.01
        lim.throttled(sent_at)
        sent_at = go_times(lim, clock, 1)[0]
    w_max = lim.snapshot().w_max
    backlog = [lim.ticket() for _ in range(10_000)]
    clock.now += 3.0
    lim.wait_s(backlog[-1])
    # CUBIC alone, after 3 s: about W_max + 0.4 * (3 - K)**3, a few per cent; the probe doubles every 0.25 s.
    assert lim.snapshot().rate > 8 * w_max


def test_the_rate_never_falls_below_its_floor():
    lim, clock = limiter_on_a_clock()
    lim.throttled(BEFORE_ANY_TICKET)
    for _ in range(60):
        sent_at = clock.now + 0.001  # Sent after the last cut, with nothing waiting: no growth between
        clock.now += 0.01
        lim.throttled(sent_at)
    assert lim.snapshot().rate == MIN_RATE


def test_it_switches_off_after_a_quiet_spell_with_nobody_waiting_and_on_again_at_the_next_answer():
    lim, clock = limiter_on_a_clock()
    lim.throttled(BEFORE_ANY_TICKET)
    clock.now += QUIET_S / 2
    assert lim.ticket() is not None
    clock.now += QUIET_S
    assert lim.ticket() is None and not lim.record.is_on()
    assert lim.throttled(BEFORE_ANY_TICKET) == "on"
    assert lim.snapshot().epoch == 2


def test_a_ticket_of_an_earlier_epoch_goes_at_once():
    lim, clock = limiter_on_a_clock()
    lim.throttled(BEFORE_ANY_TICKET)
    stale = [lim.ticket() for _ in range(50)][-1]
    lim.record.update(lambda record: setattr(record, "epoch", record.epoch + 1))
    assert lim.wait_s(stale) == 0.0


def test_a_record_survives_its_bytes_and_a_torn_copy_is_refused():
    record = RateRecord(True, 12.5, 3.25, 7.0, 99.0, 0.5, 20.0, 98.0, 97.5, epoch=3)
    blob = pack_record(record)
    assert unpack_record(blob + bytes(40)) == record
    torn = blob[:20] + bytes(len(blob) - 20)
    assert unpack_record(torn + bytes(40)) is None
    assert unpack_record(bytes(128)) is None, "a new file's zeros are no record"


def test_a_stores_key_becomes_a_file_name_without_its_endpoint_or_bucket():
    name = limiter_file_name("s3 http://10.0.0.7:9000 secret-bucket")
    assert name.startswith("limit-") and "bucket" not in name and "10.0.0.7" not in name
    assert name == limiter_file_name("s3 http://10.0.0.7:9000 secret-bucket") != limiter_file_name("s3 x y")


def test_a_store_shares_the_nodes_limiter_until_closed_unless_its_options_turn_the_limiter_off(tmp_path):
    options = {"endpoint_url": "http://127.0.0.1:9", "key": "k", "secret": "s"}
    with NodeCache(tmp_path / "node") as cache:
        store = open_store("s3://bucket/ds", options)
        assert store.limiter is not None and not store.limiter.shared, "a store of its own has a limiter of its own"
        assert store.share_limiter(cache) and store.limiter.shared
        assert os.listdir(tmp_path / "node" / "node-cache-limits") == [limiter_file_name(store.limiter_key())]
        in_flight = store.limiter
        in_flight.throttled(BEFORE_ANY_TICKET)
        ticket = in_flight.ticket()
        store.close()
        assert not store.limiter.shared, "closed, the store lets the node's file go"
        assert in_flight.wait_s(ticket) == 0.0 and in_flight.ticket() is None, "an operation in flight goes on"
        off = open_store("s3://bucket/ds", {**options, "zephon_throttle_limiter": False})
        assert off.limiter is None and not off.retry_policy.throttle_limiter and not off.share_limiter(cache)
        assert "zephon_throttle_limiter" not in client_options(off._options), "no client library is given it"
        local = open_store(str(tmp_path / "data"))
        assert not local.share_limiter(cache), "local files are never throttled"
    assert not (tmp_path / "node").exists()


# -- the record's file under real processes -----------------------------------


def take_tickets(path: str, count: int, results) -> None:
    lim = Limiter(SharedRecord(path))
    got = 0
    for _ in range(count):
        ticket = lim.ticket()
        while ticket is not None and (wait := lim.wait_s(ticket)) > 0:
            time.sleep(min(wait, 0.01))
        got += 1
    results.put(got)


def hold_the_lock_and_hang(path: str, holding: str) -> None:
    lim = Limiter(SharedRecord(path))

    def hang(record: RateRecord) -> None:
        Path(holding).touch()
        time.sleep(600)

    lim.record.update(hang)


def die_mid_write(path: str) -> None:
    record = SharedRecord(path)

    def half_then_die(view, slot, new: RateRecord) -> None:
        blob = pack_record(new)
        start = (128, 256)[slot]
        view[start : start + len(blob) // 2] = blob[: len(blob) // 2]
        os.kill(os.getpid(), signal.SIGKILL)

    record._write = half_then_die  # The copy is torn where a SIGKILL mid-write would tear it
    Limiter(record).throttled(time.monotonic())


def test_processes_of_a_node_share_one_record_and_a_rank_killed_holding_its_lock_holds_nobody(tmp_path):
    with NodeCache(tmp_path / "node") as cache:
        path = cache.limiter_path(limiter_file_name("s3 http://127.0.0.1:1 bucket"))
        lim = Limiter(SharedRecord(path))
        lim.throttled(BEFORE_ANY_TICKET)
        assert os.path.getsize(path) == FILE_BYTES
        holder = CTX.Process(target=hold_the_lock_and_hang, args=(path, str(tmp_path / "holding")))
        holder.start()
        deadline = time.monotonic() + 30
        while not (tmp_path / "holding").exists():
            assert time.monotonic() < deadline, "the child never took the lock"
            time.sleep(0.01)
        os.kill(holder.pid, signal.SIGKILL)
        holder.join(30)
        results = CTX.Queue()
        takers = [CTX.Process(target=take_tickets, args=(path, 20, results)) for _ in range(3)]
        started = time.monotonic()
        for taker in takers:
            taker.start()
        got = [results.get(timeout=60) for _ in takers]
        elapsed = time.monotonic() - started
        for taker in takers:
            taker.join(30)
        assert got == [20, 20, 20]
        # 60 turns of one shared queue at 70 a second (the rate grows meanwhile): not 3 queues of 20.
        assert 0.4 < elapsed < 30, elapsed
        assert lim.snapshot().issued >= 60, "the processes took their tickets from one record"
        lim.close()
    assert not (tmp_path / "node").exists(), "the limiter's file went with the node cache"


def test_a_rank_killed_while_writing_the_record_leaves_the_one_before_it(tmp_path):
    with NodeCache(tmp_path / "node") as cache:
        path = cache.limiter_path(limiter_file_name("s3 http://127.0.0.1:1 bucket"))
        lim = Limiter(SharedRecord(path))
        lim.throttled(BEFORE_ANY_TICKET)
        before = lim.snapshot()
        child = CTX.Process(target=die_mid_write, args=(path,))
        child.start()
        child.join(30)
        assert child.exitcode == -signal.SIGKILL
        after = lim.snapshot()
        fields = ("on", "epoch", "rate", "cut_at")
        assert [getattr(after, f) for f in fields] == [getattr(before, f) for f in fields]
        assert lim.ticket() is not None, "the record still works"
        lim.close()
    assert not (tmp_path / "node").exists()
