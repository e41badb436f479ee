"""Unit tests of the loader's parts: cache, fetch/decode pool, assembler,
planner and memory bound, each on real bytes (zstd frames in local files)."""

from __future__ import annotations

import select
import socket
import sys
import threading
import time

import numpy as np
import pytest

from zephon_stream.errors import ConfigError, CorruptBlockError
from zephon_stream.format.block import encode_block
from zephon_stream.loader.blocks.cache import BlockCache, CacheClosedError
from zephon_stream.loader.blocks.fetcher import BlockJob, FetchDecodePool
from zephon_stream.loader.planning.memory import (
    blocks_per_lane,
    check_memory,
    compute_memory_bound,
    retention_steps,
    window_spread,
)
from zephon_stream.loader.planning.planner import Planner
from zephon_stream.loader.producer.assembler import StepAssembler, gather_rows, positions_from_eos
from zephon_stream.loader.producer.pipeline import EndOfData, ReadyStep
from zephon_stream.loader.producer.reports import MessageReader, decode, encode, frame
from zephon_stream.loader.producer.stats import LoaderStats
from zephon_stream.loader.ring.free_slots import FreeSlots, hand_back, reset_returned
from zephon_stream.loader.ring.shared_ring import WIDE_KEYS, SharedRing, SlotLayout
from zephon_stream.storage import open_store


def reference_positions(inputs: np.ndarray, eos: np.ndarray) -> np.ndarray:
    out = np.zeros_like(inputs)
    for r in range(inputs.shape[0]):
        pos = 0
        for t in range(inputs.shape[1]):
            out[r, t] = pos
            pos = 0 if inputs[r, t] == eos[r] else pos + 1
    return out


# -- cache -------------------------------------------------------------------


def test_cache_refuses_reservations_past_capacity_unless_forced():
    cache = BlockCache(capacity_bytes=100)
    assert cache.try_reserve("a", 60)
    assert not cache.try_reserve("b", 60)
    assert cache.try_reserve("b", 60, force=True)
    assert cache.reserved_bytes == 120 and cache.forced_reservations == 1
    cache.drop("a")
    assert cache.reserved_bytes == 60 and "a" not in cache
    assert cache.peak_bytes == 120


def test_cache_get_waits_for_fill_and_raises_the_fetch_error():
    cache = BlockCache(capacity_bytes=1 << 20)
    cache.try_reserve("ok", 8)
    cache.try_reserve("bad", 8)
    tokens = np.arange(4, dtype=np.uint16)
    threading.Timer(0.05, cache.fill, args=("ok", tokens)).start()
    assert cache.get("ok", timeout_s=5) is tokens
    cache.fail("bad", CorruptBlockError("shard x block 3: checksum mismatch"))
    with pytest.raises(CorruptBlockError, match="block 3"):
        cache.get("bad", timeout_s=1)
    cache.try_reserve("slow", 8)
    with pytest.raises(TimeoutError):
        cache.get("slow", timeout_s=0.01)


def test_cache_close_wakes_a_waiter():
    cache = BlockCache(capacity_bytes=64)
    cache.try_reserve("k", 8)
    errors = []

    def wait():
        try:
            cache.get("k")
        except CacheClosedError as exc:
            errors.append(exc)

    waiter = threading.Thread(target=wait)
    waiter.start()
    time.sleep(0.05)
    cache.close()
    waiter.join(5)
    assert not waiter.is_alive() and len(errors) == 1


# -- fetch/decode pool -------------------------------------------------------


def write_blocks(tmp_path, blocks):
    frames = [encode_block(b) for b in blocks]
    offsets = np.cumsum([0] + [len(f) for f in frames]).tolist()
    (tmp_path / "shard.zst").write_bytes(b"".join(frames))
    return open_store(str(tmp_path)), offsets


def test_pool_fetches_exact_ranges_and_decodes_into_the_cache(tmp_path):
    rng = np.random.default_rng(1)
    blocks = [rng.integers(0, 5000, size=n).astype(np.uint16) for n in (1000, 777, 1000, 3)]
    store, offsets = write_blocks(tmp_path, blocks)
    cache, stats = BlockCache(capacity_bytes=1 << 20), LoaderStats()
    pool = FetchDecodePool(cache=cache, stats=stats, num_fetch_threads=2, num_decode_threads=2)
    try:
        for i, block in enumerate(blocks):
            cache.try_reserve(i, block.nbytes)
            pool.submit(
                BlockJob(
                    key=i,
                    store=store,
                    path="shard.zst",
                    start=offsets[i],
                    end=offsets[i + 1],
                    num_tokens=len(block),
                    dtype=np.dtype("<u2"),
                    where=f"shard.zst block {i}",
                )
            )
        for i, block in enumerate(blocks):
            np.testing.assert_array_equal(cache.get(i, timeout_s=10), block)
    finally:
        pool.close()
    snap = stats.snapshot()
    assert snap["blocks_decoded"] == 4 and snap["bytes_fetched"] == offsets[-1]


def test_pool_reports_a_corrupt_block_by_name_and_stops_its_threads(tmp_path):
    blocks = [np.arange(500, dtype=np.uint16), np.arange(500, dtype=np.uint16) * 3]
    store, offsets = write_blocks(tmp_path, blocks)
    raw = bytearray((tmp_path / "shard.zst").read_bytes())
    raw[offsets[1] + 20] ^= 0xFF
    (tmp_path / "shard.zst").write_bytes(bytes(raw))
    before = threading.active_count()
    cache = BlockCache(capacity_bytes=1 << 20)
    pool = FetchDecodePool(cache=cache, stats=LoaderStats(), num_fetch_threads=3, num_decode_threads=2)
    for i, block in enumerate(blocks):
        cache.try_reserve(i, block.nbytes)
        pool.submit(
            BlockJob(
                key=i,
                store=store,
                path="shard.zst",
                start=offsets[i],
                end=offsets[i + 1],
                num_tokens=500,
                dtype=np.dtype("<u2"),
                where=f"shard shard.zst block {i}",
            )
        )
    np.testing.assert_array_equal(cache.get(0, timeout_s=10), blocks[0])
    with pytest.raises(CorruptBlockError, match="shard shard.zst block 1"):
        cache.get(1, timeout_s=10)
    assert threading.active_count() == before + 5
    pool.close()
    assert threading.active_count() == before


# -- assembler ---------------------------------------------------------------


def test_gather_rows_takes_input_and_shifted_labels_from_the_sample_window():
    seq_len = 8
    block_a = np.arange(3 * seq_len + 1, dtype=np.uint16)
    block_b = np.arange(100, 100 + 2 * seq_len + 1, dtype=np.uint16)
    samples = np.array([2, 0, 1])
    out_in = np.empty((3, seq_len), np.int64)
    out_lab = np.empty((3, seq_len), np.int64)
    gather_rows([block_a, block_b, block_a], samples, seq_len=seq_len, out_input=out_in, out_labels=out_lab)
    np.testing.assert_array_equal(out_in[0], np.arange(16, 24))
    np.testing.assert_array_equal(out_lab[0], np.arange(17, 25))
    np.testing.assert_array_equal(out_in[1], np.arange(100, 108))
    np.testing.assert_array_equal(out_lab[2], np.arange(9, 17))


@pytest.mark.parametrize("density", [0.0, 0.002, 0.05, 0.4, 1.0])
@pytest.mark.parametrize("shape", [(1, 1), (1, 2), (3, 7), (6, 64), (2, 513)])
def test_positions_restart_after_each_eos(density, shape):
    rng = np.random.default_rng(int(density * 1000) + shape[1])
    eos = np.array([7, 9, 7, 9, 7, 9][: shape[0]])
    inputs = np.where(rng.random(shape) < density, eos[:, None], 3).astype(np.int64)
    out = np.empty_like(inputs)
    np.testing.assert_array_equal(positions_from_eos(inputs, eos, out=out), reference_positions(inputs, eos))
    same = np.full(shape[0], 7)
    np.testing.assert_array_equal(positions_from_eos(inputs, 7, out=out), reference_positions(inputs, same))


@pytest.mark.parametrize("density", [0.0, 0.01, 0.3])
@pytest.mark.parametrize("per_row_eos", [False, True])
def test_step_assembler_equals_row_gather_and_positions(density, per_row_eos):
    seq_len, rows = 16, 6
    rng = np.random.default_rng(int(density * 100) + per_row_eos)
    blocks = []
    for dtype in (np.uint16, np.uint32):
        tokens = np.where(rng.random(4 * seq_len + 1) < density, rng.choice([7, 9], 4 * seq_len + 1), 3)
        blocks.append(tokens.astype(dtype))
    # EOS on a window's last input token and on its label-only token
    # start nothing inside the row.
    blocks[0][seq_len - 1] = 7
    blocks[0][2 * seq_len] = 7
    row_blocks = [blocks[i % 2] for i in range(rows)]
    samples = np.array([0, 3, 1, 0, 3, 2])
    eos = np.array([7, 9, 7, 9, 7, 9]) if per_row_eos else 7
    assembler = StepAssembler(seq_len=seq_len)
    ring = SharedRing.create(
        num_slots=2, layout=SlotLayout(rows=rows, seq_len=seq_len, token_dtype="<u4", wide_keys=WIDE_KEYS)
    )
    for index in range(2):  # The second pass reuses the scratch buffers
        assembler.assemble(row_blocks, samples, eos, ring.slot(index))
    slot = ring.slot(1)
    want_input, want_labels = np.empty((rows, seq_len), np.int64), np.empty((rows, seq_len), np.int64)
    gather_rows(row_blocks, samples, seq_len=seq_len, out_input=want_input, out_labels=want_labels)
    np.testing.assert_array_equal(slot.wide["input"], want_input)
    np.testing.assert_array_equal(slot.wide["labels"], want_labels)
    np.testing.assert_array_equal(slot.tokens[:, :-1], want_input)
    np.testing.assert_array_equal(slot.tokens[:, 1:], want_labels)
    eos_rows = np.broadcast_to(np.asarray(eos), (rows,))
    np.testing.assert_array_equal(slot.eos, eos_rows)
    np.testing.assert_array_equal(slot.wide["positions"], reference_positions(want_input, eos_rows))
    del slot
    ring.close()


# -- planner -----------------------------------------------------------------


def lane_order(lanes, samples_per_block, window):
    """A small stand-in order with the structure the planner relies on: lane
    ``p % lanes`` walks its own blocks in order, samples shuffled within
    windows of ``window`` lane steps."""

    def address(p):
        lane, q = p % lanes, p // lanes
        base = (q // window) * window
        shuffled = base + (q - base) * 5 % window if window > 1 else q
        return lane, shuffled // samples_per_block, shuffled % samples_per_block

    return address


@pytest.mark.parametrize("spb,window", [(5, 3), (6, 3), (4, 4)])
@pytest.mark.parametrize("lanes,batch,world,rank", [(4, 4, 2, 1), (6, 4, 2, 0), (3, 6, 3, 2)])
def test_planner_releases_a_block_only_when_no_later_step_uses_it(lanes, batch, world, rank, spb, window):
    fetch = 2
    address = lane_order(lanes, spb, window)
    rows = batch // world

    def slice_one(cursor):
        positions = np.arange(cursor, cursor + batch)
        order = np.lexsort((positions // lanes, positions % lanes))
        mine = positions[order][rank * rows : (rank + 1) * rows]
        addr = np.array([address(int(p)) for p in mine]).reshape(-1, 3)
        streams = np.zeros(rows, np.int64)
        return mine, streams, addr[:, 0] * 100 + addr[:, 1], addr[:, 2]

    def slice_fn(cursor, count):
        parts = [slice_one(cursor + k * batch) for k in range(count)]
        return tuple(np.stack([p[i] for p in parts]) for i in range(4))

    steps = 200
    planner = Planner(
        slice_fn=slice_fn,
        start=0,
        global_batch=batch,
        num_steps=steps,
        fetch_steps=fetch,
        retention_steps=retention_steps(
            spread=window_spread(window=window, samples_per_block=spb),
            lanes=lanes,
            global_batch=batch,
            fetch_steps=fetch,
        ),
    )
    all_keys = [list(zip(*(a.tolist() for a in slice_one(i * batch)[1:3]))) for i in range(steps)]
    released_at = {}
    resident = set()
    peak = 0
    while not planner.finished():
        planner.extend()
        for first, keys in planner.fetch_ahead():
            assert first >= planner.next_index
            resident.update(keys)
        plan = planner.next_step()
        assert set(plan.keys) <= resident
        for key in planner.advance():
            released_at[key] = planner.next_index
            resident.discard(key)
        peak = max(peak, len(resident))
    for key, index in released_at.items():
        assert all(key not in keys for keys in all_keys[index:]), f"{key} released at step {index} but used later"
    lanes_read = len({p % lanes for i in range(steps) for p in slice_one(i * batch)[0].tolist()})
    bound = lanes_read * blocks_per_lane(
        spread=window_spread(window=window, samples_per_block=spb),
        samples_per_block=spb,
        lanes=lanes,
        global_batch=batch,
        fetch_steps=fetch,
    )
    assert peak <= bound


# -- memory bound ------------------------------------------------------------


def test_memory_bound_refuses_a_config_over_the_cap_and_says_what_to_change():
    bound = compute_memory_bound(
        lanes_read=8,
        blocks_per_lane=3,
        block_bytes=2 << 20,
        max_compressed_block_bytes=1 << 20,
        num_fetch_threads=4,
        num_decode_threads=2,
        ring_bytes=7 << 20,
        helper_bytes=96 << 20,
    )
    assert bound.total_bytes == 24 * (2 << 20) + 8 * (1 << 20) + (7 << 20) + (96 << 20)
    check_memory(bound, bound.total_bytes)
    with pytest.raises(ConfigError, match="max_memory_bytes=1000.*prefetch_steps"):
        check_memory(bound, 1000)


def test_helper_messages_round_trip_steps_the_end_and_errors():
    step = ReadyStep(index=7, cursor=2**40 + 3, slot=5, data_sha256="ab" * 32)
    assert decode(encode(step)) == step
    assert decode(encode(ReadyStep(index=0, cursor=0, slot=0, data_sha256=""))).data_sha256 == ""
    assert isinstance(decode(encode(EndOfData())), EndOfData)
    error = decode(encode(CorruptBlockError("shard shards/00000001.zst block 2: checksum mismatch")))
    assert isinstance(error, CorruptBlockError) and "block 2" in str(error)
    assert any("helper process" in note for note in error.__notes__)


def test_free_slots_come_back_in_any_order_and_producer_views_are_not_consumer_references():
    ring = SharedRing.create(num_slots=4, layout=SlotLayout(rows=2, seq_len=8, token_dtype="<u2", wide_keys=WIDE_KEYS))
    try:
        free, stop = FreeSlots(ring), threading.Event()
        reset_returned(ring, busy=(2,))
        assert [free.acquire(stop) for _ in range(3)] == [0, 1, 3]
        for slot in (3, 0):
            hand_back(ring, slot)
        assert [free.acquire(stop) for _ in range(2)] == [0, 3]
        stop.set()
        assert free.acquire(stop) is None  # nothing returned: it waits until stopped
        before = sys.getrefcount(ring.slab(1))
        views = ring.producer_slots()
        views[1].tokens[:] = 7
        after = sys.getrefcount(ring.slab(1))  # Outside the assert, which holds values of its own
        assert after == before
        assert (ring.slot(1).tokens == 7).all()
        del views
    finally:
        ring.close()


def _read(reader: MessageReader, sock: socket.socket) -> bytes:
    while (message := reader.poll()) is None:
        select.select((sock,), (), (), 5)
    return message


def test_message_reader_takes_framed_messages_however_they_arrive():
    ours, theirs = socket.socketpair()
    try:
        reader = MessageReader(ours)
        assert reader.poll() is None  # Nothing sent yet: never waits
        big = encode(RuntimeError("x" * 200_000))  # Longer than one recv
        steps = [encode(ReadyStep(index=i, cursor=16 * i, slot=i % 3, data_sha256="")) for i in range(3)]
        theirs.sendall(b"".join(frame(m) for m in steps))  # Three messages, one recv
        assert [decode(_read(reader, ours)) for _ in steps] == [decode(m) for m in steps]
        whole = frame(big) + frame(encode(EndOfData()))
        sender = threading.Thread(
            target=lambda: [theirs.sendall(whole[i : i + 7001]) for i in range(0, len(whole), 7001)]
        )
        sender.start()
        assert str(decode(_read(reader, ours))).startswith("x" * 1000)
        assert isinstance(decode(_read(reader, ours)), EndOfData)
        sender.join()
        theirs.close()
        with pytest.raises(EOFError):
            _read(reader, ours)
    finally:
        ours.close()
        theirs.close()


def test_the_loader_front_door_names_each_public_name_where_it_is_defined():
    """``zephon_stream.loader`` (and ``zephon_stream``) hand out the very
    objects the loader's stages define, for every name they list."""
    import importlib

    import zephon_stream
    import zephon_stream.loader as loader

    assert sorted(loader.__all__) == sorted(loader._PUBLIC)
    for name, module in loader._PUBLIC.items():
        assert getattr(loader, name) is getattr(importlib.import_module(module), name), name
    for name in ("StreamingLoader", "Stream", "Phase", "EvalLoader"):
        assert getattr(zephon_stream, name) is getattr(loader, name), name
    with pytest.raises(AttributeError, match="no attribute 'feed'"):
        loader.feed  # noqa: B018 - a module of a stage is not a name of the front door
