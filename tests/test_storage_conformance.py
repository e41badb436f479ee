"""One conformance suite run against every backend: a local folder, S3 on a moto
server, and S3 through a proxy injecting 20% faults. Each backend must give
the same answers; the faulty one only takes retries to do it."""

from __future__ import annotations

import os
import pickle
import threading
from collections.abc import Callable, Iterator
from functools import partial

import pytest

from zephon_stream.errors import ObjectMissingError, PathEscapeError, TruncatedObjectError
from zephon_stream.storage import LocalStore, RetryPolicy, Store, open_store

FAST_RETRY = RetryPolicy(max_attempts=30, initial_backoff_s=0.005, max_backoff_s=0.05, timeout_s=60, read_timeout_s=5)
FAULT_RATES = {"error_500": 0.05, "error_503": 0.05, "reset": 0.04, "truncate": 0.04, "slow_body": 0.02}

BAD_PATHS = [
    "",
    "/etc/passwd",
    "../x",
    "a/../../x",
    "a/./b",
    "a//b",
    "s3://other/x",
    "file:///etc/x",
    "C:/x",
    "a\\b",
    "a/..",
]


@pytest.fixture(params=["local", "s3", "s3_faulty"])
def make_store(request, tmp_path) -> Iterator[Callable[[], Store]]:
    """A factory of stores on one backend, all rooted at the same place."""
    made: list[Store] = []
    if request.param == "local":
        root = tmp_path / "store"

        def make() -> Store:
            made.append(open_store(str(root), retry=FAST_RETRY))
            return made[-1]

    else:
        env = request.getfixturevalue("s3_bucket")
        options = env.storage_options
        if request.param == "s3_faulty":
            proxy = request.getfixturevalue("fault_proxy")(rates=FAULT_RATES, seed=7, slow_body_s=0.05)
            options = env.options_via(proxy.endpoint_url)

        def make() -> Store:
            made.append(open_store(env.url("root/prefix"), options, retry=FAST_RETRY))
            return made[-1]

    yield make
    for store in made:
        store.close()


def test_write_then_read_returns_the_same_bytes(make_store):
    store = make_store()
    payload = os.urandom(200_000)
    store.write_atomic("shards/00000000.zst", payload)
    assert store.read("shards/00000000.zst") == payload
    assert make_store().read("shards/00000000.zst") == payload


@pytest.mark.parametrize("start,end", [(0, 1), (0, 5000), (1234, 4321), (4999, 5000), (17, 17)])
def test_read_range_returns_exactly_the_requested_bytes(make_store, start, end):
    store = make_store()
    payload = bytes(range(256)) * 20
    store.write_atomic("obj", payload[:5000])
    assert store.read_range("obj", start, end) == payload[start:end]


def test_read_range_past_the_end_names_object_and_range(make_store):
    store = make_store()
    store.write_atomic("dir/short.bin", b"x" * 100)
    with pytest.raises(TruncatedObjectError) as info:
        store.read_range("dir/short.bin", 50, 150)
    message = str(info.value)
    assert "dir/short.bin" in message and "[50, 150)" in message and "100" in message


def test_invalid_range_is_refused(make_store):
    store = make_store()
    store.write_atomic("obj", b"abc")
    for start, end in [(-1, 2), (2, 1)]:
        with pytest.raises(ValueError, match="obj"):
            store.read_range("obj", start, end)


def test_write_atomic_replaces_the_whole_object(make_store):
    store = make_store()
    store.write_atomic("manifest", b"old" * 1000)
    store.write_atomic("manifest", b"new")
    assert store.read("manifest") == b"new"
    assert store.size("manifest") == 3


def test_list_is_sorted_relative_and_filtered_by_prefix(make_store):
    store = make_store()
    names = ["shards/00000002.zst", "manifest", "shards/00000000.zst", "shards/00000001.idx", "rejects.jsonl"]
    for name in names:
        store.write_atomic(name, name.encode())
    assert store.list() == sorted(names)
    assert store.list("shards/") == sorted(n for n in names if n.startswith("shards/"))
    assert store.list("shards/0000000") == sorted(n for n in names if n.startswith("shards/"))
    assert store.list("re") == ["rejects.jsonl"]
    assert store.list("nothing/") == []


def test_exists_size_and_delete(make_store):
    store = make_store()
    assert not store.exists("a/b.bin")
    store.write_atomic("a/b.bin", b"12345")
    assert store.exists("a/b.bin")
    assert not store.exists("a")  # a folder/prefix is not an object
    assert store.size("a/b.bin") == 5
    store.delete("a/b.bin")
    assert not store.exists("a/b.bin")
    store.delete("a/b.bin")  # deleting an absent object is not an error


def test_missing_object_raises_object_missing_naming_it(make_store):
    store = make_store()
    for call in (
        lambda: store.read("shards/gone.zst"),
        lambda: store.read_range("shards/gone.zst", 0, 10),
        lambda: store.size("shards/gone.zst"),
    ):
        with pytest.raises(ObjectMissingError, match="shards/gone.zst"):
            call()
    assert store.stats()["errors"] == 3


def test_paths_escaping_the_root_are_refused(make_store):
    store = make_store()
    for bad in BAD_PATHS:
        for call in (
            partial(store.read, bad),
            partial(store.read_range, bad, 0, 1),
            partial(store.write_atomic, bad, b"x"),
            partial(store.exists, bad),
            partial(store.size, bad),
            partial(store.delete, bad),
        ):
            with pytest.raises(PathEscapeError, match="escapes"):
                call()
    with pytest.raises(PathEscapeError):
        store.list("../")
    assert store.stats()["writes"] == 0


def test_concurrent_range_reads_from_eight_threads(make_store):
    store = make_store()
    payload = os.urandom(1 << 20)
    store.write_atomic("big.bin", payload)
    chunk = 16384
    errors: list[BaseException] = []
    mismatches: list[int] = []

    def worker(index: int) -> None:
        try:
            for j in range(index, 64, 8):
                start = j * chunk
                if store.read_range("big.bin", start, start + chunk) != payload[start : start + chunk]:
                    mismatches.append(j)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors and not mismatches
    stats = store.stats()
    assert stats["reads"] == 64 and stats["bytes_read"] == 64 * chunk


def test_stats_count_reads_writes_and_bytes(make_store):
    store = make_store()
    store.write_atomic("a", b"x" * 10)
    store.write_atomic("b", b"y" * 20)
    store.read("a")
    store.read_range("b", 5, 15)
    stats = store.stats()
    assert {k: stats[k] for k in ("reads", "bytes_read", "writes", "bytes_written")} == {
        "reads": 2,
        "bytes_read": 20,
        "writes": 2,
        "bytes_written": 30,
    }


def test_store_survives_pickling_and_reconnects(make_store):
    store = make_store()
    store.write_atomic("p.bin", b"pickled")
    copy = pickle.loads(pickle.dumps(store))
    try:
        assert copy.url == store.url
        assert copy.read("p.bin") == b"pickled"
        assert copy.retry_policy == store.retry_policy
    finally:
        copy.close()


def test_local_store_leaves_no_temp_files(tmp_path):
    store = LocalStore(tmp_path)
    for i in range(5):
        store.write_atomic("d/x.bin", bytes([i]) * 1000)
    assert sorted(p.name for p in (tmp_path / "d").iterdir()) == ["x.bin"]


def test_local_store_files_follow_the_umask_not_mkstemp_0600(tmp_path):
    store = LocalStore(tmp_path)
    store.write_atomic("shards/00000000.zst", b"abc")
    mask = os.umask(0o022)
    os.umask(mask)
    mode = os.stat(tmp_path / "shards/00000000.zst").st_mode & 0o777
    assert mode == 0o666 & ~mask


def test_copy_dataset_copies_every_object_to_s3(small_dataset, s3_bucket):
    from zephon_stream import Manifest
    from zephon_stream.storage import copy_dataset

    url = s3_bucket.url("copied")
    count = copy_dataset(small_dataset.url, url, dst_options=s3_bucket.storage_options)
    with open_store(small_dataset.url) as src, open_store(url, s3_bucket.storage_options) as dst:
        assert dst.list() == src.list() and count == len(src.list())
        assert all(dst.read(path) == src.read(path) for path in src.list())
    assert Manifest.load(url, s3_bucket.storage_options).fingerprint == small_dataset.manifest.fingerprint
