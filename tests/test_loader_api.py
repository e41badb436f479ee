"""StreamingLoader in one process: rows equal the tokens at their plan address,
several ranks cover what one rank does, resume is exact, mixtures are exact,
bad configs and bad blocks are refused, and close() leaves nothing running."""

from __future__ import annotations

import os
import re
import shutil
import threading

import numpy as np
import pytest
import torch

from loader_reference import (
    DirectReader,
    reference_positions,
    resume_points,
    run_step_hashes,
    steps_until_the_helper_serves,
)
from zephon_stream import Stream, StreamingLoader
from zephon_stream.errors import ConfigError, CorruptBlockError, ObjectMissingError, StateMismatchError

SEQ_LEN = 256  # 4097-token blocks hold 16 samples


def loader_for(url, **kwargs):
    kwargs.setdefault("seq_len", SEQ_LEN)
    kwargs.setdefault("local_batch_size", 8)
    kwargs.setdefault("num_fetch_threads", 2)
    return StreamingLoader(url, **kwargs)


def open_fds():
    return set(os.listdir("/proc/self/fd"))


def test_every_row_is_the_sample_at_its_plan_address(small_dataset):
    reader = DirectReader([small_dataset.url])
    eos = small_dataset.manifest.tokenizer.eos_id
    with loader_for(small_dataset.url, local_batch_size=4, world_size=2, rank=1, seed=3) as loader:
        for step, batch in zip(range(40), loader):
            assert {k: (v.dtype, tuple(v.shape)) for k, v in batch.items()} == {
                "input": (torch.int64, (4, SEQ_LEN)),
                "labels": (torch.int64, (4, SEQ_LEN)),
                "positions": (torch.int64, (4, SEQ_LEN)),
                "sample_positions": (torch.int64, (4,)),
            }
            piece = loader.order.rank_slice(step * 8, 8, 2, 1)
            np.testing.assert_array_equal(batch["sample_positions"].numpy(), piece.positions)
            for row in range(4):
                tokens = reader.sample(int(piece.stream[row]), int(piece.block[row]), int(piece.sample[row]), SEQ_LEN)
                np.testing.assert_array_equal(batch["input"][row].numpy(), tokens[:-1])
                np.testing.assert_array_equal(batch["labels"][row].numpy(), tokens[1:])
            np.testing.assert_array_equal(batch["positions"].numpy(), reference_positions(batch["input"].numpy(), eos))
        assert loader.state_dict()["position"] == 40 * 8
    reader.close()


def test_ranks_driven_from_one_process_cover_the_single_rank_run(small_dataset):
    with loader_for(small_dataset.url, local_batch_size=12) as single:
        expected = run_step_hashes([single], 30)
    for world in (2, 3, 4):
        loaders = [
            loader_for(small_dataset.url, local_batch_size=12 // world, world_size=world, rank=r) for r in range(world)
        ]
        try:
            assert run_step_hashes(loaders, 30) == expected, f"world size {world}"
        finally:
            for loader in loaders:
                loader.close()


def test_resume_at_mid_block_mid_shard_and_epoch_boundary_is_exact(small_dataset):
    with loader_for(small_dataset.url) as probe:
        points = resume_points(probe.order, 8, small_dataset.manifest)
    last = max(points.values()) + 6
    with loader_for(small_dataset.url, seed=11) as loader:
        full = run_step_hashes([loader], last)
        progress = loader.progress()
    assert progress[0]["epoch"] >= 1
    for name, step in points.items():
        with loader_for(small_dataset.url, seed=11) as first:
            run_step_hashes([first], step)
            state = first.state_dict()
        assert state["position"] == step * 8
        # resume at another world size with the same global batch
        resumed = [loader_for(small_dataset.url, seed=11, local_batch_size=4, world_size=2, rank=r) for r in range(2)]
        try:
            for loader in resumed:
                loader.load_state_dict(state)
            assert run_step_hashes(resumed, last - step) == full[step:], name
        finally:
            for loader in resumed:
                loader.close()


def test_load_state_dict_refuses_another_config_naming_each_field(small_dataset, small_bpe_dataset):
    with loader_for(small_dataset.url, seed=1) as loader:
        state = loader.state_dict()
    with loader_for(small_bpe_dataset.url, seed=2, seq_len=128, lanes=8) as other:
        with pytest.raises(StateMismatchError) as info:
            other.load_state_dict(state)
    message = str(info.value)
    assert "dataset fingerprints" in message and "seed: checkpoint has 1, this loader has 2" in message
    assert "seq_len: checkpoint has 256, this loader has 128" in message


def test_state_keeps_the_first_lanes_when_the_global_batch_changes(small_dataset):
    with loader_for(small_dataset.url) as loader:  # B = C = 8
        run_step_hashes([loader], 5)
        state = loader.state_dict()
        continued = [next(loader) for _ in range(2)]
    with loader_for(small_dataset.url, local_batch_size=4) as half:  # B = 4, lanes from the state
        half.load_state_dict(state)
        assert half.lanes == 8
        rows = [next(half) for _ in range(4)]
    got = np.concatenate([b["sample_positions"].numpy() for b in rows])
    want = np.concatenate([b["sample_positions"].numpy() for b in continued])
    np.testing.assert_array_equal(np.sort(got), np.sort(want))
    got_inputs = {int(p): r.tobytes() for b in rows for p, r in zip(b["sample_positions"], b["input"].numpy())}
    for b in continued:
        for p, r in zip(b["sample_positions"], b["input"].numpy()):
            assert got_inputs[int(p)] == r.tobytes()


def test_two_weighted_streams_have_exact_proportions_and_progress(small_dataset, small_bpe_dataset):
    streams = [Stream(small_bpe_dataset.url, weight=3), Stream(small_dataset.url, weight=1)]
    reader = DirectReader([small_bpe_dataset.url, small_dataset.url])
    with StreamingLoader(streams, seq_len=128, local_batch_size=8, num_fetch_threads=2) as loader:
        plans = loader.order.streams
        assert [p.lanes for p in plans] == [6, 2]
        steps = plans[0].lane_length + 3  # stream 0 rolls into its second epoch, stream 1 does not
        assert plans[1].lane_length > steps
        for step, batch in zip(range(steps), loader):
            stream, block, sample = loader.order.sample_at(batch["sample_positions"].numpy())
            assert np.bincount(stream, minlength=2).tolist() == [6, 2]
            if step % 7 == 0 or step == steps - 1:
                for row in range(8):
                    tokens = reader.sample(int(stream[row]), int(block[row]), int(sample[row]), 128)
                    np.testing.assert_array_equal(batch["input"][row].numpy(), tokens[:-1])
        progress = loader.progress()
        assert [p["samples"] for p in progress] == [6 * steps, 2 * steps]
        assert [p["epoch"] for p in progress] == [1, 0]
        state = loader.state_dict()
        assert state["weights"] == ["3", "1"] and state["lane_counts"] == [6, 2]
        assert state["position"] == 8 * steps
    reader.close()


def test_a_mixture_written_as_dicts_pairs_or_url_weight_strings_reads_as_its_streams(small_dataset, small_bpe_dataset):
    web, code = small_bpe_dataset.url, small_dataset.url
    forms = [
        [Stream(web, weight=3), Stream(code, weight=1)],
        [{"url": web, "weight": 3}, {"url": code}],
        [(web, 3), (code, 1)],
        [f"{web}:3", code],  # The "url:weight" entries of the TorchTitan configs
    ]
    firsts = []
    for streams in forms:
        with StreamingLoader(streams, seq_len=128, local_batch_size=8, pipeline="threads") as loader:
            state = loader.state_dict()
            assert state["weights"] == ["3", "1"] and state["lane_counts"] == [6, 2], streams
            firsts.append(next(loader)["input"])
    assert all(torch.equal(first, firsts[0]) for first in firsts[1:])


def test_one_stream_given_as_a_dict_a_pair_a_path_or_url_weight_reads_that_dataset(small_dataset, tmp_path):
    url = small_dataset.url
    with StreamingLoader(url, seq_len=128, local_batch_size=4, pipeline="threads") as loader:
        want = next(loader)["input"]
    # A path with ':' whose suffix is no number is a path; one whose suffix is a
    # number is named as a Stream or a path object, which are never split.
    named = shutil.copytree(url, tmp_path / "run:v2")
    numbered = shutil.copytree(url, tmp_path / "run:3")
    for streams in (
        [{"url": url}],
        [(url, 2)],
        [f"{url}:2"],
        {"url": url, "weight": 1.5},
        (url, 2),
        f"{url}:2",
        str(named),
        [named],
        Stream(str(numbered)),
        numbered,
    ):
        with StreamingLoader(streams, seq_len=128, local_batch_size=4, pipeline="threads") as loader:
            assert torch.equal(next(loader)["input"], want), streams


def test_url_weight_strings_split_only_at_a_numeric_suffix_after_the_last_colon():
    from zephon_stream.loader.blocks.streams import as_streams, parse_stream_spec

    assert parse_stream_spec("s3://bucket/data/web:0.7") == ("s3://bucket/data/web", 0.7)
    assert parse_stream_spec("s3://bucket/data/web") == ("s3://bucket/data/web", 1.0)
    assert parse_stream_spec("az://container/ds:2") == ("az://container/ds", 2.0)
    assert parse_stream_spec("file:///data/code") == ("file:///data/code", 1.0)
    assert parse_stream_spec("/data/run:v2") == ("/data/run:v2", 1.0)
    assert parse_stream_spec("/data/a:1/b") == ("/data/a:1/b", 1.0)
    assert as_streams(["gs://b/web:3", "/data/run:v2"]) == [Stream("gs://b/web", 3.0), Stream("/data/run:v2")]


@pytest.mark.parametrize(
    "streams",
    [[object()], 42, None, [b"./out/ds"], [("./out/ds", "2")], [["./out/ds", 2, 3]], {"./out/ds", "./out/web"}],
)
def test_a_stream_in_no_accepted_form_is_a_type_error_naming_the_forms(streams):
    forms = r"is no stream; give a dataset URL or path .*a Stream, a dict of a Stream's fields .*a \(url, weight\) pair"
    with pytest.raises(TypeError, match=forms + ", or a list of these") as raised:
        StreamingLoader(streams, seq_len=128, local_batch_size=4)
    assert "no committed dataset" not in str(raised.value)


def test_a_stream_dict_with_other_keys_or_a_bad_weight_is_refused_naming_it():
    with pytest.raises(
        ConfigError,
        match=r"stream 0: a dict of a Stream's fields needs 'url' and may hold "
        r"\['url', 'weight'\] \(got keys \['path', 'weight'\]\)",
    ):
        StreamingLoader([{"path": "./out/ds", "weight": 2}], seq_len=128, local_batch_size=4)
    with pytest.raises(ConfigError, match=r"weight must be a finite number > 0 \(got inf\)"):
        StreamingLoader([("./out/ds", float("inf"))], seq_len=128, local_batch_size=4)
    with pytest.raises(ConfigError, match=r"stream entry './out/ds:0': weight must be a positive number"):
        StreamingLoader(["./out/ds:0"], seq_len=128, local_batch_size=4)


def test_max_steps_ends_the_run_and_counts_from_the_cursor(small_dataset):
    with loader_for(small_dataset.url, max_steps=5) as loader:
        assert len(list(loader)) == 5
        state = loader.state_dict()
    with loader_for(small_dataset.url, max_steps=5) as again:
        next(again), next(again)
        again.load_state_dict({**state, "position": 2 * 8})
        assert len(list(again)) == 3


def test_memory_bound_is_computed_and_a_config_over_the_cap_is_refused(small_dataset):
    with loader_for(small_dataset.url) as loader:
        bound = loader.memory_bound
        assert loader.memory_bound_bytes == bound.total_bytes > 0
        assert bound.block_bytes == 4097 * 1 * 2 or bound.block_bytes == 4097  # uint16 tokens
    with pytest.raises(ConfigError, match="memory bound .* exceeds max_memory_bytes=100000.*prefetch_steps"):
        loader_for(small_dataset.url, max_memory_bytes=100_000)
    with loader_for(small_dataset.url, max_memory_bytes=bound.total_bytes) as fits:
        next(fits)


def test_a_global_batch_over_an_epoch_names_local_batch_size_and_world_size_or_the_lanes_set(small_dataset):
    # About 600 samples of seq_len 512 an epoch, and no lanes given: they are the global batch, 1024.
    with pytest.raises(ConfigError) as info:
        StreamingLoader(small_dataset.url, seq_len=512, local_batch_size=128, rank=0, world_size=8, pipeline="threads")
    said = re.fullmatch(
        rf"stream 0 \({re.escape(small_dataset.url)}\): (\d+) samples of seq_len 512 per epoch, fewer than the "
        r"global batch of 1024 \(local_batch_size 128 x world size 8\), which gives the lanes when lanes is not set; "
        r"lower local_batch_size or seq_len",
        str(info.value),
    )
    assert said is not None and 0 < int(said.group(1)) < 1024, str(info.value)
    with pytest.raises(ConfigError, match=r"per epoch, fewer than its 2048 lanes; lower the lanes or seq_len$"):
        StreamingLoader(
            small_dataset.url, seq_len=512, local_batch_size=16, rank=0, world_size=8, lanes=2048, pipeline="threads"
        )


def process_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_close_stops_every_thread_and_releases_file_handles(small_dataset):
    threads, fds = set(threading.enumerate()), open_fds()
    loader = loader_for(small_dataset.url, num_fetch_threads=3, num_decode_threads=2, pipeline="threads")
    for _ in zip(range(10), loader):
        pass
    assert len(set(threading.enumerate()) - threads) == 3 + 2 + 1
    loader.close()
    loader.close()
    assert set(threading.enumerate()) - threads == set()
    # A batch still held keeps the ring's mapping (and its descriptor)
    # alive, as it must: its tensors are views of the ring.
    del _
    assert open_fds() == fds
    with pytest.raises(RuntimeError, match="closed"):
        next(loader)


def test_the_helper_process_runs_the_pipeline_and_close_ends_it(small_dataset):
    threads, fds = set(threading.enumerate()), open_fds()
    loader = loader_for(small_dataset.url, num_fetch_threads=3, num_decode_threads=2)
    assert loader.pipeline_mode == "process" and loader.helper_pid is None  # Nothing runs before the first step
    steps_until_the_helper_serves(loader)
    for _ in zip(range(10), loader):
        pass
    pid = loader.helper_pid
    assert process_alive(pid)
    # Fetch, decode and assembly run in the helper: no thread of this
    # process (those that served the first steps have stopped).
    assert set(threading.enumerate()) - threads == set()
    loader.close()
    loader.close()
    assert not process_alive(pid)
    del _  # The last batch is a view of the ring
    assert open_fds() == fds


def test_stats_count_fetches_decodes_hits_and_stalls(small_dataset):
    with loader_for(small_dataset.url, prefetch_steps=2) as loader:
        for _ in zip(range(20), loader):
            pass
        stats = loader.stats()
    assert stats["steps"] == 20 and stats["samples"] == 160
    # Blocks for later steps may still be in flight when the counters are read.
    assert 0 < stats["blocks_decoded"] <= stats["blocks_fetched"] <= stats["cache_misses"]
    assert stats["bytes_fetched"] > 0 and stats["cache_hits"] > 0 and stats["retries"] == 0
    assert stats["stall_s"] >= 0 and stats["stall_s_per_step"] == pytest.approx(stats["stall_s"] / 20)


def copy_dataset(src, dst):
    shutil.copytree(src, dst)
    return str(dst)


def test_a_corrupt_block_is_named_in_the_consumer_and_never_returned(small_dataset, tmp_path):
    url = copy_dataset(small_dataset.url, tmp_path / "data")
    reader = DirectReader([small_dataset.url])
    with loader_for(url) as probe:
        blocks = [set(probe.order.rank_slice(k * 8, 8, 1, 0).block.tolist()) for k in range(200)]
    # The first step after the first few that needs a block no earlier step read.
    first_bad = next(k for k in range(5, 200) if blocks[k] - set().union(*blocks[:k]))
    target = min(blocks[first_bad] - set().union(*blocks[:first_bad]))
    path, start, end = small_dataset.manifest.block_byte_range(target)
    shard, in_shard = small_dataset.manifest.block_location(target)
    raw = bytearray((tmp_path / "data" / path).read_bytes())
    raw[(start + end) // 2] ^= 0x55
    (tmp_path / "data" / path).write_bytes(bytes(raw))
    delivered = 0
    with loader_for(url) as loader:
        with pytest.raises(CorruptBlockError) as info:
            for batch in loader:
                stream, block, sample = loader.order.sample_at(batch["sample_positions"].numpy())
                assert target not in block.tolist()
                for row in range(8):
                    np.testing.assert_array_equal(
                        batch["input"][row].numpy(), reader.sample(0, int(block[row]), int(sample[row]), SEQ_LEN)[:-1]
                    )
                delivered += 1
        assert loader.state_dict()["position"] == delivered * 8
    assert delivered == first_bad
    assert f"{path} block {in_shard}" in str(info.value)
    reader.close()


def test_a_missing_shard_is_named(small_dataset, tmp_path):
    url = copy_dataset(small_dataset.url, tmp_path / "data")
    with loader_for(url) as probe:
        block = int(probe.order.rank_slice(0, 8, 1, 0).block[0])
    path, _, _ = small_dataset.manifest.block_byte_range(block)
    os.remove(tmp_path / "data" / path)
    with loader_for(url) as loader:
        with pytest.raises(ObjectMissingError, match=path.replace(".", r"\.")):
            next(loader)


def test_dcp_save_and_load_round_trip_in_one_process(small_dataset, tmp_path):
    import torch.distributed.checkpoint as dcp

    with loader_for(small_dataset.url, seed=5) as loader:
        run_step_hashes([loader], 7)
        dcp.save({"dataloader": loader}, checkpoint_id=str(tmp_path / "ckpt"))
        expected = run_step_hashes([loader], 3)
    with loader_for(small_dataset.url, seed=5, local_batch_size=2, world_size=4, rank=0) as fresh:
        dcp.load({"dataloader": fresh}, checkpoint_id=str(tmp_path / "ckpt"))
        assert fresh.state_dict()["position"] == 7 * 8
    resumed = [loader_for(small_dataset.url, seed=5, local_batch_size=2, world_size=4, rank=r) for r in range(4)]
    try:
        for loader in resumed:
            dcp.load({"dataloader": loader}, checkpoint_id=str(tmp_path / "ckpt"))
        assert run_step_hashes(resumed, 3) == expected
    finally:
        for loader in resumed:
            loader.close()


def test_batches_the_consumer_keeps_are_never_overwritten(small_dataset):
    with loader_for(small_dataset.url, prefetch_steps=2) as loader:
        kept = [next(loader) for _ in range(3)]
        views = [next(loader)["labels"][1:3]]  # a view alone keeps its batch alive
        copies = [{k: v.clone() for k, v in b.items()} for b in kept]
        view_copy = views[0].clone()
        for _ in zip(range(30), loader):
            pass
        for batch, copy in zip(kept, copies):
            for key in batch:
                assert torch.equal(batch[key], copy[key])
        assert torch.equal(views[0], view_copy)


def test_delivery_is_exposed_read_only_and_matches_the_device(small_dataset):
    with loader_for(small_dataset.url) as loader:
        assert loader.memory_bound.ring_bytes == loader.ring.nbytes > 0
        with pytest.raises(AttributeError):
            loader.delivery = None
        batch = next(loader)
        assert batch["input"].device.type == loader.device.type == "cpu"


@pytest.mark.parametrize("window", [0, 5])
def test_one_epoch_fetches_each_block_once_per_lane_reading_it(small_dataset, window):
    with loader_for(small_dataset.url, window=window) as probe:
        steps = probe.order.streams[0].lane_length
        readers = {}
        for k in range(steps):
            piece = probe.order.rank_slice(k * 8, 8, 1, 0)
            for position, block in zip(piece.positions.tolist(), piece.block.tolist()):
                readers.setdefault(block, set()).add(position % 8)
    # One producer run (threads): a helper taking a run over from
    # threads fetches the blocks in use again, which the totals count.
    with loader_for(small_dataset.url, window=window, max_steps=steps, pipeline="threads") as loader:
        assert len(list(loader)) == steps
        stats = loader.stats()
    # A block cut by a lane boundary is read at the start of one lane and
    # the end of the previous one; it is fetched once for each unless the
    # planned horizon still covers its second use.
    assert len(readers) <= stats["blocks_fetched"] <= sum(len(lanes) for lanes in readers.values())
    assert sum(len(lanes) > 1 for lanes in readers.values()) <= 7


def test_rows_of_a_whole_block_equal_the_direct_read(small_dataset):
    # seq_len 4096 of 4097-token blocks: each sample is a whole block.
    reader = DirectReader([small_dataset.url])
    eos = small_dataset.manifest.tokenizer.eos_id
    with loader_for(small_dataset.url, seq_len=4096, local_batch_size=8) as loader:
        for step, batch in zip(range(6), loader):
            piece = loader.order.rank_slice(step * 8, 8, 1, 0)
            for row in range(8):
                tokens = reader.sample(int(piece.stream[row]), int(piece.block[row]), int(piece.sample[row]), 4096)
                np.testing.assert_array_equal(batch["input"][row].numpy(), tokens[:-1])
                np.testing.assert_array_equal(batch["labels"][row].numpy(), tokens[1:])
            np.testing.assert_array_equal(batch["positions"].numpy(), reference_positions(batch["input"].numpy(), eos))
    reader.close()


def test_a_loader_dropped_without_close_stops_its_threads_and_helper(small_dataset):
    import gc

    threads = set(threading.enumerate())
    loader = loader_for(small_dataset.url, pipeline="threads")
    next(loader)
    assert set(threading.enumerate()) - threads
    del loader
    gc.collect()
    assert set(threading.enumerate()) - threads == set()
    loader = loader_for(small_dataset.url)
    steps_until_the_helper_serves(loader)
    pid = loader.helper_pid
    del loader
    gc.collect()
    assert not process_alive(pid)


def test_lanes_that_do_not_divide_the_batch_stay_within_the_cache_bound(small_dataset):
    # C = 12, B = 8: the lanes each rank reads rotate from step to step.
    with loader_for(small_dataset.url, lanes=12, local_batch_size=4, world_size=2, rank=1) as loader:
        assert loader.memory_bound.resident_blocks >= 4
        for _ in zip(range(150), loader):
            pass
        stats = loader.stats()
    assert stats["cache_forced_reservations"] == 0
    assert 0 < stats["cache_peak_bytes"] <= stats["cache_capacity_bytes"]
    # The producer publishes its counters in a fixed order; each lands under its own name.
    assert stats["cache_capacity_bytes"] == loader.memory_bound.cache_bytes
    assert 0 < stats["cache_resident_bytes"] <= stats["cache_peak_bytes"]
    assert 0 < stats["blocks_decoded"] <= stats["blocks_fetched"] <= stats["cache_misses"]  # Some may be in flight
    assert stats["retries"] == stats["storage_errors"] == 0
