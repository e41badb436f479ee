"""``TorchFTLoader``: one torchft replica group's rows, none lost or repeated.

torchft (PyPI ``torchft``) forms a quorum of replica groups at every step; a
group that died and came back heals by fetching a live peer's state, and a
step whose collectives failed is not committed. This loader keeps its data
state (torchft_plan.py: a cursor plus shares still owed) in the ``Manager``'s
state dict, so a healing group receives it with the model, and derives each
step's rows from that state and the step's quorum alone.

Per step, in this order (docs/ELASTIC.md, "torchft")::

    optimizer.zero_grad()        # torchft's OptimizerWrapper: manager.start_quorum()
    batch = next(loader)         # waits for the quorum; one tiny SUM allreduce
    loss = model(batch); loss.backward(); allreduce the gradients
    optimizer.step()             # manager.should_commit()

``next()`` learns which participants' rows count from a SUM allreduce of
one-hot vectors (torchft zeroes the tensor of a group that is healing in
its asynchronous quorum), and on the next step (or when a peer asks for the
state) advances the state if and only if the step committed.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.distributed import ReduceOp

from zephon_stream.errors import ConfigError, StateMismatchError
from zephon_stream.integrations.torchft_plan import (
    POLICIES,
    IncompleteStepError,
    ReplicaDataState,
    advance,
    plan_step,
    trained_ranks,
)
from zephon_stream.integrations.torchft_rows import RESERVED_OPTIONS, ShareReader
from zephon_stream.loader import Stream

__all__ = ["StepRecord", "TorchFTConfig", "TorchFTLoader", "TorchFTOrderError"]


class TorchFTOrderError(ConfigError):
    """``next()`` was called where the step's quorum cannot give its rows."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TorchFTConfig:
    """What the replica groups train.

    Attributes:
        seq_len: tokens per sample input.
        policy: ``"per_replica"`` (default: each participating group trains
            ``group_batch_size`` rows, torchft's own semantics) or
            ``"fixed_global"`` (every committed step trains the failure-free
            run's ``global_batch_size`` rows; needs the synchronous quorum).
        group_batch_size: rows per group per step (``per_replica``).
        global_batch_size: rows per step over all groups (``fixed_global``).
        lanes: lanes ``C`` of the order (fixed for the run; default: the group
            batch, or the global batch).
        window: window-shuffle size (0: one block's samples).
        seed: order seed.
        state_key: the key of the data state in the ``Manager``'s state dict.
        microbatches: ``next()`` calls per step (gradient accumulation, as
            TorchTitan's ``train_step`` makes them): each returns the next
            ``1/microbatches`` of this rank's rows of the step (``per_replica``).
    """

    seq_len: int
    policy: str = "per_replica"
    group_batch_size: int | None = None
    global_batch_size: int | None = None
    lanes: int | None = None
    window: int = 0
    seed: int = 0
    state_key: str = "zephon_stream"
    microbatches: int = 1


@dataclass(frozen=True, slots=True)
class StepRecord:
    """What one ``next()`` handed out (for logs and tests).

    ``counted`` is whether this group's rows count (it participates and is
    not healing); ``trained`` (known once ``next()`` returns) the
    participating ranks whose rows count.
    """

    step: int
    participants: int
    participating_rank: int | None
    counted: bool
    trained: frozenset[int] | None


class TorchFTLoader:
    """Streams one group rank's rows of each torchft step.

    Args:
        streams: dataset URL(s) or ``Stream``s.
        manager: this group rank's ``torchft.Manager``.
        config: the ``TorchFTConfig``.
        group_rank: this rank inside its replica group (the ``rank`` given to the Manager).
        group_world_size: ranks per replica group (the Manager's ``world_size``).
        loader_options: other ``StreamingLoader`` keywords (``storage_options``,
            ``device``, ``pipeline``, ``prefetch_steps``, ``cross_document_targets``,
            ``packing``, ``batch_layout``, ...); the order config, the packing
            included, travels in the data state and is checked on load. Under
            ``batch_layout="tokens"`` each batch (and each micro-batch) is 1-D,
            its rows end to end.

    Raises:
        ConfigError: a bad config, a schedule, or ``fixed_global`` with the
            asynchronous quorum.
    """

    def __init__(
        self,
        streams: str | Stream | Sequence[str | Stream],
        *,
        manager: Any,
        config: TorchFTConfig,
        group_rank: int = 0,
        group_world_size: int = 1,
        loader_options: dict[str, Any] | None = None,
    ) -> None:
        options = dict(loader_options or {})
        self.config = config
        self.group_batch, self.global_batch = check_config(config, options, group_world_size, manager)
        if not 0 <= group_rank < group_world_size:
            raise ConfigError(f"group_rank {group_rank} is outside group_world_size {group_world_size}")
        self.manager = manager
        # The one-hot vector goes through the Manager's process group:
        # on the batches' device, so that an NCCL group can reduce it.
        self._collective_device = torch.device(options.get("device") or "cpu")
        if self._collective_device.type == "cuda" and not torch.cuda.is_available():
            self._collective_device = torch.device("cpu")
        lanes = config.lanes or (self.group_batch if config.policy == "per_replica" else self.global_batch)
        self._reader = ShareReader(
            streams,
            group_rank=group_rank,
            group_world_size=group_world_size,
            seq_len=config.seq_len,
            seed=config.seed,
            lanes=lanes,
            window=config.window,
            loader_options=options,
        )
        self._lock = threading.RLock()
        self._state = ReplicaDataState(policy=config.policy, order=self._reader.order_state())
        # (step, participants, trained ranks) of the last next(); its plan
        # is recomputed from the state it commits on, which for a group that
        # healed is the peer's.
        self._pending: tuple[int, int, frozenset[int] | None] | None = None
        self._last_quorum: object = None
        self._microbatches: list[dict[str, torch.Tensor]] = []
        self._error: Exception | None = None
        self.last_step: StepRecord | None = None
        manager.register_state_dict_fn(config.state_key, self._load_from_peer, self.state_dict)

    # -- torch Stateful (and torchft's state transfer) ---------------------------------

    def state_dict(self) -> dict[str, Any]:
        """The data state after the committed steps (plain ints, strings, lists).

        Equal on every group that committed the same steps; torchft sends it
        to a healing group, and a checkpoint stores it beside the Manager's.
        """
        with self._lock:
            self._settle()
            return self._state.to_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a state (from a checkpoint or a peer); the next ``next()`` reads from it.

        Raises:
            StateMismatchError: another policy or order config (naming both values).
        """
        state = ReplicaDataState.from_dict(dict(state_dict))
        # A state saved before the packing was recorded read windows.
        state.order.setdefault("packing", "concat")
        problems = []
        if state.policy != self._state.policy:
            problems.append(f"policy: state has {state.policy!r}, this loader has {self._state.policy!r}")
        for name in sorted(set(state.order) | set(self._state.order)):
            if state.order.get(name) != self._state.order.get(name):
                problems.append(
                    f"{name}: state has {state.order.get(name)!r}, this loader has {self._state.order.get(name)!r}"
                )
        if problems:
            raise StateMismatchError("torchft data state does not match this loader: " + "; ".join(problems))
        with self._lock:
            # A pending step older than the loaded state is already in it.
            if self._pending is not None and self._pending[0] < state.step:
                self._pending = None
            self._state = state

    def _load_from_peer(self, state_dict: dict[str, Any]) -> None:
        self.load_state_dict(state_dict)

    @property
    def position(self) -> int:
        """The next fresh global position of the committed state."""
        with self._lock:
            self._settle()
            return self._state.cursor

    @property
    def owed(self) -> int:
        """Shares handed out whose rows did not count, still to be served."""
        with self._lock:
            self._settle()
            return len(self._state.owed)

    @property
    def quorum_rebuilds(self) -> int:
        """Times a new quorum shape built another reading loader."""
        return self._reader.rebuilds

    # -- iteration ------------------------------------------------------------------------

    def __iter__(self) -> TorchFTLoader:
        return self

    def __next__(self) -> dict[str, torch.Tensor]:
        manager = self.manager
        if self._microbatches and getattr(manager, "_quorum_future", None) is self._last_quorum:
            return self._microbatches.pop(0)
        quorum = self._quorum_started()
        manager.wait_quorum()
        step = manager.current_step()
        participants = manager.num_participants()
        rank = manager.participating_rank()
        counted = manager.is_participating()
        with self._lock:
            self._settle()
            if self._error is not None:
                raise self._error
            if self._state.step != step and counted:
                raise StateMismatchError(
                    f"torchft data state is at step {self._state.step} but the Manager is at step {step}: "
                    f"call next(loader) once per step, and load the loader's state with the Manager's"
                )
            plan = plan_step(self._state, participants, group_batch=self.group_batch, global_batch=self.global_batch)
        self._last_quorum = quorum
        # torchft zeroes the tensor of a group that is not participating
        # or is healing (its gradients will not count); the SUM tells every
        # group whose rows count at this step.
        onehot = torch.zeros(participants, dtype=torch.float32)
        if counted and rank is not None:
            onehot[rank] = 1.0
        onehot = onehot.to(self._collective_device)
        work = manager.allreduce(onehot, reduce_op=ReduceOp.SUM)
        # A group outside the participants trains nothing that counts; it
        # reads participant 0's share so that its step has the usual shape.
        index = rank if rank is not None and rank < participants else 0
        batch = self._reader.read(
            plan.pieces[index],
            global_batch=self._step_batch(plan.pieces[index]),
            fresh=index >= participants - plan.fresh,
        )
        # An errored Manager skips the allreduce (its tensor is only ours); that step cannot commit here.
        done = work.wait() and manager.errored() is None
        trained = trained_ranks(onehot.tolist(), participants, step=step) if done else None
        with self._lock:
            self._pending = (step, participants, trained)
        self.last_step = StepRecord(
            step=step, participants=participants, participating_rank=rank, counted=counted, trained=trained
        )
        if self.config.microbatches == 1:
            return batch
        parts = [
            dict(zip(batch, values)) for values in zip(*(t.chunk(self.config.microbatches) for t in batch.values()))
        ]
        self._microbatches = parts[1:]
        return parts[0]

    def _step_batch(self, piece: Any) -> int:
        if self.config.policy == "fixed_global":
            return self.global_batch
        return piece.participants * self.group_batch

    def _quorum_started(self) -> object:
        # torchft 0.2.0 has no public way to ask whether a quorum was
        # started since the last step; its future object is new on every
        # start_quorum(). The extra pins torchft==0.2.0.
        quorum = getattr(self.manager, "_quorum_future", None)
        if quorum is None:
            raise TorchFTOrderError(
                "next(loader) before the step's quorum: call optimizer.zero_grad() (torchft's OptimizerWrapper) "
                "or manager.start_quorum() first, then next(loader), then should_commit()"
            )
        if quorum is self._last_quorum:
            raise TorchFTOrderError(
                f"next(loader) {self.config.microbatches + 1} times in one quorum (step "
                f"{self.manager.current_step()}, microbatches={self.config.microbatches}): the rows of a step depend "
                f"on its quorum; call optimizer.zero_grad() or manager.start_quorum() before each step's first "
                f"next(loader)"
            )
        if self._microbatches:
            raise TorchFTOrderError(
                f"a new quorum after {self.config.microbatches - len(self._microbatches)} of "
                f"{self.config.microbatches} micro-batches of the last step: their rows would count as trained; "
                f"take every micro-batch of a step before optimizer.zero_grad() / manager.start_quorum()"
            )
        return quorum

    def _settle(self) -> None:
        """Fold the last step into the state if it committed (caller holds the lock)."""
        if self._pending is None:
            return
        step, participants, trained = self._pending
        committed = self.manager.current_step()
        if self._state.step > step or committed <= step:
            self._pending = None  # Not committed, or already in a state from a peer: served again
            return
        if self._state.step < step:
            return  # A group healing in the asynchronous quorum; the peer's state arrives in should_commit()
        self._pending = None
        if trained is None:
            self._error = StateMismatchError(
                f"torchft step {step} committed but its allreduce of trained ranks failed on this group"
            )
            return
        plan = plan_step(self._state, participants, group_batch=self.group_batch, global_batch=self.global_batch)
        try:
            self._state = advance(self._state, plan, trained)
        except IncompleteStepError as e:
            self._error = e

    def close(self) -> None:
        """Stop the reading loaders' helpers."""
        self._reader.close()

    def __enter__(self) -> TorchFTLoader:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def check_config(
    config: TorchFTConfig, options: dict[str, Any], group_world_size: int, manager: Any
) -> tuple[int, int | None]:
    """``(group_batch, global_batch)`` of a valid config, else ``ConfigError``."""
    if config.policy not in POLICIES:
        raise ConfigError(f"policy must be one of {POLICIES} (got {config.policy!r})")
    reserved = sorted(set(options) & set(RESERVED_OPTIONS))
    if reserved:
        raise ConfigError(
            f"loader_options may not set {reserved}: the TorchFT loader sets them "
            f"(schedules are not supported under torchft)"
        )
    if not isinstance(group_world_size, int) or group_world_size < 1:
        raise ConfigError(f"group_world_size must be an int >= 1 (got {group_world_size!r})")
    if config.policy == "per_replica":
        batch = config.group_batch_size
        if not isinstance(batch, int) or batch < 1 or batch % group_world_size:
            raise ConfigError(
                f"per_replica needs group_batch_size, an int >= 1 that group_world_size "
                f"{group_world_size} divides (got {batch!r})"
            )
        if (
            not isinstance(config.microbatches, int)
            or config.microbatches < 1
            or (batch // group_world_size) % config.microbatches
        ):
            raise ConfigError(
                f"microbatches must be an int >= 1 that divides the rows per rank, group_batch_size "
                f"{batch} / group_world_size {group_world_size} (got {config.microbatches!r})"
            )
        return batch, None
    if config.microbatches != 1:
        raise ConfigError(
            f"fixed_global takes one next() per step (got microbatches={config.microbatches!r}): "
            f"its rows per rank change with the participants"
        )
    batch = config.global_batch_size
    if not isinstance(batch, int) or batch < 1:
        raise ConfigError(f"fixed_global needs global_batch_size, an int >= 1 (got {batch!r})")
    # torchft 0.2.0 keeps the mode only in this attribute.
    if getattr(manager, "_use_async_quorum", False):
        raise ConfigError(
            "fixed_global needs torchft's synchronous quorum: in the asynchronous one a healing group's rows "
            "count for nothing and are known only after the step; pass Manager(use_async_quorum=False)"
        )
    return 0, batch
