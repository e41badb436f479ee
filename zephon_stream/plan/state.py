"""The loader state: one cursor plus the frozen config, the same on every rank."""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from zephon_stream.errors import StateMismatchError, VersionError
from zephon_stream.plan.mixture import OrderConfig, same_proportions
from zephon_stream.plan.packing import PACKINGS
from zephon_stream.plan.run_history import decode

STATE_VERSION = 1
SCHEDULE_STATE_VERSION = 2
MAX_POSITION = 2**62
# Keys a state written before they existed lacks, and what their absence means.
OPTIONAL_KEYS = {"packing": "concat", "history": ()}

# (field, what a mismatch means to the user) in the order errors list them.
_CHECKED = (
    ("fingerprints", "dataset fingerprints (a different dataset)"),
    ("seed", "seed"),
    ("seq_len", "seq_len"),
    ("lanes", "lanes"),
    ("window", "window"),
    ("weights", "stream weights"),
    ("lane_counts", "lanes per stream"),
    ("packing", "packing (how rows are filled)"),
)


def check_packing(value: object) -> str:
    """A state's ``packing`` value, checked.

    Raises:
        StateMismatchError: not one of ``PACKINGS``.
    """
    if value not in PACKINGS:
        raise StateMismatchError(f"loader state key 'packing': expected one of {list(PACKINGS)}, got {value!r}")
    return value


@dataclass(frozen=True, slots=True, kw_only=True)
class LoaderState:
    """Everything needed to resume the data order, in plain ints, strings and lists.

    Its keys and value shapes never change as ``position`` advances, so
    torch.distributed.checkpoint can store one copy for all ranks.

    Attributes:
        version: state format version (``STATE_VERSION``).
        position: ``P``, samples consumed globally.
        seed: order seed.
        seq_len: sample length the order was built for.
        lanes: lanes ``C``.
        window: window-shuffle size (``0`` = one block's samples per stream).
        weights: canonical weight strings, one per stream (``"1"``, ``"7/10"``).
        lane_counts: lanes each stream got.
        fingerprints: dataset fingerprints, one per stream.
        packing: how rows are filled (``"concat"``, ``"best_fit"``); a state
            written before it was recorded reads as ``"concat"``.
        history: the run's stretches and skips, one JSON object (string) each
            (plan/run_history.py); empty in a state written before it was recorded.
    """

    version: int = STATE_VERSION
    position: int
    seed: int
    seq_len: int
    lanes: int
    window: int
    weights: list[str] = field(default_factory=list)
    lane_counts: list[int] = field(default_factory=list)
    fingerprints: list[str] = field(default_factory=list)
    packing: str = "concat"
    history: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        """The state as a dict of ints, strings and lists of them."""
        return {
            "version": int(self.version),
            "position": int(self.position),
            "seed": int(self.seed),
            "seq_len": int(self.seq_len),
            "lanes": int(self.lanes),
            "window": int(self.window),
            "weights": [str(w) for w in self.weights],
            "lane_counts": [int(c) for c in self.lane_counts],
            "fingerprints": [str(f) for f in self.fingerprints],
            "packing": str(self.packing),
            "history": [str(h) for h in self.history],
        }

    @classmethod
    def from_dict(cls, data: dict) -> LoaderState:
        """Read a state written by ``to_dict``.

        Raises:
            VersionError: a state version this code does not know.
            StateMismatchError: a missing, unknown or mistyped key.
        """
        if not isinstance(data, dict):
            raise StateMismatchError(f"loader state must be a dict, got {type(data).__name__}")
        version = data.get("version")
        if version == SCHEDULE_STATE_VERSION:
            raise StateMismatchError(
                f"loader state version {SCHEDULE_STATE_VERSION} is a scheduled loader's (it records the phases "
                f"begun and each stream's progress), and this loader has no schedule: build it with the "
                f"schedule the checkpoint was saved with (schedule=...; phases not begun may change)"
            )
        if version != STATE_VERSION:
            raise VersionError(
                f"loader state version {version!r} is not supported (this code reads "
                f"version {STATE_VERSION}, and version {SCHEDULE_STATE_VERSION} with a schedule)"
            )
        names = {f.name for f in fields(cls)}
        data = {**OPTIONAL_KEYS, **data}
        missing = sorted(names - set(data))
        unknown = sorted(set(data) - names)
        if missing or unknown:
            raise StateMismatchError(f"loader state version {version}: missing keys {missing}, unknown keys {unknown}")
        for name in ("position", "seed", "seq_len", "lanes", "window"):
            if not isinstance(data[name], int) or isinstance(data[name], bool):
                raise StateMismatchError(f"loader state key {name!r}: expected an int, got {data[name]!r}")
        # Positions are planned in int64 arrays; a corrupt or hostile
        # checkpoint must be refused here, not overflow inside the pipeline.
        if not 0 <= data["position"] < MAX_POSITION:
            raise StateMismatchError(f"loader state key 'position': {data['position']} is outside [0, 2**62)")
        for name, kind in (("weights", str), ("lane_counts", int), ("fingerprints", str), ("history", str)):
            value = data[name]
            if not isinstance(value, (list, tuple)) or not all(isinstance(v, kind) for v in value):
                raise StateMismatchError(
                    f"loader state key {name!r}: expected a list of {kind.__name__}, got {value!r}"
                )
        check_packing(data["packing"])
        decode(data["history"])
        return cls(**{name: list(v) if isinstance(v, tuple) else v for name, v in data.items()})

    def validate(self, expected: LoaderState) -> None:
        """Check this (loaded) state belongs to the loader that ``expected`` describes.

        The position is not compared, and weights are compared as shares
        (``10:4:2`` is ``5:2:1``). Every mismatch is named with both values.

        Raises:
            StateMismatchError: one or more fields differ.
        """
        problems = []
        for name, label in _CHECKED:
            loaded, wanted = getattr(self, name), getattr(expected, name)
            if name == "weights" and same_proportions(loaded, wanted):
                continue
            if _as_plain(loaded) != _as_plain(wanted):
                problems.append(f"{label}: checkpoint has {loaded!r}, this loader has {wanted!r}")
        if problems:
            raise StateMismatchError("loader state does not match this loader: " + "; ".join(problems))

    def order_config(self) -> OrderConfig:
        """The ``OrderConfig`` this state was made with."""
        return OrderConfig(
            seed=self.seed,
            seq_len=self.seq_len,
            lanes=self.lanes,
            window=self.window,
            weights=tuple(self.weights),
        )


def _as_plain(value: object) -> object:
    return list(value) if isinstance(value, (list, tuple)) else value
