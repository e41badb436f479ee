"""``ZephonDataLoader.Config`` and how its entries read: the mixture's
``"url:weight"`` entries and a schedule's phases, counted in TorchTitan train
steps, as the loader's phases.

The config's base is the installed TorchTitan's ``BaseDataLoader.Config``
with ``dataset_path`` and the repeat flag under that TorchTitan's name
(``infinite`` on 0.3.0, ``repeat`` on main: ``api.py``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from zephon_stream.errors import ConfigError
from zephon_stream.integrations.torchtitan.api import TITAN
from zephon_stream.integrations.torchtitan.base import redacted_config_dict, redacted_config_repr
from zephon_stream.loader import PackingSpec
from zephon_stream.loader.blocks.streams import parse_stream_spec

__all__ = ["ZephonDataLoaderConfig", "parse_stream_spec", "phase_dicts", "titan_schedule"]


def skip_plan(entries: list[str], accumulation: int) -> dict[int, int]:
    """``{loader step: batches to skip there}`` from ``skip_steps`` entries ``"S:N"`` (train steps from 1).

    Raises:
        ConfigError: an entry that is not ``S:N`` with ``S >= 1`` and ``N >= 1``.
    """
    plan = {}
    for entry in entries:
        try:
            train_step, count = (int(part) for part in str(entry).split(":"))
        except ValueError:
            raise ConfigError(f"dataloader.skip_steps: {entry!r} is not TRAIN_STEP:NUM_STEPS (e.g. 1200:300)") from None
        if train_step < 1 or count < 1:
            raise ConfigError(
                f"dataloader.skip_steps: {entry!r}: the train step counts from 1 and at least 1 step is skipped"
            )
        plan[(train_step - 1) * accumulation] = count * accumulation
    return plan


@dataclass(kw_only=True, slots=True)
class ZephonDataLoaderConfig(TITAN.loader_config_base(repeat=True)):
    """The configuration of :class:`ZephonDataLoader` (``ZephonDataLoader.Config``).

    ``dataset_path`` names one dataset (or use ``streams``). The repeat flag
    (``infinite`` on TorchTitan 0.3.0, ``repeat`` on main; default True):
    False reads one pass, ending where the first stream's first epoch ends
    (TorchTitan's validator asks for it with ``validator.steps = -1``); True
    repeats epochs.
    """

    streams: list[str] = field(default_factory=list)
    """Weighted datasets for a mixture: ``"url"`` or ``"url:weight"`` entries
    (CLI: comma separated). Use this or ``dataset_path``, not both."""

    seed: int = 0
    """Seed of the block permutation and window shuffle."""

    lanes: int | None = None
    """Lanes of the global order; None: the first global batch size. Keep it
    fixed for a run: it is part of the saved state."""

    window: int | None = None
    """Shuffle window in samples within a lane; None: the loader's default."""

    prefetch_steps: int = 4
    """Steps assembled ahead of the consumer."""

    max_memory_bytes: int | None = None
    """Refuse a configuration whose computed memory bound exceeds this."""

    storage_options: dict[str, Any] = field(default_factory=dict)
    """fsspec options (S3 endpoint, keys...); never logged."""

    device: str | None = None
    """``"cuda"``: token ids cross to the current CUDA device at their
    stored width from the pinned ring and are widened there: ``input`` and
    ``positions`` arrive on the device, ``labels`` as a pinned CPU tensor,
    because TorchTitan 0.3.0's trainer counts valid labels into a CPU
    tensor before it moves the batch itself. None: CPU tensors."""

    pipeline: str = "process"
    """``"process"``: fetch, decode and assembly run in a helper process,
    outside the trainer's interpreter; ``"threads"``: in the trainer's
    process (debugging)."""

    helper_nice: int = 10
    """Niceness added to the helper process: on a core it shares with the
    trainer, the trainer runs first. 0: equals."""

    max_steps: int | None = None
    """Finite run: iteration ends (``DataloaderExhausted``) after this many
    global steps, counted from the start of the run (cursor 0), so a
    resumed run ends at the same sample. None: no step limit."""

    max_epochs: int | None = None
    """Finite run: end at the step where stream ``epochs_stream`` has read
    this many whole epochs (counted from the start of the run)."""

    epochs_stream: int = 0
    """The stream (index in ``streams``) ``max_epochs`` counts."""

    end_after_phase: int | None = None
    """Finite run: end at the end of this phase (index) of ``phases``."""

    phases: str = ""
    """A data schedule: the JSON list of its phases (CLI:
    ``--dataloader.phases '[{"step": 1, ...}, ...]'``; a job function may
    also pass the list itself). Each phase has ``step``, the TorchTitan
    train step it starts at (the first train step is 1, so the first
    phase has ``step: 1``), and optionally ``seq_len`` (TorchTitan main's
    name: ``max_context_length``), ``global_batch`` in rows per microbatch
    over all dp ranks (or, in main's terms, ``num_tokens_per_train_step``
    = global_batch x gradient_accumulation_steps x seq_len) (default: the
    previous phase's; the first phase's: the trainer's), ``lanes``,
    ``window`` (default: ``lanes``/``window`` above) and ``weights`` (one
    per stream, 0 = not read; default: the streams' weights). A phase's
    batch must be the trainer's while it is read: change it by relaunching
    at the phase's step with the batch flag the loader's error names
    (0.3.0: ``--training.local_batch_size``; main:
    ``--training.num_tokens_per_microbatch_per_dp_rank``)."""

    gradient_accumulation_steps: int = 1
    """Batches the trainer takes per train step (TorchTitan's
    ``training.global_batch_size`` / (local batch x dp)); it converts the
    phases' train steps into loader steps. Keep it fixed for a run."""

    cross_document_targets: str = "ignore"
    """The label of each input EOS, whose next token starts another
    document: ``"ignore"`` (-100, TorchTitan's ``IGNORE_INDEX``: what
    TorchTitan's own text loader trains, no position learns the next
    document's first token) or ``"predict"`` (that token, the plain shifted
    window). Either resumes the other's checkpoint."""

    packing_outputs: bool = False
    """Also put ``segment_ids``, ``document_lengths``, ``cu_seqlens``
    (tensors) and ``num_cu_seqlens``, ``max_seqlen`` (ints, so the trainer
    leaves them on the host) in ``input_dict`` (docs/PACKING.md). TorchTitan
    0.3.0 passes every ``input_dict`` entry but ``input`` to the model, so
    this needs a model or ``post_dataloading_process`` that takes them.
    TorchTitan main only: refused, since main's attention builds its
    document masks from ``positions`` itself."""

    skip_steps: list[str] = field(default_factory=list)
    """Train steps whose data to skip after a loss spike (PaLM's recipe), as
    ``"S:N"``: just before TorchTitan train step ``S`` (counted from 1), move
    ``N`` train steps on (``N x gradient_accumulation_steps`` batches)
    without reading them, at any dp degree. The skip is in the loader state's
    history; a run resumed from a checkpoint saved after it does not skip
    again, one resumed from before it does."""

    packing: str = "concat"
    """How a block's rows are filled: ``"concat"`` (windows of the token
    stream) or ``"best_fit"`` (whole documents packed by best-fit
    decreasing: fewer documents cut at a row boundary; the order, the rows
    per block and resume at any dp degree are unchanged). Recorded in the
    checkpoint: a run keeps the packing it started with (docs/PACKING.md)."""

    def __post_init__(self) -> None:
        if self.dataset_path and self.streams:
            raise ConfigError("dataloader: set dataset_path or streams, not both")
        if not self.dataset_path and not self.streams:
            raise ConfigError("dataloader: set dataset_path (one dataset URL) or streams (a mixture)")
        for spec in self.streams:
            parse_stream_spec(spec)
        if self.prefetch_steps < 1:
            raise ConfigError(f"dataloader.prefetch_steps must be >= 1 (got {self.prefetch_steps})")
        if self.max_steps is not None and self.max_steps < 0:
            raise ConfigError(f"dataloader.max_steps must be >= 0 (got {self.max_steps})")
        if self.gradient_accumulation_steps < 1:
            raise ConfigError(
                f"dataloader.gradient_accumulation_steps must be >= 1 (got {self.gradient_accumulation_steps})"
            )
        phase_dicts(self.phases)
        skip_plan(self.skip_steps, 1)
        refuse_packing_outputs_on_flat_batches(self.packing_outputs)
        PackingSpec(cross_document_targets=self.cross_document_targets, outputs=self.packing_outputs, rows=self.packing)

    def to_dict(self) -> dict:
        """The config as TorchTitan logs and saves it, secrets redacted."""
        return redacted_config_dict(self)

    def __repr__(self) -> str:
        return redacted_config_repr(self, "ZephonDataLoader.Config")


def refuse_packing_outputs_on_flat_batches(packing_outputs: bool) -> None:
    """Refuse ``packing_outputs`` where TorchTitan trains 1-D batches (main).

    Raises:
        ConfigError: on TorchTitan main, which finds documents from
            ``positions`` alone and whose validator moves every ``input_dict``
            entry to the device.
    """
    if packing_outputs and TITAN.flat_batches:
        raise ConfigError(
            "dataloader.packing_outputs: TorchTitan main builds its document masks from positions (which restart "
            "at every document here) and takes no other document outputs; leave packing_outputs off"
        )


def phase_dicts(phases: list[dict[str, Any]] | str) -> list[dict[str, Any]]:
    """``Config.phases`` as a list of dicts (a JSON string is parsed).

    Raises:
        ConfigError: not JSON, not a list of objects, or a phase without ``step``.
    """
    if isinstance(phases, str):
        try:
            phases = json.loads(phases) if phases.strip() else []
        except ValueError as exc:
            raise ConfigError(f"dataloader.phases: not a JSON list of phases ({exc})") from exc
    if not isinstance(phases, (list, tuple)) or not all(isinstance(p, dict) for p in phases):
        raise ConfigError(f"dataloader.phases: expected a list of phase tables, got {phases!r}")
    out = []
    for k, phase in enumerate(phases):
        if "start_step" in phase or not isinstance(phase.get("step"), int) or phase["step"] < 1:
            raise ConfigError(
                f"dataloader.phases[{k}]: give 'step', the TorchTitan train step the phase starts at "
                f"(the first train step is 1), not 'start_step' (got {phase!r})"
            )
        phase = dict(phase)
        if "max_context_length" in phase:
            # TorchTitan main's name for the row length.
            length = phase.pop("max_context_length")
            if phase.setdefault("seq_len", length) != length:
                raise ConfigError(
                    f"dataloader.phases[{k}]: seq_len {phase['seq_len']} and max_context_length {length} disagree"
                )
        if "num_tokens_per_train_step" in phase and "global_batch" in phase:
            raise ConfigError(f"dataloader.phases[{k}]: give global_batch or num_tokens_per_train_step, not both")
        out.append(phase)
    return out


def titan_schedule(
    phases: list[dict[str, Any]],
    *,
    seq_len: int,
    global_batch: int,
    lanes: int | None,
    window: int | None,
    accumulation: int,
) -> list[dict[str, Any]]:
    """Phases counted in TorchTitan train steps as the loader's phases.

    Train step ``s`` (from 1) takes loader steps ``[(s - 1) a, s a)`` with
    ``a = accumulation``. A phase's ``num_tokens_per_train_step`` is
    ``global_batch x a x seq_len``. A phase without ``seq_len`` or a batch
    keeps the previous phase's; the first phase takes the trainer's, unless
    a later phase changes it: then the first phase must give it, because the
    trainer's value changes at the relaunch and the first phase has begun.

    Raises:
        ConfigError: the first phase leaves out a size a later phase changes,
            or a token budget that is not a whole number of rows.
    """
    givers = {"seq_len": ("seq_len",), "global_batch": ("global_batch", "num_tokens_per_train_step")}
    for name, keys in givers.items():
        if not any(key in phases[0] for key in keys) and any(key in p for p in phases[1:] for key in keys):
            raise ConfigError(
                f"dataloader.phases[0]: give {name} when a later phase changes it (the trainer's value "
                "changes when the job is relaunched for that phase, and the first phase must not)"
            )
    out = []
    sizes = {"seq_len": seq_len, "global_batch": global_batch}
    for k, phase in enumerate(phases):
        sizes = {name: phase.get(name, value) for name, value in sizes.items()}
        if "num_tokens_per_train_step" in phase:
            phase = dict(phase)
            tokens = phase.pop("num_tokens_per_train_step")
            rows, rest = divmod(tokens, accumulation * sizes["seq_len"])
            if rest or rows < 1:
                raise ConfigError(
                    f"dataloader.phases[{k}]: num_tokens_per_train_step {tokens} is not a whole number of rows of "
                    f"{sizes['seq_len']} tokens x {accumulation} gradient accumulation steps"
                )
            sizes["global_batch"] = rows
        entry: dict[str, Any] = {"start_step": (phase["step"] - 1) * accumulation, **sizes}
        if lanes is not None:
            entry["lanes"] = lanes
        if window is not None:
            entry["window"] = window
        out.append(entry | {key: value for key, value in phase.items() if key != "step"})
    return out
