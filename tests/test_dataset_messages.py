"""A place given as a dataset that holds none (a file, nothing, a folder without a manifest): every way in
(``StreamingLoader``, ``zephon-stream inspect``, ``verify``, ``which``) says what the place is and what a
dataset looks like, locally and on every real object store."""

from __future__ import annotations

from pathlib import Path

import pytest

from zephon_stream import StreamingLoader
from zephon_stream.cli import main
from zephon_stream.errors import ObjectMissingError
from zephon_stream.format.manifest import Manifest
from zephon_stream.storage import open_store

LOOKS_LIKE = "a dataset is a folder or prefix holding 'manifest' and 'shards/', written by `zephon-stream write`"
SAYS = {
    "file": "it is a file, not a folder",
    "missing": "nothing is there (no such folder or prefix)",
    "folder": "'manifest' is missing (a dataset is committed when its manifest is written, last)",
}


@pytest.fixture
def places(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "README.md").write_text("# not a dataset\n")
    (tmp_path / "half-written" / "shards").mkdir(parents=True)
    return {
        "file": str(tmp_path / "README.md"),
        "missing": str(tmp_path / "no-such-dataset"),
        "folder": str(tmp_path / "half-written"),
    }


def expected(url: str, kind: str) -> str:
    return f"no committed dataset at {url}: {SAYS[kind]}; {LOOKS_LIKE}"


@pytest.mark.parametrize("kind", list(SAYS))
def test_streaming_loader_says_what_the_place_is_and_what_a_dataset_is(places, kind):
    with pytest.raises(ObjectMissingError) as info:
        StreamingLoader(places[kind], seq_len=8, local_batch_size=1, pipeline="threads")
    assert str(info.value) == expected(places[kind], kind)


@pytest.mark.parametrize("kind", list(SAYS))
@pytest.mark.parametrize(
    "command", [["inspect"], ["verify"], ["which", "--step", "0", "--seq-len", "8", "--global-batch", "1"]]
)
def test_each_command_that_opens_a_dataset_says_what_the_place_is(places, kind, command, capsys):
    url = places[kind]
    args = [command[0], url, *command[1:]]
    assert main(args) == 1
    err = capsys.readouterr().err
    assert err == f"zephon-stream {command[0]}: error: {expected(url, kind)}\n"


def test_on_an_object_store_an_object_a_missing_prefix_and_a_prefix_without_manifest_are_told_apart(object_store):
    with open_store(object_store.url("ds"), object_store.storage_options) as store:
        store.write_atomic("README.md", b"# not a dataset\n")
        store.write_atomic("half-written/shards/00000000.zst", b"x")
    for rel, kind in (("ds/README.md", "file"), ("ds/no-such-dataset", "missing"), ("ds/half-written", "folder")):
        with open_store(object_store.url(rel), object_store.storage_options) as store:
            assert store.root_kind() == kind, rel
            with pytest.raises(ObjectMissingError) as info:
                Manifest.read(store)
            assert str(info.value) == expected(store.url, kind)
