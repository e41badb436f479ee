"""Which rows each torchft replica group trains at a step: a pure function of
the committed data state and of the step's quorum.

Standard library only. The state travels in the torchft ``Manager``'s state
dict (so a healing group receives it with the model) and in checkpoints; it
is the same on every group that has committed the same steps. Two policies:

- ``per_replica`` (torchft's own semantics): each participant trains a full
  group batch; rows handed to a participant whose gradients did not count (a
  group healing in the asynchronous quorum) are *owed* and served again, first,
  at a later step. A fresh step of ``n`` participants takes the next
  ``n * group_batch`` positions of the global order from ``cursor`` on.
- ``fixed_global``: every committed step trains the global batch of positions
  ``[step * global_batch, (step + 1) * global_batch)``, the failure-free run's
  step, split over that step's participants (docs/ELASTIC.md, "torchft").
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from zephon_stream.errors import StateMismatchError, VersionError

TORCHFT_STATE_VERSION = 1
POLICIES = ("per_replica", "fixed_global")


@dataclass(frozen=True, slots=True)
class Piece:
    """One participant's share of one step: the rows of participant ``index``
    of ``participants`` at global cursor ``cursor``.

    Under ``per_replica`` the step's positions are ``[cursor, cursor +
    participants * group_batch)``, under ``fixed_global`` ``[cursor, cursor +
    global_batch)``; a participant's share is its rank slice of them
    (plan/slicing.py), so it is read by a ``StreamingLoader`` at that world size.
    """

    cursor: int
    participants: int
    index: int

    def to_list(self) -> list[int]:
        return [int(self.cursor), int(self.participants), int(self.index)]


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplicaDataState:
    """The data state after ``step`` committed steps (torchft's ``current_step()``).

    Attributes:
        step: committed steps this state has taken into account.
        cursor: the next fresh global position.
        owed: shares handed out whose gradients did not count, oldest first.
        policy: ``"per_replica"`` or ``"fixed_global"``.
        order: the loader's order config (its ``state_dict()`` without
            ``position``), checked on load.
    """

    step: int = 0
    cursor: int = 0
    owed: tuple[Piece, ...] = ()
    policy: str = "per_replica"
    order: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        """Plain ints, strings and lists (torchft sends it over HTTP; DCP stores it)."""
        return {
            "version": TORCHFT_STATE_VERSION,
            "step": int(self.step),
            "cursor": int(self.cursor),
            "owed": [p.to_list() for p in self.owed],
            "policy": self.policy,
            "order": dict(self.order),
        }

    @classmethod
    def from_dict(cls, data: dict) -> ReplicaDataState:
        """Read a state written by ``to_dict``.

        Raises:
            VersionError: another state version.
            StateMismatchError: a missing or mistyped key.
        """
        if not isinstance(data, dict):
            raise StateMismatchError(f"torchft data state must be a dict, got {type(data).__name__}")
        if data.get("version") != TORCHFT_STATE_VERSION:
            raise VersionError(
                f"torchft data state version {data.get('version')!r} is not supported "
                f"(this code reads version {TORCHFT_STATE_VERSION})"
            )
        missing = sorted({"step", "cursor", "owed", "policy", "order"} - set(data))
        if missing:
            raise StateMismatchError(f"torchft data state: missing keys {missing}")
        for name in ("step", "cursor"):
            if not isinstance(data[name], int) or isinstance(data[name], bool) or data[name] < 0:
                raise StateMismatchError(f"torchft data state key {name!r}: expected an int >= 0, got {data[name]!r}")
        owed = []
        for i, item in enumerate(data["owed"]):
            if len(item) != 3 or not all(isinstance(v, int) for v in item) or not 0 <= item[2] < item[1]:
                raise StateMismatchError(
                    f"torchft data state owed[{i}]: expected [cursor, participants, index], got {item!r}"
                )
            owed.append(Piece(*item))
        return cls(
            step=data["step"], cursor=data["cursor"], owed=tuple(owed), policy=data["policy"], order=dict(data["order"])
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class StepPlan:
    """What each participant of one step trains.

    Attributes:
        step: the committed step count the step starts from.
        participants: ``n``, the quorum's participating groups.
        pieces: one share per participating rank ``0..n-1``.
        fresh: participants of the step's fresh share (those not serving owed rows).
        fresh_rows: fresh positions the step consumes when every participant counts.
    """

    step: int
    participants: int
    pieces: tuple[Piece, ...]
    fresh: int
    fresh_rows: int


def plan_step(state: ReplicaDataState, participants: int, *, group_batch: int, global_batch: int | None) -> StepPlan:
    """The shares of a step with ``participants`` participating groups.

    Owed shares come first (participating rank ``k`` < owed count takes owed
    share ``k``), then the fresh positions split over the remaining ranks.
    """
    if participants < 1:
        raise ValueError(f"a step needs at least one participant (got {participants})")
    if state.policy == "fixed_global":
        assert global_batch is not None
        # fixed_global never owes rows: an incomplete step is refused
        # (advance()), so every committed step is the failure-free one.
        pieces = tuple(Piece(state.cursor, participants, k) for k in range(participants))
        return StepPlan(
            step=state.step, participants=participants, pieces=pieces, fresh=participants, fresh_rows=global_batch
        )
    reused = min(len(state.owed), participants)
    fresh = participants - reused
    pieces = state.owed[:reused] + tuple(Piece(state.cursor, fresh, k) for k in range(fresh))
    return StepPlan(
        step=state.step, participants=participants, pieces=pieces, fresh=fresh, fresh_rows=fresh * group_batch
    )


class IncompleteStepError(StateMismatchError):
    """A committed fixed-global step whose rows did not all count."""


def advance(state: ReplicaDataState, plan: StepPlan, trained: Iterable[int]) -> ReplicaDataState:
    """The state after ``plan``'s step committed with participating ranks ``trained`` counted.

    Raises:
        IncompleteStepError: under ``fixed_global``, a committed step in which
            some participant's rows did not count (a group healing in the
            asynchronous quorum).
    """
    assert plan.step == state.step, (plan.step, state.step)
    counted = frozenset(trained)
    if state.policy == "fixed_global":
        missing = sorted(set(range(plan.participants)) - counted)
        if missing:
            raise IncompleteStepError(
                f"torchft step {plan.step}: participating ranks {missing} of {plan.participants} did not train "
                f"their rows (healing in the asynchronous quorum), so the step is not the failure-free run's; "
                f"the fixed_global policy needs Manager(use_async_quorum=False)"
            )
        return ReplicaDataState(
            step=state.step + 1, cursor=state.cursor + plan.fresh_rows, owed=(), policy=state.policy, order=state.order
        )
    reused = plan.participants - plan.fresh
    still_owed = [p for k, p in enumerate(plan.pieces[:reused]) if k not in counted]
    newly_owed = [p for k, p in enumerate(plan.pieces[reused:], start=reused) if k not in counted]
    owed = tuple(still_owed) + state.owed[reused:] + tuple(newly_owed)
    return ReplicaDataState(
        step=state.step + 1, cursor=state.cursor + plan.fresh_rows, owed=owed, policy=state.policy, order=state.order
    )


def trained_ranks(counts: Sequence[float], participants: int, *, step: int) -> frozenset[int]:
    """The participating ranks whose rows counted, from the SUM of one-hot vectors.

    Raises:
        StateMismatchError: a count other than 0 or 1 (two groups with one
            participating rank, or a corrupted reduction).
    """
    if len(counts) != participants:
        raise StateMismatchError(f"torchft step {step}: {len(counts)} counts for {participants} participants")
    bad = [(k, c) for k, c in enumerate(counts) if c not in (0.0, 1.0)]
    if bad:
        raise StateMismatchError(
            f"torchft step {step}: participating ranks counted other than once (rank, count): {bad}"
        )
    return frozenset(k for k, c in enumerate(counts) if c == 1.0)
