"""TorchTitan's torchft trainer (``torchtitan.experiments.torchft``) on a
zephon_stream dataset: ``ZephonFTDataLoader`` and ``ZephonFTCheckpointManager``.

TorchTitan 0.3.0's ``FaultTolerantTrainer`` builds its dataloader with a
static split over the *maximum* number of replica groups
(``TorchFTManager.get_dp_info``), so a group that is down leaves its share
untrained and a group that heals may train it twice. ``ZephonFTDataLoader``
is built by that same call, then bound to the group's ``TorchFTManager``
(``bind_torchft``, which ``ZephonFTTrainer`` in
``torchtitan_torchft_trainer.py`` calls), and from then on serves each step
through :class:`~zephon_stream.integrations.torchft.TorchFTLoader`: the rows
of a step follow from the step's quorum and a data state that travels in the
torchft ``Manager``'s state dict, so committed steps train positions
``0..N-1`` of the global order, none lost, none repeated
(docs/ELASTIC.md, "torchft").

The data state is global (equal on every group that committed the same
steps). It reaches a healing group through torchft's state transfer, and
a restarted job through TorchTitan's full checkpoint, saved by participating
rank 0 beside the model of the same step. TorchTitan's per-replica dataloader
checkpoints (saved every step, newer than the model) would skip the steps
between the full checkpoint and the failure; ``ZephonFTCheckpointManager``
leaves them off and keeps the participating-rank-0 guard on the full save.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from zephon_stream.errors import ConfigError
from zephon_stream.integrations.torchtitan.api import TITAN, titan_module
from zephon_stream.integrations.torchtitan.base import (
    BaseDataLoader,
    check_tokenizer,
    redacted_config_repr,
    titan_shape,
)
from zephon_stream.integrations.torchtitan.batches import titan_batch
from zephon_stream.integrations.torchtitan.config import (
    ZephonDataLoaderConfig,
    parse_stream_spec,
)
from zephon_stream.integrations.torchtitan.state import (
    loader_state_from_titan,
    titan_state,
)

TorchFTCheckpointManager = titan_module(
    "torchtitan.experiments.torchft.checkpoint", needed_by=__name__
).TorchFTCheckpointManager

__all__ = ["ZephonFTCheckpointManager", "ZephonFTDataLoader", "check_titan_ft_config"]

NOT_BOUND = (
    "ZephonFTDataLoader has no torchft Manager yet: build the trainer as ZephonFTTrainer.Config(...) "
    "(zephon_stream.integrations.torchtitan.torchft_trainer), or call "
    "loader.bind_torchft(trainer.ft_manager, microbatches=<next() calls per train step>) after the trainer is built"
)


@dataclass(kw_only=True, slots=True)
class ZephonFTDataLoaderConfig(ZephonDataLoaderConfig):
    """The configuration of :class:`ZephonFTDataLoader` (``ZephonFTDataLoader.Config``).

    Every field of ``ZephonDataLoader.Config`` but those a torchft run cannot
    honour: ``phases`` (a schedule keys on the steps of one world),
    ``max_steps``, ``max_epochs``, ``end_after_phase``, one pass
    (``infinite=False`` on 0.3.0, ``repeat=False`` on main),
    ``packing_outputs`` and ``gradient_accumulation_steps`` (``bind_torchft``
    takes the trainer's).
    """

    state_key: str = "zephon_stream"
    """The key of the data state in the torchft ``Manager``'s state dict
    (beside TorchTitan's own model, optimizer and train state)."""

    def __post_init__(self) -> None:
        ZephonDataLoaderConfig.__post_init__(self)
        unsupported = [
            name
            for name, value, default in (
                ("phases", self.phases.strip() if isinstance(self.phases, str) else self.phases, ""),
                ("max_steps", self.max_steps, None),
                ("max_epochs", self.max_epochs, None),
                ("end_after_phase", self.end_after_phase, None),
                (TITAN.repeat_field, TITAN.repeats(self), True),
                ("packing_outputs", self.packing_outputs, False),
                # The trainer hands its accumulation to bind_torchft.
                ("gradient_accumulation_steps", self.gradient_accumulation_steps, 1),
            )
            if value not in (default, [], ())
        ]
        if unsupported:
            raise ConfigError(
                f"ZephonFTDataLoader.Config: {unsupported} are not supported under torchft (the rows of a step "
                f"depend on its quorum); leave them at their defaults"
            )

    def __repr__(self) -> str:
        return redacted_config_repr(self, "ZephonFTDataLoader.Config")


class ZephonFTDataLoader(BaseDataLoader):
    """One data-parallel rank of one torchft replica group under TorchTitan.

    Built by ``FaultTolerantTrainer`` as ``config.dataloader.build(dp_world_size=...,
    dp_rank=..., ...)`` with TorchTitan's static split (``get_dp_info``:
    ``dp_world_size = group dp x fault_tolerance.group_size``, ``dp_rank =
    group dp x replica_id + dp rank``), then bound to the group's
    ``TorchFTManager`` by :meth:`bind_torchft`. Iterating yields
    ``({"input": ..., "positions": ...}, labels)`` of ``[local_batch_size,
    seq_len]`` as ``ZephonDataLoader`` does; each train step takes
    ``microbatches`` of them after ``optimizers.zero_grad()`` started the
    step's quorum (TorchTitan's ``train_step`` order). On TorchTitan main the
    batches are 1-D, the rows end to end, as ``ZephonDataLoader``'s.

    Args:
        config: the loader's :class:`ZephonFTDataLoader.Config`.
        dp_world_size: TorchTitan's data-parallel degree over all replica groups.
        dp_rank: this rank's data-parallel rank over all replica groups.
        tokenizer: optional TorchTitan tokenizer, checked against the datasets at bind.
        seq_len: tokens per row (TorchTitan main: ``max_context_length``).
        local_batch_size: rows per ``next()`` (TorchTitan main: ``num_tokens_per_batch``).
        **kwargs: other trainer keywords, accepted and ignored.
    """

    Config = ZephonFTDataLoaderConfig

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
        if not 0 <= dp_rank < dp_world_size:
            raise ConfigError(f"dp_rank {dp_rank} is outside dp_world_size {dp_world_size}")
        self.shape = titan_shape(seq_len, local_batch_size, dict(kwargs))
        self.seq_len, self.local_batch_size = self.shape.seq_len, self.shape.rows
        self.config = config
        self.dp_world_size = dp_world_size
        self.dp_rank = dp_rank
        self._tokenizer = tokenizer
        self._loader: Any = None
        self._loaded_state: dict[str, Any] | None = None
        self._last_sample_positions = torch.empty(0, dtype=torch.int64)

    def bind_torchft(self, ft_manager: Any, *, microbatches: int = 1) -> None:
        """Serve the replica group of ``ft_manager`` from now on.

        Args:
            ft_manager: the trainer's ``TorchFTManager`` (``trainer.ft_manager``).
            microbatches: ``next()`` calls per train step: TorchTitan's gradient
                accumulation steps x pipeline-parallel microbatches.

        Raises:
            ConfigError: fault tolerance off, semi-synchronous training, a
                split that is not ``get_dp_info``'s, or a second bind.
        """
        from zephon_stream.integrations.torchft import TorchFTConfig, TorchFTLoader

        if self._loader is not None:
            raise ConfigError("ZephonFTDataLoader is already bound to a torchft Manager")
        if not getattr(ft_manager, "enabled", False):
            raise ConfigError("ZephonFTDataLoader needs fault_tolerance.enable = true (else use ZephonDataLoader)")
        if not ft_manager.use_async_quorum:
            raise ConfigError(
                "ZephonFTDataLoader does not support fault_tolerance.semi_sync_method (LocalSGD, DiLoCo): their "
                "quorum runs every sync_steps steps, not at each step's optimizers.zero_grad()"
            )
        groups, replica = int(ft_manager.group_size), int(ft_manager.replica_id)
        if groups < 1 or self.dp_world_size % groups:
            raise ConfigError(
                f"dp_world_size {self.dp_world_size} is not a multiple of fault_tolerance.group_size "
                f"{groups}: build the loader with ft_manager.get_dp_info(...)"
            )
        group_dp = self.dp_world_size // groups
        if self.dp_rank // group_dp != replica:
            raise ConfigError(
                f"dp_rank {self.dp_rank} of {self.dp_world_size} is not in replica {replica}'s "
                f"ranks [{replica * group_dp}, {(replica + 1) * group_dp}): build the loader with "
                f"ft_manager.get_dp_info(...)"
            )
        config = self.config
        streams = self._streams()
        options = {
            "storage_options": dict(config.storage_options) or None,
            "device": config.device,
            "pipeline": config.pipeline,
            "helper_nice": config.helper_nice,
            "prefetch_steps": config.prefetch_steps,
            "max_memory_bytes": config.max_memory_bytes,
            "cross_document_targets": config.cross_document_targets,
            "packing": config.packing,
            # TorchTitan's train_step (0.3.0 and main) counts valid labels into a CPU tensor.
            "host_labels": True,
            "batch_layout": TITAN.batch_layout,
        }
        if self._tokenizer is not None:
            self._check_tokenizer(streams, options)
        ft_config = TorchFTConfig(
            seq_len=self.seq_len,
            policy="per_replica",
            group_batch_size=group_dp * self.local_batch_size * microbatches,
            lanes=config.lanes,
            window=config.window or 0,
            seed=config.seed,
            state_key=config.state_key,
            microbatches=microbatches,
        )
        self._loader = TorchFTLoader(
            streams,
            manager=ft_manager.manager,
            config=ft_config,
            group_rank=self.dp_rank % group_dp,
            group_world_size=group_dp,
            loader_options=options,
        )
        if self._loaded_state is not None:
            state, self._loaded_state = self._loaded_state, None
            self.load_state_dict(state)

    def _streams(self) -> Any:
        from zephon_stream.loader import Stream

        if self.config.streams:
            return [Stream(url, weight=weight) for url, weight in map(parse_stream_spec, self.config.streams)]
        return self.config.dataset_path

    def _check_tokenizer(self, streams: Any, options: dict[str, Any]) -> None:
        from zephon_stream.loader import StreamingLoader

        with StreamingLoader(
            streams,
            seq_len=self.seq_len,
            local_batch_size=1,
            rank=0,
            world_size=1,
            pipeline="threads",
            prefetch_steps=1,
            storage_options=options["storage_options"],
        ) as probe:
            check_tokenizer(self._tokenizer, probe.manifests)

    @property
    def torchft_loader(self) -> Any:
        """The bound :class:`~zephon_stream.integrations.torchft.TorchFTLoader` (``last_step``, ``position``)."""
        if self._loader is None:
            raise ConfigError(NOT_BOUND)
        return self._loader

    @property
    def last_sample_positions(self) -> torch.Tensor:
        """Global sample position of each row of the batch last yielded (-1: a padding row)."""
        return self._last_sample_positions

    def __iter__(self) -> Iterator[tuple[dict[str, torch.Tensor], torch.Tensor]]:
        return self

    def __next__(self) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        batch = next(self.torchft_loader)
        self._last_sample_positions = batch["sample_positions"]
        return titan_batch(batch, shape=self.shape, packing_outputs=False)

    def state_dict(self) -> dict[str, Any]:
        """``{"zephon": <JSON of the torchft data state>}``, equal on every group and rank."""
        return titan_state(self.torchft_loader.state_dict())

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a data state from a checkpoint (an empty dict is a fresh start).

        The torchft ``Manager`` counts steps from 0 again in a restarted
        process (TorchTitan does not checkpoint its counters), so the loaded
        state is taken to stand at the Manager's current step. A healing
        group's state comes through torchft's transfer instead, untouched.
        """
        if not state_dict:
            return
        if self._loader is None:
            self._loaded_state = dict(state_dict)
            return
        state = dict(loader_state_from_titan(state_dict))
        state["step"] = int(self._loader.manager.current_step())
        self._loader.load_state_dict(state)

    def close(self) -> None:
        """Stop the loader's readers (idempotent)."""
        if self._loader is not None:
            self._loader.close()

    def __enter__(self) -> ZephonFTDataLoader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass(kw_only=True, slots=True)
class ZephonFTCheckpointManagerConfig(TorchFTCheckpointManager.Config):
    """``TorchFTCheckpointManager.Config`` with the per-replica dataloader checkpoints off."""

    enable_ft_dataloader_checkpoints: bool = False
    """Must stay False: the data state is global and rides in the full checkpoint."""


class ZephonFTCheckpointManager(TorchFTCheckpointManager):
    """TorchTitan's torchft checkpointer for a ``ZephonFTDataLoader``.

    The full checkpoint (model, optimizer, lr schedulers, train state and the
    dataloader's global state, all of one step) is saved by the group whose
    participating rank is 0, as TorchTitan does, and loaded whole on a
    restart. TorchTitan's per-replica dataloader checkpoints stay off: they
    are written every step, so on a restart they stand after the model and
    the steps between would never be trained.

    Raises:
        ConfigError: ``enable_ft_dataloader_checkpoints`` set.
    """

    Config = ZephonFTCheckpointManagerConfig

    def __init__(self, config: Config, **kwargs: Any) -> None:
        if config.enable_ft_dataloader_checkpoints:
            raise ConfigError(
                "ZephonFTCheckpointManager: checkpoint.enable_ft_dataloader_checkpoints must be false (the data "
                "state is global and is saved in the full checkpoint with the model of the same step)"
            )
        TorchFTCheckpointManager.__init__(self, config, **kwargs)

    def _save(self, curr_step: int, last_step: bool = False) -> bool:
        # TorchTitan 0.3.0 guards the full save with participating rank 0
        # only while per-replica dataloader checkpoints are on; keep the guard.
        if self.ft_manager is not None and self.ft_manager.participating_rank() != 0:
            return False
        return TorchFTCheckpointManager._save(self, curr_step, last_step)

    def _should_purge(self) -> bool:
        if self.ft_manager is not None and self.ft_manager.participating_rank() != 0:
            return False
        return TorchFTCheckpointManager._should_purge(self)


def check_titan_ft_config(config: Any) -> None:
    """Refuse a TorchTitan torchft job config that would lose or repeat data
    with ``ZephonFTDataLoader`` (``ZephonFTTrainer`` calls it first).

    Raises:
        ConfigError: another dataloader, fault tolerance off, semi-synchronous
            training, or per-replica dataloader checkpoints on.
    """
    if not isinstance(config.dataloader, ZephonFTDataLoaderConfig):
        raise ConfigError(
            f"ZephonFTTrainer needs dataloader=ZephonFTDataLoader.Config(...), got {type(config.dataloader).__name__}"
        )
    ft = config.fault_tolerance
    if not ft.enable:
        raise ConfigError(
            "ZephonFTTrainer needs fault_tolerance.enable = true (else use TorchTitan's Trainer with ZephonDataLoader)"
        )
    if ft.semi_sync_method is not None:
        raise ConfigError(
            f"ZephonFTDataLoader does not support fault_tolerance.semi_sync_method "
            f"{ft.semi_sync_method!r}: its quorum runs every sync_steps steps"
        )
    checkpoint = config.checkpoint
    if checkpoint.enable and getattr(checkpoint, "enable_ft_dataloader_checkpoints", False):
        raise ConfigError(
            "checkpoint.enable_ft_dataloader_checkpoints is on: TorchTitan would load each replica's dataloader "
            "state of its last step instead of the full checkpoint's, skipping the steps after the model's; use "
            "checkpoint=ZephonFTCheckpointManager.Config(...)"
        )
