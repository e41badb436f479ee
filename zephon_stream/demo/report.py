"""The demo's results: per-step data hashes against the reference, run
figures as a table, and an optional plot of loss and tokens/s over steps.

Steps count from 0, as the loader, its audit log and ``zephon-stream which
--step`` count them; ``kill_step`` is the number of steps checkpointed before
the kill, so the resumed run starts at step ``kill_step``."""

from __future__ import annotations

import dataclasses
import json
import pathlib
import shlex
from collections.abc import Sequence
from typing import Any

# The counters the table shows, as the loader's stats() names them; a
# counter the loader does not report is shown as "n/a", never as zero.
_COUNTERS = (
    ("bytes fetched", "bytes_fetched", "{:,.0f}"),
    ("blocks fetched", "blocks_fetched", "{:,.0f}"),
    ("retries", "retries", "{:,.0f}"),
    ("throttled", "throttled", "{:,.0f}"),
    ("stall s", "stall_s", "{:.3f}"),
)


@dataclasses.dataclass(kw_only=True, slots=True)
class RunFigures:
    """One launch: its world size, its steps and what its loader counted."""

    name: str
    world_size: int
    steps: dict[int, dict[str, Any]]
    start_step: int

    @property
    def last(self) -> dict[str, Any]:
        return self.steps[max(self.steps)]

    def tokens_per_s(self) -> float:
        """Tokens over time of every step but the launch's first (which pays for warm-up)."""
        timed = [self.steps[s] for s in sorted(self.steps)[1:]] or list(self.steps.values())
        seconds = sum(e["step_s"] for e in timed)
        tokens = sum(e["tokens_per_s"] * e["step_s"] for e in timed)
        return tokens / seconds if seconds else 0.0


@dataclasses.dataclass(kw_only=True, slots=True)
class DemoReport:
    """Everything the demo compares and prints."""

    reference: RunFigures
    interrupted: RunFigures
    resumed: RunFigures
    kill_step: int
    last_step_before_kill: int
    comparisons: list[tuple[int, str, str | None]]
    resume_at: dict[str, Any] | None = None

    @property
    def mismatches(self) -> list[int]:
        return [step for step, ref, got in self.comparisons if ref != got]

    @property
    def all_match(self) -> bool:
        return bool(self.comparisons) and not self.mismatches

    def text(self) -> str:
        """The report as printed: runs table, hash table, verdict."""
        return "\n\n".join([self._runs_table(), self._hash_table(), self._progress(), self._verdict()])

    def _runs_table(self) -> str:
        header = ["run", "W", "steps", "tokens/s", "final loss", *(label for label, _, _ in _COUNTERS)]
        rows = []
        for run in (self.reference, self.interrupted, self.resumed):
            counters = run.last.get("loader", {})
            steps = f"{min(run.steps)}-{max(run.steps)}"
            rows.append(
                [
                    run.name,
                    str(run.world_size),
                    steps,
                    f"{run.tokens_per_s():,.0f}",
                    f"{run.last['loss']:.4f}",
                    *(fmt.format(counters[key]) if key in counters else "n/a" for _, key, fmt in _COUNTERS),
                ]
            )
        return format_table(header, rows)

    def _hash_table(self) -> str:
        wanted = {0, self.kill_step - 1, self.kill_step, self.kill_step + 1, max(self.reference.steps)}
        wanted.update(self.mismatches)
        # With --schedule each step event names its phase; show where each phase starts.
        phases = {step: event.get("phase") for step, event in self.reference.steps.items()}
        scheduled = any(phase for phase in phases.values())
        if scheduled:
            wanted.update(step for step in phases if phases.get(step - 1, phases[step]) != phases[step])
        rows = []
        for step, ref, got in self.comparisons:
            if step in wanted:
                run = self.interrupted if step < self.kill_step else self.resumed
                row = [
                    str(step),
                    ref,
                    got or "(missing)",
                    f"{run.name} W={run.world_size}",
                    "yes" if ref == got else "NO",
                ]
                rows.append(row + [str(phases.get(step))] if scheduled else row)
        title = "per-step data hashes (sha256 of the global batch), selected steps:"
        header = ["step", "reference", "interrupted/resumed", "from", "match"] + (["phase"] if scheduled else [])
        return title + "\n" + format_table(header, rows)

    def _progress(self) -> str:
        rows = [
            [
                str(stream["stream"]),
                stream["fingerprint"][:16],
                str(stream["lanes"]),
                str(stream["epoch"]),
                f"{stream['samples']:,}",
                f"{stream['samples_in_epoch']:,} of {stream['samples_read_per_epoch']:,}",
            ]
            for stream in self.resumed.last.get("progress", [])
        ]
        table = format_table(["stream", "dataset", "lanes", "epoch", "samples read", "of this epoch"], rows)
        state = json.dumps(self.resumed.last.get("state"), default=str)
        return (
            f"per-stream progress after step {max(self.resumed.steps)}:\n{table}\n\n"
            f"loader state (all a checkpoint holds of the data order): {state}"
        )

    def _verdict(self) -> str:
        first, second = self.interrupted.world_size, self.resumed.world_size
        lost = self.last_step_before_kill - self.kill_step + 1
        lines = [
            f"killed at W={first} after the checkpoint of steps 0 to {self.kill_step - 1} ({lost} later steps lost "
            f"with the kill), resumed at W={second} at step {self.kill_step} (steps count from 0)."
        ]
        at = self.resume_at
        if at:
            lines.append(
                f"step {self.kill_step} resumes mid-shard: its first sample is sample {at['sample_in_block']} of "
                f"{at['samples_in_block']} in block {at['block_in_shard']} of "
                f"{at['blocks_in_shard']} of {at['shard']}; "
                f"{at['mid_block_samples']} of its {at['batch_samples']} samples start inside a block."
            )
        if self.all_match:
            lines.append(
                f"OK: all {len(self.comparisons)} steps read exactly the reference's data "
                f"(reference W={self.reference.world_size})."
            )
        else:
            lines.append(
                f"MISMATCH: {len(self.mismatches)} of {len(self.comparisons)} steps differ from the reference, "
                f"first at step {self.mismatches[0] if self.mismatches else '-'}."
            )
        return "\n".join(lines)


def format_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A plain text table, columns padded to their widest cell."""
    widths = [max(len(str(row[i])) for row in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(str(cell).ljust(width) for cell, width in zip(row, widths)).rstrip() for row in [header, *rows]]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(lines)


def _figures(name: str, events: list[dict[str, Any]]) -> RunFigures:
    start = next((e for e in events if e["event"] == "start"), None)
    steps = {e["step"]: e for e in events if e["event"] == "step"}
    if start is None or not steps:
        raise ValueError(f"run {name}: its event log has no start or no step")
    return RunFigures(name=name, world_size=start["world_size"], steps=steps, start_step=start["start_step"])


def build(
    *,
    reference: list[dict[str, Any]],
    interrupted: list[dict[str, Any]],
    resumed: list[dict[str, Any]],
    kill_step: int,
    last_step_before_kill: int,
) -> DemoReport:
    """Compare each step's data hash of the interrupted-then-resumed job with the reference.

    Steps before ``kill_step`` come from the interrupted run, the others from
    the resumed run (the interrupted run's steps after its last checkpoint
    were lost with it and redone).
    """
    ref = _figures("reference", reference)
    first = _figures("interrupted", interrupted)
    second = _figures("resumed", resumed)
    comparisons = []
    for step in sorted(ref.steps):
        run = first if step < kill_step else second
        event = run.steps.get(step)
        comparisons.append((step, ref.steps[step]["hash"], event["hash"] if event else None))
    return DemoReport(
        reference=ref,
        interrupted=first,
        resumed=second,
        kill_step=kill_step,
        last_step_before_kill=last_step_before_kill,
        comparisons=comparisons,
        resume_at=next(
            (e.get("resume_at") for e in interrupted if e["event"] == "checkpoint" and e["steps_done"] == kill_step),
            None,
        ),
    )


def check_plot_support() -> None:
    """Raise ConfigError now, not after the runs, if matplotlib is missing."""
    from zephon_stream.errors import ConfigError

    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise ConfigError("--plot needs matplotlib: pip install -e '.[demo]'") from None


def write_plot(report: DemoReport, path: str) -> None:
    """PNG of loss and tokens/s per step, reference against the resized job, resize marked."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    fig, (ax_loss, ax_speed) = plt.subplots(2, 1, sharex=True, figsize=(9, 6.5))
    ref_steps = sorted(report.reference.steps)
    before = [s for s in sorted(report.interrupted.steps) if s < report.kill_step]
    lost = [s for s in sorted(report.interrupted.steps) if s >= report.kill_step]
    after = sorted(report.resumed.steps)
    series = [
        (report.reference, ref_steps, f"reference, W={report.reference.world_size}", "0.75", "-"),
        (report.interrupted, before, f"job, W={report.interrupted.world_size}", "tab:blue", "-"),
        (report.interrupted, lost, "steps lost to the kill", "tab:red", ":"),
        (report.resumed, after, f"job resumed, W={report.resumed.world_size}", "tab:orange", "-"),
    ]
    for run, steps, label, color, style in series:
        if not steps:
            continue
        # The reference is drawn wide underneath: where the job's loss
        # matches it, both stay visible.
        wide = {"linewidth": 5, "alpha": 0.6} if run is report.reference else {"marker": "."}
        ax_loss.plot(steps, [run.steps[s]["loss"] for s in steps], style, color=color, label=label, **wide)
        ax_speed.plot(steps, [run.steps[s]["tokens_per_s"] for s in steps], style, color=color, label=label, **wide)
    for ax in (ax_loss, ax_speed):
        ax.axvline(report.kill_step - 0.5, color="black", linestyle="--", linewidth=1)
        ax.grid(alpha=0.3)
    ax_loss.annotate(
        f" killed after the checkpoint of {report.kill_step} steps\n resumed W={report.interrupted.world_size}"
        f" -> W={report.resumed.world_size}",
        xy=(report.kill_step - 0.5, 1.0),
        xycoords=("data", "axes fraction"),
        va="top",
        fontsize=9,
    )
    ax_loss.set_ylabel("loss")
    ax_speed.set_ylabel("tokens/s")
    ax_speed.set_xlabel("step (from 0)")
    verdict = "data hashes match the reference" if report.all_match else f"{len(report.mismatches)} steps' data differ"
    ax_loss.set_title(f"zephon-stream demo: kill, resume at another world size ({verdict})")
    ax_loss.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    pathlib.Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def which_command(
    urls: Sequence[str],
    *,
    step: int,
    world_size: int,
    seed: int,
    seq_len: int,
    global_batch: int,
    phases: list[dict[str, Any]] | None = None,
    packing: str = "concat",
) -> str:
    """The ``zephon-stream which`` line that shows step ``step`` of the demo's
    datasets ``urls`` with the demo's settings (its ``phases`` inline when it
    trains on a schedule, its ``packing`` when not the default), read by
    ``world_size`` ranks."""
    if phases is not None:
        schedule = json.dumps({"seed": seed, "phases": phases}, separators=(",", ":"))
        settings = ["--schedule", schedule]
    else:
        settings = ["--seq-len", str(seq_len), "--global-batch", str(global_batch), "--seed", str(seed)]
    if packing != "concat":
        settings += ["--packing", packing]
    words = ["zephon-stream", "which", *urls, "--step", str(step), *settings, "--world-size", str(world_size), "--text"]
    return shlex.join(words)
