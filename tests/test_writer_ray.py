"""engine='ray' against the single-process writer, on the session's real local Ray instance
(its drivers in a process of their own: ``ray_driver``, CLI runs).

The inputs are real text (stdlib sources) of every kind a unit is cut from:
small files grouped, a JSONL file cut into byte ranges, a gzip stream whole,
Parquet row groups. The claim: the token stream, document boundaries (with
their sources and record numbers), rejects and per-source accounting are the
single-process writer's, at 1 and 2 workers and in any submission order, and
the output is byte-identical whatever the workers and order.
"""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path

import numpy as np
import pytest

from fixtures_ray import (
    RAY_BLOCK_TOKENS,
    RAY_BLOCKS_PER_SHARD,
    RAY_UNIT_BYTES,
    assert_same_contents,
    dataset_contents,
    folder_bytes,
)
from zephon_stream import write_dataset
from zephon_stream.errors import EmptyDatasetError, InputError
from zephon_stream.writer.api import write_dataset as api_write_dataset
from zephon_stream.writer.config import WriteConfig
from zephon_stream.writer.unit_part import UNIT_RECORD_NAME
from zephon_stream.writer.units import cut_units

LAYOUT = {"block_tokens": RAY_BLOCK_TOKENS, "blocks_per_shard": RAY_BLOCKS_PER_SHARD, "progress": False}


@pytest.fixture(params=["bytes", "hf"])
def tokenizer_spec(request, bpe_tokenizer_json) -> str:
    return "bytes" if request.param == "bytes" else f"hf:{bpe_tokenizer_json}"


def _write_in_order(paths: list[str], url: str, tokenizer_spec: str, order: list[int]):
    """Run in the driver: write_with_ray submitting the units in ``order``."""
    from zephon_stream.storage import open_store
    from zephon_stream.writer.ray_engine import write_with_ray
    from zephon_stream.writer.tokenizers import load_tokenizer

    config = WriteConfig(block_tokens=RAY_BLOCK_TOKENS, blocks_per_shard=RAY_BLOCKS_PER_SHARD).resolved()
    with open_store(url) as store:
        return write_with_ray(
            paths,
            store,
            config=config,
            tokenizer=load_tokenizer(tokenizer_spec),
            workers=2,
            unit_bytes=RAY_UNIT_BYTES,
            submit_order=order,
            progress=False,
        )


def test_ray_engine_writes_what_one_process_writes_at_any_workers_and_order(
    ray_driver, ray_inputs, tokenizer_spec, tmp_path
):
    paths = list(ray_inputs.paths)
    reference = write_dataset(paths, str(tmp_path / "reference"), tokenizer=tokenizer_spec, **LAYOUT)
    units = cut_units(paths, config=WriteConfig(), unit_bytes=RAY_UNIT_BYTES)
    kinds = {("range" if p.byte_range else "groups" if p.row_groups else "whole") for u in units for p in u.pieces}
    assert kinds == {"range", "groups", "whole"} and any(len(u.pieces) > 1 for u in units)

    one = ray_driver.call(
        write_dataset,
        paths,
        str(tmp_path / "one"),
        tokenizer=tokenizer_spec,
        engine="ray",
        ray_workers=1,
        unit_bytes=RAY_UNIT_BYTES,
        **LAYOUT,
    )
    order = list(range(len(units)))
    random.Random(7).shuffle(order)
    two = ray_driver.call(_write_in_order, paths, str(tmp_path / "two"), tokenizer_spec, order)

    want = dataset_contents(str(tmp_path / "reference"))
    assert_same_contents(dataset_contents(str(tmp_path / "one")), want)
    assert_same_contents(dataset_contents(str(tmp_path / "two")), want)
    assert folder_bytes(tmp_path / "one") == folder_bytes(tmp_path / "two")
    for summary in (one, two):
        assert summary.num_units == len(units) and summary.units_reused == 0
        assert (summary.records_in, summary.records_written, summary.rejected) == (
            reference.records_in,
            reference.records_written,
            reference.rejected,
        )
        assert summary.num_tokens == reference.num_tokens and summary.num_documents == reference.num_documents
    assert reference.rejected == {"bad_json": 1, "empty": 1, "missing_field": 1}


def _write_with_build_probe(paths: list[str], url: str, run: str):
    """Run in the driver: write_with_ray with a tokenizer whose every document is
    ``"PID BUILDS"``: the process that encoded it and how many times that process
    had unpickled (built) this run's tokenizer by then."""
    import os

    from zephon_stream.storage import open_store
    from zephon_stream.writer.ray_engine import write_with_ray
    from zephon_stream.writer.tokenizer_base import Tokenizer
    from zephon_stream.writer.tokenizers import BytesTokenizer

    class BuildProbe(BytesTokenizer):  # A local class: Ray pickles it by value, no import needed in workers
        encode_documents = Tokenizer.encode_documents

        def __getstate__(self):
            return {"run": run}

        def __setstate__(self, state):
            name = f"ZS_PROBE_BUILDS_{state['run']}"
            os.environ[name] = str(int(os.environ.get(name, "0")) + 1)

        def encode_batch(self, texts):
            probe = f"{os.getpid()} {os.environ.get(f'ZS_PROBE_BUILDS_{run}', '0')}".encode()
            return [list(probe) for _ in texts]

    config = WriteConfig(block_tokens=RAY_BLOCK_TOKENS, blocks_per_shard=RAY_BLOCKS_PER_SHARD).resolved()
    with open_store(url) as store:
        return write_with_ray(
            paths,
            store,
            config=config,
            tokenizer=BuildProbe(),
            workers=2,
            unit_bytes=RAY_UNIT_BYTES,
            progress=False,
        )


def test_a_worker_builds_the_runs_tokenizer_once_however_many_units_it_converts(ray_driver, ray_inputs, tmp_path):
    summary = ray_driver.call(_write_with_build_probe, list(ray_inputs.paths), str(tmp_path / "out"), tmp_path.name)
    contents = dataset_contents(str(tmp_path / "out"))
    probes = {
        contents.tokens[start : end - 1].astype(np.uint8).tobytes().decode() for _, _, start, end in contents.documents
    }
    pids = {probe.split()[0] for probe in probes}
    assert summary.num_units > len(pids)  # Some worker converted several units
    assert {probe.split()[1] for probe in probes} == {"1"}


def test_a_corrupt_input_fails_naming_it_and_the_offset_and_keeps_the_other_units(ray_driver, ray_inputs, tmp_path):
    good = gzip.compress(
        "".join(json.dumps({"text": f"document {i} " * 50}) + "\n" for i in range(400)).encode(), mtime=0
    )
    corrupt = tmp_path / "broken.jsonl.gz"
    corrupt.write_bytes(good[: len(good) // 2] + bytes(64) + good[len(good) // 2 + 64 :])
    paths = list(ray_inputs.paths[:6]) + [str(corrupt)]
    out = tmp_path / "out"
    with pytest.raises(InputError) as caught:
        ray_driver.call(
            api_write_dataset,
            paths,
            str(out),
            tokenizer="bytes",
            engine="ray",
            ray_workers=2,
            unit_bytes=RAY_UNIT_BYTES,
            **LAYOUT,
        )
    message = str(caught.value)
    assert str(corrupt) in message and "decompressed byte" in message and "stored byte" in message
    assert "Traceback" not in message
    assert not (out / "manifest").exists()
    committed = sorted(p.parent.name for p in out.glob(f"part-*/{UNIT_RECORD_NAME}"))
    units = cut_units(paths, config=WriteConfig(), unit_bytes=RAY_UNIT_BYTES)
    assert committed == [f"part-{i:05d}-of-{len(units):05d}" for i in range(len(units) - 1)]


def test_cli_engine_ray_joins_a_cluster_by_address(ray_instance, ray_inputs, tmp_path):
    import subprocess
    import sys

    out = tmp_path / "cli"
    command = [
        sys.executable, "-m", "zephon_stream", "write", *ray_inputs.paths[:24], "-o", str(out), "--tokenizer", "bytes",
        "--engine", "ray", "--ray-address", ray_instance.address, "--unit-bytes", str(RAY_UNIT_BYTES),
        "--block-tokens", str(RAY_BLOCK_TOKENS), "--blocks-per-shard", str(RAY_BLOCKS_PER_SHARD), "--json",
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=ray_instance.child_env())
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["num_units"] > 1 and summary["units_reused"] == 0 and summary["num_documents"] == 24
    reference = write_dataset(list(ray_inputs.paths[:24]), str(tmp_path / "reference"), tokenizer="bytes", **LAYOUT)
    assert summary["fingerprint"] != reference.fingerprint  # The parts end their own blocks...
    assert_same_contents(
        dataset_contents(str(out)), dataset_contents(str(tmp_path / "reference"))
    )  # ...nothing else differs


def test_token_inputs_are_one_unit_each_and_written_as_one_process_writes_them(ray_driver, stdlib_corpus, tmp_path):
    import numpy as np

    from zephon_stream.writer.tokenizers import load_tokenizer

    eos = load_tokenizer("bytes").eos_id
    paths = []
    for i in range(3):
        docs = [
            np.frombuffer(t.encode("utf-8"), np.uint8).astype(np.uint16)
            for t in stdlib_corpus.texts[i * 10 : i * 10 + 10]
        ]
        ids = np.concatenate([np.append(d, np.uint16(eos)) for d in docs])
        path = tmp_path / f"ids{i}.npy"
        np.save(path, ids)
        paths.append(str(path))
    options = {"tokenizer": "bytes", "input_format": "tokens", **LAYOUT}
    write_dataset(paths, str(tmp_path / "reference"), **options)
    summary = ray_driver.call(write_dataset, paths, str(tmp_path / "ray"), engine="ray", ray_workers=2, **options)
    assert summary.num_units == 3 and summary.num_documents == 30
    assert_same_contents(dataset_contents(str(tmp_path / "ray")), dataset_contents(str(tmp_path / "reference")))


def test_cli_without_an_address_starts_a_local_instance_quietly_and_leaves_nothing_behind(
    ray_instance, ray_driver, ray_inputs, tmp_path
):
    import shutil
    import tempfile

    # Short, as a machine's temporary folder is: the instance's sockets live below it.
    child_tmp = Path(tempfile.mkdtemp(prefix="zs-t-", dir="/tmp"))
    try:
        _run_without_address(ray_instance, ray_driver, ray_inputs, tmp_path, child_tmp)
    finally:
        shutil.rmtree(child_tmp, ignore_errors=True)


def _run_without_address(ray_instance, ray_driver, ray_inputs, tmp_path: Path, child_tmp: Path) -> None:
    import os
    import subprocess
    import sys

    out = tmp_path / "cli"
    command = [
        sys.executable, "-m", "zephon_stream", "write", *ray_inputs.paths[:24], "-o", str(out), "--tokenizer", "bytes",
        "--engine", "ray", "--ray-workers", "1", "--unit-bytes", str(RAY_UNIT_BYTES),
        "--block-tokens", str(RAY_BLOCK_TOKENS), "--blocks-per-shard", str(RAY_BLOCKS_PER_SHARD), "--json",
    ]  # fmt: skip
    # A user's environment: no Ray settings of the session's head, a home of its own.
    home = tmp_path / "home"
    home.mkdir()
    env = {**ray_instance.child_env(), "TMPDIR": str(child_tmp), "HOME": str(home)}
    for name in ("RAY_TMPDIR", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        env.pop(name, None)
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Connecting to existing Ray cluster" not in done.stderr
    # The instance runs with a token of its own: no warning, and no token left in the home.
    assert "Token authentication" not in done.stderr and "auth_token" not in done.stderr, done.stderr[-3000:]
    assert os.listdir(home) == []
    assert os.listdir(child_tmp) == []  # The instance's session folder is gone, and so are its processes
    assert not [p for p in os.listdir("/proc") if p.isdigit() and str(child_tmp).encode() in _cmdline(p)]
    in_session = ray_driver.call(
        write_dataset,
        list(ray_inputs.paths[:24]),
        str(tmp_path / "session"),
        tokenizer="bytes",
        engine="ray",
        ray_workers=2,
        unit_bytes=RAY_UNIT_BYTES,
        **LAYOUT,
    )
    assert json.loads(done.stdout.strip().splitlines()[-1])["fingerprint"] == in_session.fingerprint
    assert (out / "manifest").read_bytes() == (tmp_path / "session" / "manifest").read_bytes()


def _cmdline(pid: str) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""


def test_ray_engine_refuses_a_dataset_without_tokens_unless_asked(ray_driver, tmp_path):
    src = tmp_path / "bad.jsonl"
    src.write_bytes(b'{"text": "cut short\n{not json}\n[1, 2]\n')
    out = tmp_path / "out"
    with pytest.raises(EmptyDatasetError, match="no tokens to commit"):
        ray_driver.call(write_dataset, [str(src)], str(out), tokenizer="bytes", engine="ray", **LAYOUT)
    assert not (out / "manifest").exists() and len((out / "rejects.jsonl").read_text().splitlines()) == 3
    summary = ray_driver.call(
        write_dataset, [str(src)], str(out), tokenizer="bytes", engine="ray", allow_empty=True, **LAYOUT
    )
    assert (summary.num_tokens, summary.records_in, summary.num_rejected) == (0, 3, 3)
    assert (out / "manifest").exists()
