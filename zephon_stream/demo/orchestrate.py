"""The demo's three runs: an uninterrupted reference, a job killed mid-shard
after a checkpoint, and its resumption at another world size.

Each run is ``torchrun`` with ``python -m zephon_stream.demo.train`` as the
worker; this module launches them, kills the second one with SIGKILL (no
chance to clean up, as when a node dies), and hands the event logs to
``report``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import pathlib
import shutil
import sysconfig
import tempfile
import time
from collections.abc import Iterator, Sequence
from typing import Any

from zephon_stream.demo.launch import TorchrunJob, last_step, read_events, wait_until
from zephon_stream.errors import ConfigError

DEFAULT_BUCKET = "zephon-demo"
DATASET_NAME = "stdlib-bytes"


@dataclasses.dataclass(kw_only=True, slots=True)
class DemoConfig:
    """What the demo converts, trains and compares.

    Attributes:
        steps: steps of each full run (steps 0 to steps - 1: steps count
            from 0, as the loader, its audit log and ``which`` count them).
        world_sizes: ranks of the interrupted run, then of the resumed run.
        reference_world_size: ranks of the uninterrupted reference run.
        kill_after: steps checkpointed before the kill; the resumed run
            starts at this step (default: the checkpoint nearest the middle
            of the run).
        ckpt_every: steps between checkpoints.
        seq_len: tokens per sample.
        global_batch: samples per step over all ranks (divisible by every world size).
        inputs: files or globs to convert (default: the stdlib's top-level ``.py`` files).
        store: dataset location (local folder or ``s3://bucket/prefix``);
            default: an embedded S3 server on 127.0.0.1.
        s3_port: port tried first for the embedded S3 server.
        workdir: folder for checkpoints, logs and pid files (default: a temp folder).
        keep: keep ``workdir`` (and a local dataset) after the demo.
        block_tokens: tokens per block (small, so the run crosses blocks and shards).
        blocks_per_shard: blocks per shard.
        seed: data order and model init seed.
        schedule: train on a data schedule (``phases()``): pretrain on the
            corpus, anneal on a new mixture with a second dataset, then long
            context at twice the seq_len; the kill and resize fall inside
            the anneal.
        packing: the loader's ``packing`` in every run (``plan.PACKINGS``).
    """

    steps: int = 40
    world_sizes: tuple[int, int] = (2, 1)
    reference_world_size: int = 1
    kill_after: int | None = None
    ckpt_every: int = 5
    seq_len: int = 128
    global_batch: int = 12
    inputs: Sequence[str] = ()
    store: str | None = None
    s3_port: int = 9555
    workdir: str | None = None
    keep: bool = False
    block_tokens: int = 2**12 + 1
    blocks_per_shard: int = 16
    seed: int = 0
    schedule: bool = False
    packing: str = "concat"

    def phases(self) -> list[dict[str, Any]] | None:
        """The loader's schedule with ``schedule`` (global steps from 0), else None."""
        if not self.schedule:
            return None
        anneal, long_context = self.steps * 2 // 5, self.steps * 7 // 10
        return [
            {"start_step": 0, "global_batch": self.global_batch, "seq_len": self.seq_len, "weights": [1, 0]},
            {"start_step": anneal, "global_batch": self.global_batch, "seq_len": self.seq_len, "weights": [1, 1]},
            {"start_step": long_context, "global_batch": self.global_batch, "seq_len": 2 * self.seq_len,
             "weights": [1, 1]},
        ]  # fmt: skip

    def checked(self) -> DemoConfig:
        """This config, or a ConfigError naming the flag that cannot work."""
        from zephon_stream.plan.packing import PACKINGS

        if self.packing not in PACKINGS:
            raise ConfigError(f"--packing must be one of {', '.join(PACKINGS)}, got {self.packing!r}")
        if len(self.world_sizes) != 2 or min(self.world_sizes) < 1:
            raise ConfigError(f"--world-sizes needs two positive sizes (interrupted,resumed), got {self.world_sizes}")
        if self.world_sizes[0] == self.world_sizes[1]:
            raise ConfigError(f"--world-sizes {self.world_sizes}: the resumed run must use another world size")
        for size in (*self.world_sizes, self.reference_world_size):
            if self.global_batch % size:
                raise ConfigError(f"--global-batch {self.global_batch} is not divisible by world size {size}")
        if self.ckpt_every < 1 or self.steps < 2 * self.ckpt_every:
            raise ConfigError(
                f"--steps {self.steps} must cover at least two checkpoints of every {self.ckpt_every} steps"
            )
        kill_after = self.kill_step
        if kill_after % self.ckpt_every or not 0 < kill_after < self.steps - self.steps_lost:
            raise ConfigError(
                f"--kill-after {kill_after} must be a checkpoint step (a multiple of {self.ckpt_every}) "
                f"before step {self.steps - self.steps_lost}"
            )
        phases = self.phases()
        if phases is not None:
            # The resumed run starts at step kill_after, which the anneal must hold.
            first, end = phases[1]["start_step"], phases[2]["start_step"]
            if not first <= kill_after < end:
                raise ConfigError(
                    f"--kill-after {kill_after}: with --schedule the resize must fall inside the anneal, "
                    f"steps {first} to {end - 1}"
                )
        return self

    @property
    def steps_lost(self) -> int:
        """Steps the interrupted run trains past its last checkpoint before the kill."""
        return max(1, self.ckpt_every // 2)

    @property
    def kill_step(self) -> int:
        """Steps the interrupted run checkpoints before it is killed (steps 0 to
        kill_step - 1); the resumed run starts at step kill_step."""
        if self.kill_after is not None:
            return self.kill_after
        return max(self.ckpt_every, (self.steps // 2) // self.ckpt_every * self.ckpt_every)


def default_inputs() -> list[str]:
    """The top-level ``.py`` files of this Python's standard library."""
    return [os.path.join(sysconfig.get_paths()["stdlib"], "*.py")]


def anneal_inputs() -> list[str]:
    """The second dataset of ``--schedule``: a few standard library packages."""
    stdlib = sysconfig.get_paths()["stdlib"]
    return [os.path.join(stdlib, package, "*.py") for package in ("json", "email", "asyncio")]


@contextlib.contextmanager
def open_demo_store(config: DemoConfig) -> Iterator[str]:
    """Yield the dataset URL: below ``--store``, or in a bucket of an embedded S3 server.

    While the embedded server runs, the standard AWS variables point at it, so
    the writer here and the training ranks in child processes reach it alike.
    """
    if config.store is not None:
        yield config.store.rstrip("/") + "/" + DATASET_NAME
        return
    from zephon_stream.storage.embedded_s3 import EmbeddedS3

    server = EmbeddedS3(port=config.s3_port)
    try:
        server.start()
    except ImportError as exc:
        raise ConfigError(
            f"the embedded S3 server needs moto[server] ({exc}): pip install -e '.[demo]', "
            "or pass --store with a local folder or an s3:// URL"
        ) from None
    try:
        # A taken --s3-port is reported once, by EmbeddedS3's warning.
        print(f"embedded S3 (moto) serving on {server.endpoint_url}")
        bucket = server.create_bucket(DEFAULT_BUCKET)
        with server.exported_env():
            yield f"{bucket}/{DATASET_NAME}"
    finally:
        server.stop()


def convert(config: DemoConfig, url: str, inputs: Sequence[str] = ()) -> Any:
    """Write the demo corpus (or ``inputs``) to ``url`` with the byte tokenizer; print the summary."""
    from zephon_stream.writer.api import write_dataset

    inputs = list(inputs) or list(config.inputs) or default_inputs()
    print(f"converting {' '.join(inputs)} -> {url}")
    summary = write_dataset(
        inputs,
        url,
        tokenizer="bytes",
        block_tokens=config.block_tokens,
        blocks_per_shard=config.blocks_per_shard,
        workers=min(2, os.cpu_count() or 1),
        overwrite=True,
    )
    print(summary.table())
    return summary


def worker_args(config: DemoConfig, url: str, *, vocab_size: int) -> list[str]:
    """The arguments every run's workers (``python -m zephon_stream.demo.train``) share."""
    data = [url, url + "-anneal"] if config.schedule else [url]
    return [
        "--data", *data,
        *(["--schedule", json.dumps(config.phases())] if config.schedule else []),
        "--steps", str(config.steps),
        "--seq-len", str(config.seq_len),
        "--global-batch", str(config.global_batch),
        "--vocab-size", str(vocab_size),
        "--seed", str(config.seed),
        "--packing", config.packing,
    ]  # fmt: skip


def run_training(config: DemoConfig, url: str, workdir: pathlib.Path, *, vocab_size: int) -> dict[str, Any]:
    """Run the reference, the interrupted and the resumed jobs; return where their logs are."""
    common = worker_args(config, url, vocab_size=vocab_size)
    logs = {name: workdir / f"{name}.jsonl" for name in ("reference", "interrupted", "resumed")}
    seconds: dict[str, float] = {}
    first, second = config.world_sizes

    packing = "" if config.packing == "concat" else f", packing {config.packing}"
    print(
        f"\nreference run: {config.steps} steps (0 to {config.steps - 1}) at W={config.reference_world_size}, "
        f"uninterrupted{packing}"
    )
    start = time.monotonic()
    ref = TorchrunJob(
        name="reference",
        world_size=config.reference_world_size,
        workdir=workdir,
        args=[*common, "--events", str(logs["reference"]), "--ckpt-dir", str(workdir / "ckpt-reference")],
    )
    ref.wait()
    seconds["reference"] = time.monotonic() - start
    print(f"  done in {seconds['reference']:.1f}s")

    kill_step = config.kill_step
    ckpt_dir = workdir / "ckpt"
    print(
        f"interrupted run: W={first}, checkpoint every {config.ckpt_every} steps, "
        f"SIGKILL once steps 0 to {kill_step - 1} are checkpointed"
    )
    start = time.monotonic()
    job = TorchrunJob(
        name="interrupted",
        world_size=first,
        workdir=workdir,
        args=[
            *common,
            "--events",
            str(logs["interrupted"]),
            "--ckpt-dir",
            str(ckpt_dir),
            "--ckpt-every",
            str(config.ckpt_every),
            "--hold-after",
            str(kill_step + config.steps_lost),
        ],
    )
    wait_until(
        job,
        logs["interrupted"],
        lambda records: any(r["event"] == "checkpoint" and r["steps_done"] >= kill_step for r in records),
        f"its checkpoint of {kill_step} steps",
    )
    # The kill lands between checkpoints, as a crash would: the steps
    # after the last checkpoint are lost and the resumed run redoes them. The
    # workers hold after those steps (--hold-after), so no later checkpoint
    # can complete before the kill lands.
    wait_until(
        job,
        logs["interrupted"],
        lambda records: any(r["event"] == "holding" for r in records),
        f"step {kill_step + config.steps_lost - 1}",
    )
    job.kill()
    killed_at = last_step(read_events(logs["interrupted"]))
    seconds["interrupted"] = time.monotonic() - start
    print(
        f"  killed (SIGKILL, {first} workers + torchrun) after {seconds['interrupted']:.1f}s, "
        f"with step {killed_at} the last logged step"
    )

    print(f"resumed run: W={second}, from step {kill_step}, the newest complete checkpoint in {ckpt_dir}")
    start = time.monotonic()
    resumed = TorchrunJob(
        name="resumed",
        world_size=second,
        workdir=workdir,
        args=[
            *common,
            "--events",
            str(logs["resumed"]),
            "--ckpt-dir",
            str(ckpt_dir),
            "--ckpt-every",
            str(config.ckpt_every),
        ],
    )
    resumed.wait()
    seconds["resumed"] = time.monotonic() - start
    print(f"  done in {seconds['resumed']:.1f}s")
    return {"logs": logs, "seconds": seconds, "last_step_before_kill": killed_at}


def run_demo(config: DemoConfig, *, plot: str | None = None) -> int:
    """Convert, train, kill, resume, compare; print the report. Returns the exit code."""
    from zephon_stream.demo import report
    from zephon_stream.format.manifest import Manifest

    config = config.checked()
    if plot:
        report.check_plot_support()
    started = time.monotonic()
    workdir = pathlib.Path(config.workdir) if config.workdir else pathlib.Path(tempfile.mkdtemp(prefix="zephon-demo-"))
    workdir.mkdir(parents=True, exist_ok=True)
    for stale in ("reference.jsonl", "interrupted.jsonl", "resumed.jsonl"):
        (workdir / stale).unlink(missing_ok=True)
    for stale in ("ckpt", "ckpt-reference", "pids", "tmp"):
        shutil.rmtree(workdir / stale, ignore_errors=True)
    try:
        with open_demo_store(config) as url:
            convert(config, url)
            if config.schedule:
                convert(config, url + "-anneal", anneal_inputs())
            manifest = Manifest.load(url)
            outcome = run_training(config, url, workdir, vocab_size=manifest.tokenizer.vocab_size)
        result = report.build(
            reference=read_events(outcome["logs"]["reference"]),
            interrupted=read_events(outcome["logs"]["interrupted"]),
            resumed=read_events(outcome["logs"]["resumed"]),
            kill_step=config.kill_step,
            last_step_before_kill=outcome["last_step_before_kill"],
        )
        print()
        print(result.text())
        if plot:
            report.write_plot(result, plot)
            print(f"plot written to {plot}")
        if config.store is not None:
            urls = [url, url + "-anneal"] if config.schedule else [url]
            command = report.which_command(
                urls,
                step=config.kill_step,
                world_size=config.world_sizes[1],
                seed=config.seed,
                seq_len=config.seq_len,
                global_batch=config.global_batch,
                phases=config.phases(),
                packing=config.packing,
            )
            print(
                f"\nthe dataset stays in {url}; the samples of step {config.kill_step} (the first after the resize), "
                f"with the demo's settings:\n  {command}"
            )
        elapsed = time.monotonic() - started
        removed = not config.keep and config.workdir is None
        print(
            f"\ndemo finished in {elapsed:.0f}s; logs and checkpoints in {workdir}" + (" (removed)" if removed else "")
        )
        return 0 if result.all_match else 1
    finally:
        if not config.keep and config.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
