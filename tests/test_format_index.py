"""Format 1.1: the manifest as a small header, index objects read by page, and 1.0 datasets still read.

The 1.0 fixture (tests/data/format-1.0, written by the 1.0 writer) carries the
batches, ``inspect`` and ``which`` answers of the code that wrote it; a 1.1
dataset of the same inputs, and the fixture reindexed in place, must give the
same ones.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import msgpack
import pytest

import zephon_stream
from zephon_stream import Manifest, StreamingLoader
from zephon_stream.cli import main
from zephon_stream.errors import IndexObjectError, ManifestError
from zephon_stream.writer.merge import merge_parts

DATA = Path(__file__).resolve().parent / "data"
FIXTURE = DATA / "format-1.0"
EXPECTED = json.loads((DATA / "format-1.0-expected.json").read_text())


def batch_digests(
    url: str, *, world: int, rank: int, steps: int = 12, state: dict | None = None, **kwargs
) -> tuple[list[str], dict]:
    """sha256 of each batch as the fixture's expected.json records them, and the state after."""
    batch = kwargs.pop("local_batch_size", EXPECTED["local_batch_size"])
    with StreamingLoader(
        url,
        seq_len=EXPECTED["seq_len"],
        local_batch_size=batch,
        rank=rank,
        world_size=world,
        seed=EXPECTED["seed"],
        pipeline=kwargs.pop("pipeline", "threads"),
        node_cache=False,
        **kwargs,
    ) as loader:
        if state is not None:
            loader.load_state_dict(state)
        it = iter(loader)
        out = []
        for _ in range(steps):
            b = next(it)
            out.append(
                hashlib.sha256(
                    b["input"].numpy().tobytes()
                    + b["labels"].numpy().tobytes()
                    + b["sample_positions"].numpy().tobytes()
                ).hexdigest()
            )
        return out, loader.state_dict()


def write_like_the_fixture(root: Path) -> Manifest:
    """The fixture's inputs written again by today's writer: two launcher parts, merged."""
    files = sorted(str(p.relative_to(DATA.parent.parent)) for p in (DATA / "format-1.0-inputs").iterdir())
    for rank, share in enumerate([files[:3], files[3:]]):
        zephon_stream.write_dataset(
            share,
            str(root / f"part-{rank:05d}-of-00002"),
            tokenizer="bytes",
            block_tokens=1025,
            blocks_per_shard=4,
            progress=False,
        )
    return merge_parts([], str(root))


@pytest.fixture()
def reindexed(tmp_path: Path) -> Path:
    root = tmp_path / "ds"
    shutil.copytree(FIXTURE, root)
    assert main(["reindex", str(root)]) == 0
    return root


def test_the_format_1_0_fixture_streams_the_batches_it_always_did() -> None:
    assert Manifest.load(str(FIXTURE)).version == (1, 0)
    for world in (1, 2, 3):
        for rank in range(world):
            assert batch_digests(str(FIXTURE), world=world, rank=rank)[0] == EXPECTED["sha256"][str(world)][str(rank)]
    # The helper process gets a 1.0 manifest as before.
    assert batch_digests(str(FIXTURE), world=2, rank=1, pipeline="process")[0] == EXPECTED["sha256"]["2"]["1"]


def test_the_writer_writes_1_1_with_the_same_fingerprint_and_batches(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(DATA.parent.parent)
    manifest = write_like_the_fixture(tmp_path / "ds")
    assert manifest.version == (1, 1) and manifest.fingerprint == EXPECTED["fingerprint"]
    header = msgpack.unpackb((tmp_path / "ds" / "manifest").read_bytes())
    assert "shards" not in header and "sources" not in header
    assert sorted(header["index"]) == ["blocks", "shards", "sources"]
    for world in (1, 2, 3):
        for rank in range(world):
            got = batch_digests(str(tmp_path / "ds"), world=world, rank=rank)[0]
            assert got == EXPECTED["sha256"][str(world)][str(rank)]
    assert batch_digests(str(tmp_path / "ds"), world=3, rank=2, pipeline="process")[0] == EXPECTED["sha256"]["3"]["2"]


def test_reindex_keeps_shards_and_fingerprint_and_a_1_0_checkpoint_resumes_at_another_world_size(
    reindexed: Path,
) -> None:
    for path in FIXTURE.rglob("*"):
        if path.is_file() and path != FIXTURE / "manifest":
            assert (reindexed / path.relative_to(FIXTURE)).read_bytes() == path.read_bytes(), path
    manifest = Manifest.load(str(reindexed))
    assert manifest.version == (1, 1) and manifest.fingerprint == EXPECTED["fingerprint"]
    assert manifest.shards == Manifest.load(str(FIXTURE)).shards
    assert batch_digests(str(reindexed), world=2, rank=0)[0] == EXPECTED["sha256"]["2"]["0"]
    # 5 steps at W = 2 on the 1.0 dataset, then W = 1 on its 1.1 form: the
    # global order goes on (W = 1's batch of 4 is W = 2's two batches of 2).
    _, state = batch_digests(str(FIXTURE), world=2, rank=0, steps=5)
    resumed, _ = batch_digests(str(reindexed), world=1, rank=0, steps=2, state=state, local_batch_size=4)
    reference, _ = batch_digests(str(FIXTURE), world=1, rank=0, steps=2, state=state, local_batch_size=4)
    assert resumed == reference


def test_inspect_and_which_answer_as_they_did_for_1_0(reindexed: Path, capsys) -> None:
    assert main(["inspect", str(reindexed), "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    want = json.loads((DATA / "format-1.0-inspect.json").read_text())
    assert got.pop("version") == "1.1" and want.pop("version") == "1.0"
    assert {k: v for k, v in got.items() if k != "url"} == {k: v for k, v in want.items() if k != "url"}
    assert (
        main(
            ["which", str(reindexed), "--step", "3", "--seq-len", "64", "--global-batch", "4", "--seed", "7", "--json"]
        )
        == 0
    )
    got = capsys.readouterr().out.replace(str(reindexed), "DATASET")
    want = (DATA / "format-1.0-which.json").read_text().replace("/work/main/tests/data/format-1.0", "DATASET")
    assert json.loads(got) == json.loads(want)
    assert main(["verify", str(reindexed)]) == 0


def test_a_loader_starts_without_shards_or_whole_index_objects(reindexed: Path) -> None:
    shutil.rmtree(reindexed / "part-00000-of-00002")
    shutil.rmtree(reindexed / "part-00001-of-00002")
    header = msgpack.unpackb((reindexed / "manifest").read_bytes())
    with StreamingLoader(
        str(reindexed),
        seq_len=64,
        local_batch_size=2,
        rank=1,
        world_size=3,
        seed=7,
        pipeline="threads",
        node_cache=False,
    ) as loader:
        state = loader.state_dict()
        assert state["position"] == 0
        source = loader._sources[0]
        assert source.metadata.indexed
        with pytest.raises(FileNotFoundError, match="shards/"):
            next(iter(loader))
        read = {key[0] for key in source.metadata._pages}
    assert read <= {header["index"]["blocks"]["path"], header["index"]["shards"]["path"]}


def _flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


def test_a_corrupt_index_page_is_refused_naming_object_and_bytes_only_where_read(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(DATA.parent.parent)
    root = tmp_path / "ds"
    files = sorted(str(p.relative_to(DATA.parent.parent)) for p in (DATA / "format-1.0-inputs").iterdir())
    # 17-token blocks: 883 blocks, seven pages of frame records (146 a page).
    manifest = zephon_stream.write_dataset(
        files, str(root), tokenizer="bytes", block_tokens=17, blocks_per_shard=64, progress=False
    )
    assert manifest.num_blocks > 5 * 146
    header = msgpack.unpackb((root / "manifest").read_bytes())
    blocks = header["index"]["blocks"]
    pages = blocks["page_bytes"]
    # One step: what it touches is what is fetched (no read-ahead past the end).
    loader_kwargs = dict(
        seq_len=16, local_batch_size=2, rank=0, world_size=1, seed=3, max_steps=1, pipeline="threads", node_cache=False
    )
    with StreamingLoader(str(root), **loader_kwargs) as loader:
        reference = next(iter(loader))["input"].clone()
        touched = {key[2] for key in loader._sources[0].metadata._pages if key[0] == blocks["path"] and key[1]}
    untouched = (set(range(6)) - touched).pop()
    _flip(root / blocks["path"], untouched * pages + 5)
    with StreamingLoader(str(root), **loader_kwargs) as loader:
        assert (next(iter(loader))["input"] == reference).all()  # A page no step read yet
    with pytest.raises(IndexObjectError, match=rf"index object .*{blocks['path']}.*digest mismatch"):
        Manifest.load(str(root))  # Verify's way reads every page
    _flip(root / blocks["path"], untouched * pages + 5)
    page = touched.pop()
    _flip(root / blocks["path"], page * pages + 3)
    with StreamingLoader(str(root), **loader_kwargs) as loader:
        with pytest.raises(
            IndexObjectError,
            match=rf"{blocks['path']}: column 'frames' page {page} "
            rf"\(bytes \[{page * pages}, \d+\)\): digest mismatch",
        ):
            next(iter(loader))


def test_a_truncated_index_object_is_refused_naming_the_range(reindexed: Path) -> None:
    header = msgpack.unpackb((reindexed / "manifest").read_bytes())
    shards = reindexed / header["index"]["shards"]["path"]
    shards.write_bytes(shards.read_bytes()[:100])
    with StreamingLoader(
        str(reindexed),
        seq_len=64,
        local_batch_size=2,
        rank=0,
        world_size=1,
        seed=7,
        pipeline="threads",
        node_cache=False,
    ) as loader:
        with pytest.raises(Exception, match=rf"{header['index']['shards']['path']}.*(truncated|bytes \[)") as info:
            next(iter(loader))
    assert "shards-" in str(info.value)
    assert main(["verify", str(reindexed)]) == 1


def test_a_header_whose_shape_disagrees_with_its_totals_is_refused_at_open(reindexed: Path) -> None:
    header = msgpack.unpackb((reindexed / "manifest").read_bytes())
    header["num_tokens"] += 1
    (reindexed / "manifest").write_bytes(msgpack.packb(header, use_bin_type=True))
    with pytest.raises(
        ManifestError, match="num_tokens: declared 15010, but the blocks and their short_blocks hold 15009"
    ):
        StreamingLoader(
            str(reindexed), seq_len=64, local_batch_size=2, rank=0, world_size=1, pipeline="threads", node_cache=False
        )


def test_the_worked_example_in_1_1(tmp_path: Path) -> None:
    from test_format_example import build_example

    m = build_example(tmp_path, version=(1, 1))
    data = (tmp_path / "manifest").read_bytes()
    assert data[:10].hex(" ") == "de 00 12 a6 66 6f 72 6d 61 74"
    header = msgpack.unpackb(data)
    assert header["index"]["blocks"]["num_bytes"] == 156 and header["index"]["shards"]["rows"] == 3
    assert header["short_blocks"]["ids"] == (4).to_bytes(8, "little")
    assert header["short_blocks"]["counts"] == (3).to_bytes(4, "little")
    assert m.fingerprint.startswith("644f9a6b")
