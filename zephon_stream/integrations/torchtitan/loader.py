"""``ZephonDataLoader``: a TorchTitan ``BaseDataLoader`` that resumes at any dp degree.

TorchTitan's own loaders store one state per data-parallel rank
(``dp_rank_3``) and refuse a checkpoint saved at another dp degree. This
loader's state is the global cursor of :class:`zephon_stream.StreamingLoader`,
the same on every rank, stored under one rank-independent key, so
``torch.distributed.checkpoint`` writes it once and every rank of any dp
degree reads it back. A row is ``seq_len`` (main: ``max_context_length``)
tokens of the one global order on either TorchTitan; main's 1-D batch is
its rows laid end to end.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch

from zephon_stream.errors import ConfigError
from zephon_stream.integrations.torchtitan.api import TITAN
from zephon_stream.integrations.torchtitan.base import (
    BaseDataLoader,
    DataloaderExhausted,
    check_tokenizer,
    titan_shape,
)
from zephon_stream.integrations.torchtitan.batches import titan_batch
from zephon_stream.integrations.torchtitan.config import (
    ZephonDataLoaderConfig,
    parse_stream_spec,
    phase_dicts,
    skip_plan,
    titan_schedule,
)
from zephon_stream.integrations.torchtitan.state import loader_state_from_titan, titan_state

if TYPE_CHECKING:
    from zephon_stream.loader import StreamingLoader

__all__ = ["ZephonDataLoader"]


class ZephonDataLoader(BaseDataLoader):
    """Streams a zephon_stream dataset (or a weighted mixture) into one dp rank.

    Built by TorchTitan's trainer as ``config.dataloader.build(dp_world_size=...,
    dp_rank=..., tokenizer=..., seq_len=..., local_batch_size=...)`` (0.3.0) or
    ``build(..., max_context_length=..., num_tokens_per_batch=...)`` (main).
    Iterating yields ``({"input": ..., "positions": ...}, labels)`` with int64
    tensors of shape ``[local_batch_size, seq_len]`` (0.3.0) or 1-D
    ``[num_tokens_per_batch]`` (main: the rows end to end, then any padding);
    ``positions`` restart after each EOS and at each row, and by default the
    label of each input EOS is -100 (``cross_document_targets``).

    Args:
        config: the loader's :class:`ZephonDataLoader.Config`.
        dp_world_size: data-parallel degree.
        dp_rank: this process's data-parallel rank.
        tokenizer: optional TorchTitan tokenizer; when given, its vocabulary
            size and EOS id must match every dataset's manifest.
        seq_len: tokens per row (TorchTitan main: ``max_context_length``).
        local_batch_size: rows per batch on this rank (TorchTitan main:
            ``num_tokens_per_batch`` = rows x seq_len, plus any padding).
        **kwargs: other trainer keywords (``snapshot_every_n_steps``, ...),
            accepted and ignored: the state is a cursor, so every step is a
            snapshot.
    """

    Config = ZephonDataLoaderConfig

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
        from zephon_stream.loader import Stream, StreamingLoader

        if not 0 <= dp_rank < dp_world_size:
            raise ConfigError(f"dp_rank {dp_rank} is outside dp_world_size {dp_world_size}")
        self.shape = titan_shape(seq_len, local_batch_size, dict(kwargs))
        seq_len, local_batch_size = self.shape.seq_len, self.shape.rows
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
            shape: dict[str, Any] = {
                "schedule": titan_schedule(
                    phase_dicts(config.phases),
                    seq_len=seq_len,
                    global_batch=local_batch_size * dp_world_size,
                    lanes=config.lanes,
                    window=config.window,
                    accumulation=config.gradient_accumulation_steps,
                )
            }
        else:
            shape = {
                "seq_len": seq_len,
                "local_batch_size": local_batch_size,
                "lanes": config.lanes,
                "window": config.window,
            }
        self._loader = StreamingLoader(
            streams,
            **shape,
            rank=dp_rank,
            world_size=dp_world_size,
            seed=config.seed,
            storage_options=dict(config.storage_options) or None,
            device=config.device,
            # TorchTitan's train_step (0.3.0 and main) does ``cpu_count +=
            # (labels != IGNORE_INDEX).sum()``: CUDA labels would fail there.
            host_labels=True,
            # Main's 1-D batches come from the delivery, made once per ring slot.
            batch_layout=TITAN.batch_layout,
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
            packing=config.packing,
        )
        self._last_sample_positions = torch.empty(0, dtype=torch.int64)
        self._skips = skip_plan(config.skip_steps, config.gradient_accumulation_steps)
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

        Kept out of the batch because TorchTitan's trainer passes every
        ``input_dict`` entry but ``input`` to the model's forward.
        """
        return self._last_sample_positions

    def __iter__(self) -> Iterator[tuple[dict[str, torch.Tensor], torch.Tensor]]:
        # Like the StreamingLoader, the loader is its own iterator: a
        # load_state_dict seeks it, and iterating again continues from the
        # cursor rather than restarting.
        return self

    def __next__(self) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        if self._skips:
            skip = self._skips.get(self._loader.step)
            if skip:
                # The skip moves the step on, so it runs once per run that reaches it.
                self._loader.skip_steps(skip)
        position = self._loader.position
        schedule = self._loader.schedule
        if schedule is not None:
            phase = schedule.phase_at_position(position)
            if phase.global_batch != self.global_batch_size:
                # TorchTitan fixes its local batch (and accumulation) when
                # it starts; a phase with another global batch needs a relaunch.
                relaunch_flag = TITAN.batch_flag_value(
                    rows=phase.global_batch // self.dp_world_size, seq_len=phase.spec.seq_len
                )
                raise ConfigError(
                    f"dataloader phase {phase.index} (TorchTitan step "
                    f"{phase.start_step // self.config.gradient_accumulation_steps + 1}): global_batch "
                    f"{phase.global_batch}, but the trainer gives local batch {self.local_batch_size} x dp "
                    f"{self.dp_world_size} = {self.global_batch_size}; relaunch from this step with "
                    f"{relaunch_flag}"
                )
        if not TITAN.repeats(self.config) and position + self.global_batch_size > self._end_of_first_pass():
            raise DataloaderExhausted(
                f"dataloader: one pass over the data ({TITAN.repeat_field}=False) ended at global sample {position}"
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
        return titan_batch(batch, shape=self.shape, packing_outputs=self.config.packing_outputs)

    def _end_of_first_pass(self) -> int:
        """The cursor where the first stream to finish its first epoch does."""
        schedule = self._loader.schedule
        if schedule is not None:
            ends = []
            for stream in range(len(schedule.shapes)):
                try:
                    ends.append(schedule.end_step(epochs=1, stream=stream))
                except ConfigError:
                    continue  # A stream the last phase does not read
            return schedule.position_of_step(min(ends))
        # Lane step q = P div C and a stream's epoch is q div its lane
        # length, so its first epoch ends at P = lane_length * C.
        lane_lengths = [p["lane_steps_per_epoch"] for p in self._loader.progress() if p["lanes"]]
        return min(lane_lengths) * self._loader.lanes

    def state_dict(self) -> dict[str, Any]:
        """``{"zephon": <JSON of the global loader state>}``, equal on every rank."""
        return titan_state(self._loader.state_dict())

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Seek to a state saved by any dp degree (an empty dict is a fresh start)."""
        if not state_dict:
            return
        self._loader.load_state_dict(loader_state_from_titan(state_dict))

    def close(self) -> None:
        """Stop the loader's threads (idempotent)."""
        self._loader.close()

    def __enter__(self) -> ZephonDataLoader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
