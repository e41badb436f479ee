"""engine='ray' under faults, on the session's real Ray instance (drivers in processes of their own): a worker
process SIGKILLed mid-task, the driver SIGKILLed before the commit and the
command run again; and output to S3 on a real SeaweedFS server."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from fixtures_ray import (
    RAY_BLOCK_TOKENS,
    RAY_BLOCKS_PER_SHARD,
    RAY_UNIT_BYTES,
    assert_same_contents,
    dataset_contents,
)
from fixtures_stores import new_bucket
from zephon_stream import Manifest, write_dataset
from zephon_stream.storage.local import TEMP_PREFIX
from zephon_stream.writer.config import WriteConfig
from zephon_stream.writer.unit_part import UNIT_RECORD_NAME
from zephon_stream.writer.units import cut_units

LAYOUT = {"block_tokens": RAY_BLOCK_TOKENS, "blocks_per_shard": RAY_BLOCKS_PER_SHARD, "progress": False}
POLL_S = 0.005


def _committed(out: Path) -> set[str]:
    return {p.parent.name for p in out.glob(f"part-*/{UNIT_RECORD_NAME}")}


def test_a_worker_killed_mid_task_is_retried_and_nothing_is_lost_or_duplicated(
    ray_instance, ray_driver, ray_inputs, bpe_tokenizer_json, tmp_path
):
    spec = f"hf:{bpe_tokenizer_json}"
    paths = list(ray_inputs.paths)
    out = tmp_path / "out"
    call = ray_driver.submit(
        write_dataset, paths, str(out), tokenizer=spec, engine="ray", ray_workers=1, unit_bytes=RAY_UNIT_BYTES, **LAYOUT
    )
    killed = None
    while not call.done() and killed is None:
        # mid-task: a part with shards written and no commit record yet, its worker converting.
        started = [
            p for p in out.glob("part-*") if not (p / UNIT_RECORD_NAME).exists() and any((p / "shards").glob("*.zst"))
        ]
        pids = ray_instance.worker_pids("ray::convert_unit_task") if started else []
        if len(pids) == 1:
            os.kill(pids[0], signal.SIGKILL)
            killed = (pids[0], started[0].name)
        time.sleep(POLL_S)
    call.result(timeout=300)
    assert killed is not None, "the conversion finished before a worker could be killed mid-task"

    reference = tmp_path / "reference"
    write_dataset(paths, str(reference), tokenizer=spec, **LAYOUT)
    assert_same_contents(dataset_contents(str(out)), dataset_contents(str(reference)))
    manifest = Manifest.load(str(out))
    referenced = [s.path for s in manifest.shards] + [s.index_path for s in manifest.shards]
    assert len(set(referenced)) == len(referenced)
    on_disk = {p.relative_to(out).as_posix() for p in out.glob("part-*/shards/*")}
    assert on_disk == set(referenced)  # The killed attempt left nothing beside what the retry wrote
    assert not list(out.rglob(TEMP_PREFIX + "*"))


def test_a_driver_killed_before_the_commit_leaves_no_manifest_and_a_rerun_reuses_complete_units(
    ray_instance, ray_driver, ray_inputs, bpe_tokenizer_json, tmp_path
):
    spec = f"hf:{bpe_tokenizer_json}"
    paths = list(ray_inputs.paths)
    out = tmp_path / "out"
    num_units = len(cut_units(paths, config=WriteConfig(), unit_bytes=RAY_UNIT_BYTES))
    command = [
        sys.executable, "-m", "zephon_stream", "write", *paths, "-o", str(out), "--tokenizer", spec,
        "--engine", "ray", "--ray-address", ray_instance.address, "--ray-workers", "1",
        "--unit-bytes", str(RAY_UNIT_BYTES), "--block-tokens", str(RAY_BLOCK_TOKENS),
        "--blocks-per-shard", str(RAY_BLOCKS_PER_SHARD), "--no-progress",
    ]  # fmt: skip
    driver = subprocess.Popen(command, env=ray_instance.child_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 240
        while not _committed(out):
            assert driver.poll() is None, driver.stderr.read().decode()[-3000:] if driver.stderr else ""
            assert time.monotonic() < deadline, "no unit completed in 240 s"
            time.sleep(POLL_S)
        driver.send_signal(signal.SIGKILL)
    finally:
        driver.kill()
        driver.wait()
        if driver.stderr:
            driver.stderr.close()
    assert not (out / "manifest").exists()
    complete_after_kill = _committed(out)
    assert 0 < len(complete_after_kill) < num_units

    summary = ray_driver.call(
        write_dataset, paths, str(out), tokenizer=spec, engine="ray", ray_workers=2, unit_bytes=RAY_UNIT_BYTES, **LAYOUT
    )
    assert summary.num_units == num_units
    assert len(complete_after_kill) <= summary.units_reused < num_units
    assert "units reused" in summary.table()
    reference = tmp_path / "reference"
    write_dataset(paths, str(reference), tokenizer=spec, **LAYOUT)
    assert_same_contents(dataset_contents(str(out)), dataset_contents(str(reference)))
    again = ray_driver.call(
        write_dataset,
        paths,
        str(tmp_path / "clean"),
        tokenizer=spec,
        engine="ray",
        ray_workers=2,
        unit_bytes=RAY_UNIT_BYTES,
        **LAYOUT,
    )
    assert again.fingerprint == summary.fingerprint
    assert (tmp_path / "clean" / "manifest").read_bytes() == (out / "manifest").read_bytes()


def test_ray_engine_writes_to_s3_on_seaweedfs(ray_driver, ray_inputs, seaweedfs_server, tmp_path):
    bucket = new_bucket("seaweedfs", seaweedfs_server)
    url, options = bucket.url("ds"), bucket.storage_options
    paths = list(ray_inputs.paths)
    summary = ray_driver.call(
        write_dataset,
        paths,
        url,
        tokenizer="bytes",
        engine="ray",
        ray_workers=2,
        unit_bytes=RAY_UNIT_BYTES,
        storage_options=options,
        **LAYOUT,
    )
    local = ray_driver.call(
        write_dataset,
        paths,
        str(tmp_path / "local"),
        tokenizer="bytes",
        engine="ray",
        ray_workers=2,
        unit_bytes=RAY_UNIT_BYTES,
        **LAYOUT,
    )
    assert summary.num_units > 1 and summary.fingerprint == local.fingerprint
    reference = tmp_path / "reference"
    write_dataset(paths, str(reference), tokenizer="bytes", **LAYOUT)
    assert_same_contents(dataset_contents(url, options), dataset_contents(str(reference)))
    assert json.loads(json.dumps(summary.to_dict()))["units_reused"] == 0
