"""TorchTitan integration: a ``BaseDataLoader`` that resumes at any dp degree.

TorchTitan's own loaders store one state per data-parallel rank
(``dp_rank_3``) and refuse a checkpoint saved at another dp degree. This
loader's state is the global cursor of :class:`zephon_stream.StreamingLoader`,
the same on every rank, stored under one rank-independent key, so
``torch.distributed.checkpoint`` writes it once and every rank of any dp
degree reads it back.

Select it in a TorchTitan config::

    dataloader=ZephonDataLoader.Config(dataset_path="s3://bucket/dataset")

This module needs TorchTitan (``pip install 'zephon-stream[torchtitan]'``);
nothing else in zephon_stream imports it.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from zephon_stream.errors import ConfigError, StateMismatchError, TokenizerError
from zephon_stream.loader.packing import PackingSpec
from zephon_stream.storage.redact import redact_options

if TYPE_CHECKING:
    from zephon_stream.loader.api import StreamingLoader

INSTALL_HINT = "pip install 'zephon-stream[torchtitan]'"

try:
    from torchtitan.components.dataloader import BaseDataLoader, DataloaderExhaustedError
except ModuleNotFoundError as exc:
    # NOTE: only a missing TorchTitan (or torchdata, which it needs) gets the
    # install hint; any other import failure is a real bug and surfaces as is.
    if (exc.name or "").split(".")[0] not in ("torchtitan", "torchdata"):
        raise
    raise ModuleNotFoundError(
        f"zephon_stream.integrations.torchtitan needs TorchTitan ({exc.name} is not installed): {INSTALL_HINT}",
        name=exc.name,
    ) from exc

__all__ = ["STATE_KEY", "DataloaderExhausted", "ZephonDataLoader", "check_tokenizer", "parse_stream_spec",
           "titan_input_dict"]

STATE_KEY = "zephon"
"""The one key of :meth:`ZephonDataLoader.state_dict` (identical on every rank)."""


class DataloaderExhausted(DataloaderExhaustedError, StopIteration):
    """The end of a finite run.

    It is TorchTitan's ``DataloaderExhaustedError`` (its trainer stops on it)
    and a ``StopIteration``, so ``for`` loops and TorchTitan's validator, which
    catches ``StopIteration``, end cleanly too. ``ZephonDataLoader`` is a plain
    iterator, not a generator, so PEP 479 does not turn it into a RuntimeError.
    """


def parse_stream_spec(spec: str) -> tuple[str, float]:
    """Split a ``"url"`` or ``"url:weight"`` mixture entry.

    The text after the last ``:`` is a weight when it parses as a positive
    finite number; otherwise the whole entry is the URL (so ``s3://b/ds`` and
    ``/data/ds`` need no weight).

    Args:
        spec: one entry of ``Config.streams``.

    Returns:
        ``(url, weight)``; the weight defaults to 1.

    Raises:
        ConfigError: an empty URL, or a weight that is zero, negative or not finite.
    """
    text = spec.strip()
    url, sep, suffix = text.rpartition(":")
    weight = _number(suffix) if sep and not suffix.startswith("/") else None
    if weight is None:
        url, weight = text, 1.0
    elif not math.isfinite(weight) or weight <= 0:
        raise ConfigError(f"dataloader.streams entry {spec!r}: weight must be a positive number (got {suffix!r})")
    if not url:
        raise ConfigError(f"dataloader.streams entry {spec!r}: empty dataset URL")
    return url, weight


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def redacted_config_dict(config: Any) -> dict:
    """A loader config's ``to_dict()`` with its storage options redacted.

    NOTE: the trainer prints this dict and writes it to the dump folder and
    metric backends; storage options may hold keys. (Called with the config,
    since a slotted dataclass has no zero-argument super() on Python 3.10/3.11.)
    """
    out = BaseDataLoader.Config.to_dict(config)
    out["storage_options"] = redact_options(config.storage_options)
    return out


def redacted_config_repr(config: Any, name: str) -> str:
    """``name(field=value, ...)`` of a loader config, storage options redacted."""
    values = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}
    values["storage_options"] = redact_options(config.storage_options)
    return f"{name}(" + ", ".join(f"{key}={value!r}" for key, value in values.items()) + ")"


def local_shape(
    seq_len: int | None, local_batch_size: int | None, extra: dict[str, Any]
) -> tuple[int, int]:
    """``(seq_len, local_batch_size)`` from 0.3.0 or newer TorchTitan keywords."""
    max_context_length = extra.pop("max_context_length", None)
    num_tokens_per_batch = extra.pop("num_tokens_per_batch", None)
    if max_context_length is not None:
        if seq_len is not None and seq_len != max_context_length:
            raise ConfigError(f"seq_len {seq_len} and max_context_length {max_context_length} disagree")
        seq_len = max_context_length
    if seq_len is None or seq_len < 1:
        raise ConfigError(f"ZephonDataLoader needs seq_len (or max_context_length) >= 1 (got {seq_len})")
    if num_tokens_per_batch is not None:
        if num_tokens_per_batch % seq_len:
            raise ConfigError(
                f"num_tokens_per_batch {num_tokens_per_batch} is not a multiple of seq_len {seq_len}: "
                "every row of a batch holds exactly seq_len tokens"
            )
        rows = num_tokens_per_batch // seq_len
        if local_batch_size is not None and local_batch_size != rows:
            raise ConfigError(
                f"local_batch_size {local_batch_size} and num_tokens_per_batch {num_tokens_per_batch} "
                f"(= {rows} rows of {seq_len}) disagree"
            )
        local_batch_size = rows
    if local_batch_size is None or local_batch_size < 1:
        raise ConfigError(
            f"ZephonDataLoader needs local_batch_size (or num_tokens_per_batch) >= 1 (got {local_batch_size})"
        )
    return seq_len, local_batch_size


class ZephonDataLoader(BaseDataLoader):
    """Streams a zephon_stream dataset (or a weighted mixture) into one dp rank.

    Built by TorchTitan's trainer as ``config.dataloader.build(dp_world_size=...,
    dp_rank=..., tokenizer=..., seq_len=..., local_batch_size=...)``. Iterating
    yields ``({"input": ..., "positions": ...}, labels)`` with int64 tensors of
    shape ``[local_batch_size, seq_len]``; ``positions`` restart after each EOS,
    and by default the label of each input EOS is -100 (``cross_document_targets``).

    Args:
        config: the loader's :class:`ZephonDataLoader.Config`.
        dp_world_size: data-parallel degree.
        dp_rank: this process's data-parallel rank.
        tokenizer: optional TorchTitan tokenizer; when given, its vocabulary
            size and EOS id must match every dataset's manifest.
        seq_len: tokens per row (newer TorchTitan: ``max_context_length``).
        local_batch_size: rows per batch on this rank (newer TorchTitan:
            ``num_tokens_per_batch`` = rows x seq_len).
        **kwargs: other trainer keywords (``snapshot_every_n_steps``, ...),
            accepted and ignored: the state is a cursor, so every step is a
            snapshot.
    """

    @dataclass(kw_only=True, slots=True)
    class Config(BaseDataLoader.Config):
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

        infinite: bool = True
        """False: one pass over the data, ending where the first stream's
        first epoch ends (TorchTitan's validator asks for this when
        ``validator.steps = -1``). True: epochs repeat."""

        phases: str = ""
        """A data schedule: the JSON list of its phases (CLI:
        ``--dataloader.phases '[{"step": 1, ...}, ...]'``; a job function may
        also pass the list itself). Each phase has ``step``, the TorchTitan
        train step it starts at (the first train step is 1, so the first
        phase has ``step: 1``), and optionally ``seq_len``, ``global_batch``
        (default: the previous phase's; the first phase's: the trainer's
        seq_len and local batch x dp), ``lanes``, ``window`` (default:
        ``lanes``/``window`` above) and ``weights`` (one per stream, 0 = not
        read; default: the streams' weights). A phase's ``global_batch`` must
        be the trainer's local batch x dp while it is read: change the batch
        by relaunching at the phase's step with ``--training.local_batch_size``
        = global_batch / dp."""

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
        passes every ``input_dict`` entry but ``input`` to the model, so this
        needs a model or ``post_dataloading_process`` that takes them."""

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
            PackingSpec(cross_document_targets=self.cross_document_targets, outputs=self.packing_outputs)

        def to_dict(self) -> dict:
            """The config as TorchTitan logs and saves it, secrets redacted."""
            return redacted_config_dict(self)

        def __repr__(self) -> str:
            return redacted_config_repr(self, "ZephonDataLoader.Config")

    def __init__(
        self,
        config: Config,
        *,
        dp_world_size: int,
        dp_rank: int,
        tokenizer: Any = None,
        seq_len: int | None = None,
        local_batch_size: int | None = None,
        **kwargs: Any,
    ) -> None:
        from zephon_stream.loader.api import Stream, StreamingLoader

        if not 0 <= dp_rank < dp_world_size:
            raise ConfigError(f"dp_rank {dp_rank} is outside dp_world_size {dp_world_size}")
        seq_len, local_batch_size = local_shape(seq_len, local_batch_size, dict(kwargs))
        self.config = config
        self.dp_rank = dp_rank
        self.dp_world_size = dp_world_size
        self.seq_len = seq_len
        self.local_batch_size = local_batch_size
        if config.streams:
            streams: Any = [Stream(url, weight=weight) for url, weight in map(parse_stream_spec, config.streams)]
        else:
            streams = config.dataset_path
        if config.phases:
            shape: dict[str, Any] = {"schedule": titan_schedule(
                phase_dicts(config.phases), seq_len=seq_len, global_batch=local_batch_size * dp_world_size,
                lanes=config.lanes, window=config.window, accumulation=config.gradient_accumulation_steps,
            )}  # fmt: skip
        else:
            shape = {"seq_len": seq_len, "local_batch_size": local_batch_size, "lanes": config.lanes,
                     "window": config.window}  # fmt: skip
        self._loader = StreamingLoader(
            streams,
            **shape,
            rank=dp_rank,
            world_size=dp_world_size,
            seed=config.seed,
            storage_options=dict(config.storage_options) or None,
            device=config.device,
            # NOTE: TorchTitan 0.3.0's train_step does ``cpu_count +=
            # (labels != IGNORE_INDEX).sum()``: CUDA labels would fail there.
            host_labels=True,
            pipeline=config.pipeline,
            helper_nice=config.helper_nice,
            prefetch_steps=config.prefetch_steps,
            max_memory_bytes=config.max_memory_bytes,
            max_steps=config.max_steps,
            max_epochs=config.max_epochs,
            epochs_stream=config.epochs_stream,
            end_after_phase=config.end_after_phase,
            cross_document_targets=config.cross_document_targets,
            packing_outputs=config.packing_outputs,
        )
        self._last_sample_positions = torch.empty(0, dtype=torch.int64)
        if tokenizer is not None:
            try:
                check_tokenizer(tokenizer, self._loader.manifests)
            except BaseException:
                self._loader.close()
                raise

    @property
    def global_batch_size(self) -> int:
        """Samples consumed per step over all dp ranks."""
        return self.local_batch_size * self.dp_world_size

    @property
    def streaming_loader(self) -> StreamingLoader:
        """The underlying :class:`zephon_stream.StreamingLoader` (stats, memory bound)."""
        return self._loader

    @property
    def last_sample_positions(self) -> torch.Tensor:
        """Global sample position of each row of the batch last yielded (int64 ``[rows]``).

        NOTE: kept out of the batch because TorchTitan's trainer passes every
        ``input_dict`` entry but ``input`` to the model's forward.
        """
        return self._last_sample_positions

    def __iter__(self) -> Iterator[tuple[dict[str, torch.Tensor], torch.Tensor]]:
        # NOTE: like the StreamingLoader, the loader is its own iterator: a
        # load_state_dict seeks it, and iterating again continues from the
        # cursor rather than restarting.
        return self

    def __next__(self) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        position = self._loader.position
        schedule = self._loader.schedule
        if schedule is not None:
            phase = schedule.phase_at_position(position)
            if phase.global_batch != self.global_batch_size:
                # NOTE: TorchTitan fixes its local batch (and accumulation) when
                # it starts; a phase with another global batch needs a relaunch.
                raise ConfigError(
                    f"dataloader phase {phase.index} (TorchTitan step "
                    f"{phase.start_step // self.config.gradient_accumulation_steps + 1}): global_batch "
                    f"{phase.global_batch}, but the trainer gives local batch {self.local_batch_size} x dp "
                    f"{self.dp_world_size} = {self.global_batch_size}; relaunch from this step with "
                    f"--training.local_batch_size {phase.global_batch // self.dp_world_size}"
                )
        if not self.config.infinite and position + self.global_batch_size > self._end_of_first_pass():
            raise DataloaderExhausted(
                f"dataloader: one pass over the data (infinite=False) ended at global sample {position}"
            )
        try:
            batch = next(self._loader)
        except StopIteration:
            config = self.config
            asked = " or ".join(
                text
                for value, text in (
                    (config.max_steps, f"{config.max_steps} steps"),
                    (config.max_epochs, f"{config.max_epochs} epochs of stream {config.epochs_stream}"),
                    (config.end_after_phase, f"the end of phase {config.end_after_phase}"),
                )
                if value is not None
            )
            raise DataloaderExhausted(
                f"dataloader: the finite run ({asked}) ended at global sample {position}"
            ) from None
        self._last_sample_positions = batch["sample_positions"]
        return titan_input_dict(batch, packing_outputs=self.config.packing_outputs), batch["labels"]

    def _end_of_first_pass(self) -> int:
        """The cursor where the first stream to finish its first epoch does."""
        schedule = self._loader.schedule
        if schedule is not None:
            ends = []
            for stream in range(len(schedule.shapes)):
                try:
                    ends.append(schedule.end_step(epochs=1, stream=stream))
                except ConfigError:
                    continue  # NOTE: a stream the last phase does not read
            return schedule.position_of_step(min(ends))
        # NOTE: lane step q = P div C and a stream's epoch is q div its lane
        # length, so its first epoch ends at P = lane_length * C.
        lane_lengths = [p["lane_steps_per_epoch"] for p in self._loader.progress() if p["lanes"]]
        return min(lane_lengths) * self._loader.lanes

    def state_dict(self) -> dict[str, Any]:
        """``{"zephon": <JSON of the global loader state>}``, equal on every rank."""
        return {STATE_KEY: json.dumps(self._loader.state_dict(), sort_keys=True)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Seek to a state saved by any dp degree (an empty dict is a fresh start)."""
        if not state_dict:
            return
        if STATE_KEY not in state_dict:
            found = ", ".join(sorted(map(str, state_dict)))
            per_rank = any(str(k).startswith("dp_rank_") for k in state_dict)
            hint = " (a TorchTitan per-rank loader state)" if per_rank else ""
            raise StateMismatchError(
                f"dataloader state: expected key {STATE_KEY!r}, found [{found}]{hint}; "
                "was this checkpoint written by another dataloader?"
            )
        value = state_dict[STATE_KEY]
        if isinstance(value, (str, bytes)):
            try:
                value = json.loads(value)
            except ValueError as exc:
                raise StateMismatchError(
                    f"dataloader state {STATE_KEY!r}: not the JSON of a loader state ({exc})"
                ) from exc
        self._loader.load_state_dict(value)

    def close(self) -> None:
        """Stop the loader's threads (idempotent)."""
        self._loader.close()

    def __enter__(self) -> ZephonDataLoader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def titan_input_dict(batch: dict[str, torch.Tensor], *, packing_outputs: bool) -> dict[str, Any]:
    """TorchTitan's ``input_dict`` from a loader batch: ``input`` and
    ``positions``, and with ``packing_outputs`` the document outputs, the two
    scalars as Python ints (TorchTitan's trainer moves every tensor of
    ``input_dict`` to the device, and a kernel wants them on the host)."""
    out: dict[str, Any] = {"input": batch["input"], "positions": batch["positions"]}
    if packing_outputs:
        for key in ("segment_ids", "document_lengths", "cu_seqlens"):
            out[key] = batch[key]
        for key in ("num_cu_seqlens", "max_seqlen"):
            out[key] = int(batch[key])
    return out


def check_tokenizer(tokenizer: Any, manifests: Sequence[tuple[str, Any]]) -> None:
    """Refuse a TorchTitan tokenizer that did not produce the datasets.

    Compares the vocabulary size (``get_vocab_size()``) and the EOS id
    (``eos_id``, when the tokenizer knows it) with each manifest's tokenizer.

    Args:
        tokenizer: a TorchTitan ``BaseTokenizer`` (or anything with
            ``get_vocab_size()`` and ``eos_id``).
        manifests: ``(url, Manifest)`` per dataset.

    Raises:
        TokenizerError: naming the dataset and both values.
    """
    vocab_size = tokenizer.get_vocab_size() if hasattr(tokenizer, "get_vocab_size") else None
    eos_id = getattr(tokenizer, "eos_id", None)
    for url, manifest in manifests:
        info = manifest.tokenizer
        if vocab_size is not None and int(vocab_size) != info.vocab_size:
            raise TokenizerError(
                f"dataset {url}: written with tokenizer {info.name!r} of vocab size {info.vocab_size}, "
                f"but the trainer's tokenizer has vocab size {vocab_size}"
            )
        if eos_id is not None and int(eos_id) != info.eos_id:
            raise TokenizerError(
                f"dataset {url}: written with tokenizer {info.name!r} whose EOS id is {info.eos_id}, "
                f"but the trainer's tokenizer has EOS id {eos_id}"
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
    for k, phase in enumerate(phases):
        if "start_step" in phase or not isinstance(phase.get("step"), int) or phase["step"] < 1:
            raise ConfigError(
                f"dataloader.phases[{k}]: give 'step', the TorchTitan train step the phase starts at "
                f"(the first train step is 1), not 'start_step' (got {phase!r})"
            )
    return [dict(p) for p in phases]


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
    ``a = accumulation``. A phase without ``seq_len`` or ``global_batch``
    keeps the previous phase's; the first phase takes the trainer's, unless
    a later phase changes it: then the first phase must give it, because the
    trainer's value changes at the relaunch and the first phase has begun.

    Raises:
        ConfigError: the first phase leaves out a size a later phase changes.
    """
    for name in ("seq_len", "global_batch"):
        if name not in phases[0] and any(name in p for p in phases[1:]):
            raise ConfigError(
                f"dataloader.phases[0]: give {name} when a later phase changes it (the trainer's value "
                "changes when the job is relaunched for that phase, and the first phase must not)"
            )
    out = []
    sizes = {"seq_len": seq_len, "global_batch": global_batch}
    for phase in phases:
        sizes = {name: phase.get(name, value) for name, value in sizes.items()}
        entry: dict[str, Any] = {"start_step": (phase["step"] - 1) * accumulation, **sizes}
        if lanes is not None:
            entry["lanes"] = lanes
        if window is not None:
            entry["window"] = window
        out.append(entry | {k: v for k, v in phase.items() if k != "step"})
    return out
