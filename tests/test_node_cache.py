"""The node-local metadata cache under real concurrent processes: one fetch per
key per node, no wrong read after a rank dies mid-fetch or mid-write, and
nothing left behind once its users are gone (closed or SIGKILLed)."""

from __future__ import annotations

import hashlib
import multiprocessing as mp
import os
import resource
import signal
import threading
import time
from pathlib import Path

import pytest

from fixtures_stores import new_bucket
from tools.fault_proxy import FaultProxy
from tools.reliability.common import step_hashes
from zephon_stream import StreamingLoader
from zephon_stream.storage import copy_dataset
from zephon_stream.storage.node_cache import OBJECTS, TMP, USERS, NodeCache, key_file_name, node_cache_root

# Fork, not spawn: a spawned child spends ~0.5 s of CPU on imports, and
# seventeen of them made this file slow on a busy 2-core machine.
CTX = mp.get_context("fork")
KEYS = ["manifest/s3://bucket/data/ds", "index/3f2a9c/blocks/0", "index/3f2a9c/blocks/1", "index/3f2a9c/shards/0"]


def payload(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest() * 300 + key.encode()


def counting_fetch(key: str, log: str, delay_s: float = 0.0):
    def fetch() -> bytes:
        # One short O_APPEND write per fetch is atomic, so the log counts
        # fetches across processes without a lock.
        fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, f"{key}\t{os.getpid()}\n".encode())
        finally:
            os.close(fd)
        time.sleep(delay_s)
        return payload(key)

    return fetch


def fetch_counts(log: Path) -> dict[str, int]:
    counts: dict[str, int] = {}
    for line in log.read_text().splitlines() if log.exists() else []:
        key = line.split("\t")[0]
        counts[key] = counts.get(key, 0) + 1
    return counts


def wait_for(path: Path, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} did not appear in {timeout_s} s"
        time.sleep(0.01)


def join_all(procs, timeout_s: float = 60.0) -> None:
    for proc in procs:
        proc.join(timeout_s)
        assert proc.exitcode is not None, f"{proc.name} still running"


# -- children ---------------------------------------------------------------


def ask_all_keys(root: str, log: str, barrier, results) -> None:
    with NodeCache(root) as cache:
        barrier.wait(60)
        got = {key: cache.get(key, counting_fetch(key, log, delay_s=0.05)) == payload(key) for key in KEYS}
        # Nobody closes before everyone has asked: the users overlap throughout.
        barrier.wait(60)
        results.put((got, cache.stats()))


def fetch_forever(root: str, key: str, started: str) -> None:
    cache = NodeCache(root)

    def fetch() -> bytes:
        Path(started).touch()
        time.sleep(600)
        return b"never"

    cache.get(key, fetch)


def die_mid_write(root: str, key: str, limit_bytes: int) -> None:
    cache = NodeCache(root)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    signal.signal(signal.SIGXFSZ, signal.SIG_DFL)  # Python starts with it ignored.
    # Past this size the kernel kills the process with SIGXFSZ inside the
    # temporary file's write, key lock held: a death mid-write, not a simulation.
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit_bytes, limit_bytes))
    cache.get(key, lambda: payload(key) * 50)


def fill_and_hang(root: str, ready: str) -> None:
    cache = NodeCache(root)
    for key in KEYS:
        cache.get(key, lambda key=key: payload(key))
    Path(ready).touch()
    time.sleep(600)


def open_get_close_loop(root: str, duration_s: float, barrier, results) -> None:
    rounds = wrong = 0
    barrier.wait(60)
    until = time.monotonic() + duration_s
    try:
        while time.monotonic() < until:
            with NodeCache(root) as cache:
                wrong += cache.get(KEYS[1], lambda: payload(KEYS[1])) != payload(KEYS[1])
            rounds += 1
    except BaseException as exc:  # noqa: BLE001 - sent back to the test
        results.put((rounds, repr(exc)))
        raise
    results.put((rounds, wrong))


def use_inherited(cache: NodeCache, results) -> None:
    try:
        cache.get(KEYS[0], lambda: payload(KEYS[0]))
        results.put("served")
    except ValueError as exc:
        results.put(("refused", cache.closed, str(exc)))
    cache.close()


# -- tests -------------------------------------------------------------------


@pytest.mark.slow
def test_eight_processes_asking_at_once_fetch_each_key_once_and_all_read_it(tmp_path):
    root, log = tmp_path / "node", tmp_path / "fetches.log"
    barrier, results = CTX.Barrier(8), CTX.Queue()
    procs = [CTX.Process(target=ask_all_keys, args=(str(root), str(log), barrier, results)) for _ in range(8)]
    for proc in procs:
        proc.start()
    answers = [results.get(timeout=60) for _ in procs]
    join_all(procs)
    assert [proc.exitcode for proc in procs] == [0] * 8
    assert fetch_counts(log) == dict.fromkeys(KEYS, 1)
    assert all(all(got.values()) for got, _ in answers)
    assert sum(stats["fetches"] for _, stats in answers) == len(KEYS)
    assert sum(stats["hits"] for _, stats in answers) == 7 * len(KEYS)
    assert not root.exists(), "the last user removes the root the cache made"


@pytest.mark.slow
def test_a_rank_sigkilled_holding_a_key_lets_a_waiting_rank_fetch_it(tmp_path):
    root, log, started = tmp_path / "node", tmp_path / "fetches.log", tmp_path / "started"
    with NodeCache(root) as cache:
        victim = CTX.Process(target=fetch_forever, args=(str(root), KEYS[0], str(started)))
        victim.start()
        wait_for(started)
        killer = threading.Timer(0.3, os.kill, (victim.pid, signal.SIGKILL))
        killer.start()
        try:
            # The victim holds the key's lock now, so this call waits for it.
            assert cache.get(KEYS[0], counting_fetch(KEYS[0], str(log))) == payload(KEYS[0])
        finally:
            killer.join()
            join_all([victim])
        assert victim.exitcode == -signal.SIGKILL
        assert cache.stats()["waits"] == 1 and fetch_counts(log) == {KEYS[0]: 1}
        assert cache.get(KEYS[0], counting_fetch(KEYS[0], str(log))) == payload(KEYS[0])
        assert fetch_counts(log) == {KEYS[0]: 1}
    assert not root.exists()


@pytest.mark.slow
def test_a_rank_killed_mid_write_leaves_no_temporary_file_and_no_wrong_read(tmp_path):
    root, log = tmp_path / "node", tmp_path / "fetches.log"
    with NodeCache(root) as cache:
        victim = CTX.Process(target=die_mid_write, args=(str(root), KEYS[2], 4096))
        victim.start()
        join_all([victim])
        assert victim.exitcode == -signal.SIGXFSZ
        partial = list((root / TMP).iterdir())
        assert [p.stat().st_size for p in partial] == [4096], "the victim died with half an object written"
        assert not (root / OBJECTS / key_file_name(KEYS[2])).exists()
        assert cache.get(KEYS[2], counting_fetch(KEYS[2], str(log))) == payload(KEYS[2])
        assert list((root / TMP).iterdir()) == []
        assert fetch_counts(log) == {KEYS[2]: 1}
    assert not root.exists()


def test_after_every_user_closes_only_the_users_own_files_remain(tmp_path):
    root = tmp_path / "named"
    root.mkdir()
    (root / "mine.txt").write_text("not the cache's")
    first, second = NodeCache(root), NodeCache(root)
    for key in KEYS:
        first.get(key, lambda key=key: payload(key))
        assert second.get(key, lambda: b"unused") == payload(key)
    first.close()
    assert second.get(KEYS[0], lambda: b"unused") == payload(KEYS[0]), "one user left: the objects stay"
    second.close()
    second.close()
    assert sorted(os.listdir(root)) == ["mine.txt"]
    with pytest.raises(ValueError, match="closed"):
        second.get(KEYS[0], lambda: b"")


@pytest.mark.slow
def test_when_every_user_was_sigkilled_the_next_opener_wipes_their_files(tmp_path):
    root, log = tmp_path / "node", tmp_path / "fetches.log"
    readies = [tmp_path / f"ready-{i}" for i in range(3)]
    procs = [CTX.Process(target=fill_and_hang, args=(str(root), str(ready))) for ready in readies]
    for proc in procs:
        proc.start()
    try:
        for ready in readies:
            wait_for(ready)
    finally:
        for proc in procs:
            os.kill(proc.pid, signal.SIGKILL)
        join_all(procs)
    assert len(os.listdir(root / USERS)) == 3 and len(os.listdir(root / OBJECTS)) == len(KEYS)
    with NodeCache(root) as cache:
        assert len(os.listdir(root / USERS)) == 1 and os.listdir(root / OBJECTS) == []
        assert cache.get(KEYS[0], counting_fetch(KEYS[0], str(log))) == payload(KEYS[0])
    assert fetch_counts(log) == {KEYS[0]: 1}
    assert not root.exists()


@pytest.mark.slow
def test_users_opening_and_closing_in_a_loop_never_read_wrong_bytes_or_leak(tmp_path):
    root, results, barrier = tmp_path / "node", CTX.Queue(), CTX.Barrier(4)
    duration_s = float(os.environ.get("ZS_NODE_CACHE_LOOP_S", "1.5"))
    procs = [CTX.Process(target=open_get_close_loop, args=(str(root), duration_s, barrier, results)) for _ in range(4)]
    for proc in procs:
        proc.start()
    answers = [results.get(timeout=60) for _ in procs]
    join_all(procs)
    assert [wrong for _, wrong in answers] == [0] * 4, answers
    assert all(rounds >= 1 for rounds, _ in answers), answers
    assert not root.exists()


@pytest.mark.parametrize("damage", ["flipped byte", "truncated", "empty"])
def test_a_corrupt_or_truncated_cached_file_is_dropped_and_fetched_again(tmp_path, damage):
    log = tmp_path / "fetches.log"
    with NodeCache(tmp_path / "node") as cache:
        cache.get(KEYS[1], counting_fetch(KEYS[1], str(log)))
        stored = tmp_path / "node" / OBJECTS / key_file_name(KEYS[1])
        blob = bytearray(stored.read_bytes())
        blob[len(blob) // 2] ^= 0x01
        damaged = {"flipped byte": bytes(blob), "truncated": stored.read_bytes()[:-10], "empty": b""}[damage]
        stored.write_bytes(damaged)
        assert cache.get(KEYS[1], counting_fetch(KEYS[1], str(log))) == payload(KEYS[1])
        assert fetch_counts(log) == {KEYS[1]: 2} and cache.stats()["dropped"] == 1
        assert cache.get(KEYS[1], counting_fetch(KEYS[1], str(log))) == payload(KEYS[1])
        assert fetch_counts(log) == {KEYS[1]: 2}


def test_a_fetch_that_raises_reaches_its_caller_and_the_next_caller_fetches_again(tmp_path):
    def failing() -> bytes:
        raise ConnectionError("store down")

    with NodeCache(tmp_path / "node") as cache:
        with pytest.raises(ConnectionError, match="store down"):
            cache.get(KEYS[0], failing)
        assert os.listdir(tmp_path / "node" / OBJECTS) == [] and os.listdir(tmp_path / "node" / TMP) == []
        assert cache.get(KEYS[0], lambda: payload(KEYS[0])) == payload(KEYS[0])
        assert cache.stats()["fetches"] == 1
        with pytest.raises(TypeError, match="not bytes"):
            cache.get(KEYS[1], lambda: "text")


def test_past_max_bytes_get_returns_the_fetched_bytes_without_storing_them(tmp_path):
    with NodeCache(tmp_path / "node", max_bytes=len(payload(KEYS[0])) + 100) as cache:
        assert cache.get(KEYS[0], lambda: payload(KEYS[0])) == payload(KEYS[0])
        assert cache.get(KEYS[1], lambda: payload(KEYS[1])) == payload(KEYS[1])
        assert cache.get(KEYS[1], lambda: payload(KEYS[1])) == payload(KEYS[1])
        assert cache.stats() == {
            "hits": 0,
            "fetches": 3,
            "waits": 0,
            "bytes": len(payload(KEYS[0])),
            "not_stored": 2,
            "dropped": 0,
        }


def test_keys_are_validated_and_odd_or_long_keys_become_hashed_file_names():
    assert key_file_name("index/3f2a9c/blocks/7") == "index~3f2a9c~blocks~7"
    for odd in ("s3://bucket/ds?X-Amz-Signature=secret", "a" * 200, "a//b", ".hidden", "ü"):
        name = key_file_name(odd)
        assert name.startswith("=") and len(name) == 41 and "secret" not in name
    assert key_file_name("a/b") != key_file_name("a~b")
    for bad in ("", "line\nbreak", "nul\x00", "x" * 5000, 7):
        with pytest.raises(ValueError, match="node cache key"):
            key_file_name(bad)


def test_a_forked_child_can_neither_use_nor_deregister_its_parents_cache(tmp_path):
    root, results = tmp_path / "node", mp.get_context("fork").Queue()
    with NodeCache(root) as cache:
        child = mp.get_context("fork").Process(target=use_inherited, args=(cache, results))
        child.start()
        answer = results.get(timeout=30)
        join_all([child])
        assert answer[:2] == ("refused", True), answer
        assert len(os.listdir(root / USERS)) == 1 and not cache.closed
        assert cache.get(KEYS[0], lambda: payload(KEYS[0])) == payload(KEYS[0])
    assert not root.exists()


def test_node_cache_root_follows_explicit_then_env_then_torchrun_local_world_size(tmp_path):
    uid = os.getuid()
    assert node_cache_root({}) is None
    assert node_cache_root({"LOCAL_WORLD_SIZE": "1"}) is None
    shared = node_cache_root({"LOCAL_WORLD_SIZE": "8"})
    base = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
    assert shared is not None and os.path.basename(shared) == f"zephon-node-cache-{uid}"
    if base:
        assert os.path.dirname(shared) == base
    assert node_cache_root({"ZEPHON_NODE_CACHE": str(tmp_path)}) == str(tmp_path)
    assert node_cache_root({"ZEPHON_NODE_CACHE": str(tmp_path), "LOCAL_WORLD_SIZE": "8"}) == str(tmp_path)
    assert node_cache_root({"ZEPHON_NODE_CACHE": str(tmp_path)}, explicit="/local/nc") == "/local/nc"
    with pytest.raises(ValueError, match="LOCAL_WORLD_SIZE"):
        node_cache_root({"LOCAL_WORLD_SIZE": "eight"})


def test_the_folders_and_files_the_cache_makes_are_private_to_this_user(tmp_path):
    # Not the default folder under /dev/shm: a loader of another test may be using it.
    root = tmp_path / "node"
    with NodeCache(root) as cache:
        info = os.stat(root)
        assert info.st_uid == os.getuid() and info.st_mode & 0o077 == 0
        cache.get(KEYS[0], lambda: payload(KEYS[0]))
        made = [Path(d, n) for d, ds, ns in os.walk(root) for n in ds + ns]
        assert len(made) >= 6 and all(path.stat().st_mode & 0o077 == 0 for path in made)
    assert not os.path.exists(root)


def test_two_ranks_of_a_node_read_the_metadata_once_and_deliver_what_they_deliver_alone(
    tmp_path, seaweedfs_server, small_dataset
):
    """Rank 1 opening after rank 0 on the same node makes no metadata request of its own, and both deliver the
    batches each delivers without the cache."""
    env = new_bucket("seaweedfs", seaweedfs_server)
    url = env.url("ds")
    copy_dataset(small_dataset.url, url, dst_options=env.storage_options)
    settings = {"seq_len": 256, "local_batch_size": 6, "seed": 3, "world_size": 2, "pipeline": "threads"}
    with FaultProxy(upstream=seaweedfs_server.endpoint_url) as proxy:
        options = env.options_via(proxy.endpoint_url)
        alone = []
        for rank in (0, 1):
            with StreamingLoader(url, storage_options=options, rank=rank, node_cache=False, **settings) as loader:
                alone.append(step_hashes(loader, 6))
        before = proxy.counts()["requests"]
        with StreamingLoader(
            url, storage_options=options, rank=0, node_cache=str(tmp_path / "nc"), **settings
        ) as first:
            first_requests = proxy.counts()["requests"] - before
            with StreamingLoader(
                url, storage_options=options, rank=1, node_cache=str(tmp_path / "nc"), **settings
            ) as second:
                second_requests = proxy.counts()["requests"] - before - first_requests
                shared = [step_hashes(first, 6), step_hashes(second, 6)]
    assert first_requests > 0, "rank 0 read nothing from the store while opening; the test proves nothing"
    assert second_requests == 0, f"rank 1 made {second_requests} requests of its own while opening"
    assert shared == alone
    assert not (tmp_path / "nc").exists() or not any((tmp_path / "nc").rglob("*")), "the cache left files"
