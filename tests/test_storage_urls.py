"""URLs, storage options and writer inputs: opening, joining, expanding, streaming."""

from __future__ import annotations

import gzip
import io
import os
import posixpath
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zephon_stream.errors import ConfigError, InputError, PathEscapeError
from zephon_stream.storage import (
    FsspecStore,
    LocalStore,
    check_relative_path,
    expand_inputs,
    join_url,
    open_input,
    open_store,
    parse_storage_options,
)


def test_parse_storage_options_converts_values_and_nests_dotted_keys():
    options = parse_storage_options(
        [
            "endpoint_url=http://127.0.0.1:9000",
            "anon=false",
            "max_concurrency=16",
            "default_block_size=1.5",
            "client_kwargs.region_name=eu-west-1",
            "client_kwargs.verify=no",
            "token=none",
            "key=a=b",
        ]
    )
    assert options == {
        "endpoint_url": "http://127.0.0.1:9000",
        "anon": False,
        "max_concurrency": 16,
        "default_block_size": 1.5,
        "client_kwargs": {"region_name": "eu-west-1", "verify": False},
        "token": None,
        "key": "a=b",
    }


@pytest.mark.parametrize("item", ["novalue", "=x", "a..b=1", "two words=1"])
def test_parse_storage_options_refuses_malformed_items(item):
    with pytest.raises(ConfigError, match="#1"):
        parse_storage_options([item])


def test_open_store_picks_the_backend_from_the_url(tmp_path):
    assert isinstance(open_store(tmp_path), LocalStore)
    assert isinstance(open_store(f"file://{tmp_path}"), LocalStore)
    assert open_store(f"file://{tmp_path}").url == str(tmp_path)
    memory = open_store("memory://zs-test-store")
    assert isinstance(memory, FsspecStore)
    memory.write_atomic("a/b", b"in memory")
    assert memory.list() == ["a/b"] and memory.read_range("a/b", 3, 9) == b"memory"


def test_s3_endpoint_and_credentials_come_from_aws_variables(s3_bucket, monkeypatch):
    for name, value in s3_bucket.env.items():
        monkeypatch.setenv(name, value)
    with open_store(s3_bucket.url("env"), s3_bucket.storage_options) as explicit:
        explicit.write_atomic("x", b"via options")
    with open_store(s3_bucket.url("env")) as from_env:
        assert from_env.read("x") == b"via options"
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # wrong endpoint: options must win
    with open_store(s3_bucket.url("env"), s3_bucket.storage_options) as explicit:
        assert explicit.read("x") == b"via options"


def test_join_url_joins_and_refuses_escapes():
    assert join_url("s3://bucket/data/", "shards/00000001.zst") == "s3://bucket/data/shards/00000001.zst"
    assert join_url("/tmp/x", "manifest") == "/tmp/x/manifest"
    for bad in ("../manifest", "/abs", "s3://other/x", "a/../../b"):
        with pytest.raises(PathEscapeError):
            join_url("s3://bucket/data", bad)


@pytest.fixture
def corpus_dir(tmp_path):
    files = ["b.txt", "a.txt", "sub/c.jsonl", "sub/deeper/d.txt", "sub/deeper/e.jsonl.gz"]
    for name in files:
        path = tmp_path / "in" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(name.encode())
    return tmp_path / "in"


def test_expand_inputs_local_paths_globs_and_folders(corpus_dir):
    d = str(corpus_dir)
    assert expand_inputs([f"{d}/*.txt"]) == [f"{d}/a.txt", f"{d}/b.txt"]
    assert expand_inputs([f"{d}/**/*.txt"]) == [f"{d}/a.txt", f"{d}/b.txt", f"{d}/sub/deeper/d.txt"]
    assert expand_inputs([f"{d}/sub"]) == [f"{d}/sub/c.jsonl", f"{d}/sub/deeper/d.txt", f"{d}/sub/deeper/e.jsonl.gz"]
    # patterns keep their order; a file matched twice is listed once
    assert expand_inputs([f"{d}/b.txt", f"{d}/*.txt"]) == [f"{d}/b.txt", f"{d}/a.txt"]
    assert expand_inputs([f"file://{d}/a.txt"]) == [f"{d}/a.txt"]


def test_expand_inputs_names_a_pattern_that_matches_nothing(corpus_dir):
    with pytest.raises(InputError, match="nothing-\\*.txt"):
        expand_inputs([f"{corpus_dir}/a.txt", f"{corpus_dir}/nothing-*.txt"])
    with pytest.raises(InputError, match="missing.txt"):
        expand_inputs([f"{corpus_dir}/missing.txt"])


def test_expand_inputs_on_s3(s3_bucket):
    with open_store(s3_bucket.url("raw"), s3_bucket.storage_options) as store:
        for name in ["b.jsonl", "a.jsonl", "x/c.jsonl", "x/y/d.txt"]:
            store.write_atomic(name, name.encode())
    url = s3_bucket.url("raw")
    opts = s3_bucket.storage_options
    assert expand_inputs([f"{url}/*.jsonl"], opts) == [f"{url}/a.jsonl", f"{url}/b.jsonl"]
    assert expand_inputs([f"{url}/**/*.jsonl"], opts) == [f"{url}/a.jsonl", f"{url}/b.jsonl", f"{url}/x/c.jsonl"]
    assert expand_inputs([f"{url}/x"], opts) == [f"{url}/x/c.jsonl", f"{url}/x/y/d.txt"]
    assert expand_inputs([f"{url}/a.jsonl"], opts) == [f"{url}/a.jsonl"]
    with pytest.raises(InputError, match="nope"):
        expand_inputs([f"{url}/nope/*.jsonl"], opts)


def test_open_input_streams_local_and_s3_files(tmp_path, s3_bucket):
    payload = b"".join(b"record %d\n" % i for i in range(300_000))
    local = tmp_path / "in.txt.gz"
    local.write_bytes(gzip.compress(payload))
    with open_store(s3_bucket.url("raw"), s3_bucket.storage_options) as store:
        store.write_atomic("in.txt.gz", gzip.compress(payload))
    for url in (str(local), s3_bucket.url("raw/in.txt.gz")):
        with open_input(url, s3_bucket.storage_options) as f:
            assert f.seekable()
            with gzip.GzipFile(fileobj=f) as g:
                assert g.read() == payload
    with open_input(s3_bucket.url("raw/in.txt.gz"), s3_bucket.storage_options) as f:
        f.seek(-4, io.SEEK_END)
        assert f.read() == gzip.compress(payload)[-4:]


def test_open_input_names_a_missing_input(tmp_path, s3_bucket):
    with pytest.raises(InputError, match="gone.txt"):
        open_input(str(tmp_path / "gone.txt"))
    with pytest.raises(InputError, match="gone.txt"):
        open_input(s3_bucket.url("raw/gone.txt"), s3_bucket.storage_options)


def test_storage_never_imports_torch():
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['torch'] = None\n"
        "import zephon_stream.storage, zephon_stream.storage.embedded_s3\n"
        "print('ok')"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env={**os.environ}
    )
    assert result.stdout.strip() == "ok", result.stderr


_PATH_ALPHABET = st.sampled_from(list("ab.-_/:\\~ \x00%") + ["..", "s3://", "C:", "é"])


@settings(max_examples=400, deadline=None)
@given(st.lists(_PATH_ALPHABET, max_size=12).map("".join))
def test_a_path_is_either_refused_or_stays_inside_the_root(path):
    try:
        accepted = check_relative_path(path)
    except PathEscapeError:
        return
    assert accepted == path
    root = "/store/root"
    joined = posixpath.normpath(posixpath.join(root, path))
    assert joined.startswith(root + "/") and joined == posixpath.join(root, path)
    assert "\\" not in path and "\x00" not in path
    assert not re.match(r"^[A-Za-z][A-Za-z0-9+.-]*:", path)  # no scheme or drive letter
