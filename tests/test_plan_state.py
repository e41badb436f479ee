"""The loader state: plain values, round trip, and a clear error per mismatch."""

from __future__ import annotations

import json

import pytest

from zephon_stream.errors import ConfigError, StateMismatchError, VersionError
from zephon_stream.plan import GlobalOrder, LoaderState, OrderConfig, StreamShape


def order_for(fingerprints=("fp-a", "fp-b"), **config) -> GlobalOrder:
    shapes = [StreamShape.from_counts(fp, 65, [65] * 30 + [12]) for fp in fingerprints]
    settings = {"seed": 7, "seq_len": 16, "lanes": 8, "weights": (0.7, "3/10")} | config
    return GlobalOrder(shapes, OrderConfig(**settings))


def test_state_is_plain_values_that_round_trip_through_json():
    state = order_for().state(1234)
    data = state.to_dict()
    assert json.loads(json.dumps(data)) == data
    assert data == {
        "version": 1,
        "position": 1234,
        "seed": 7,
        "seq_len": 16,
        "lanes": 8,
        "window": 0,
        "weights": ["7/10", "3/10"],
        "lane_counts": [6, 2],
        "fingerprints": ["fp-a", "fp-b"],
        "packing": "concat",
        "history": [],
    }
    assert LoaderState.from_dict(data) == state
    # A state written before the packing was recorded read windows.
    assert LoaderState.from_dict({k: v for k, v in data.items() if k not in ("packing", "history")}) == state
    with pytest.raises(StateMismatchError, match=r"'packing': expected one of \['concat', 'best_fit'\], got 'x'"):
        LoaderState.from_dict({**data, "packing": "x"})
    assert state.order_config().weights == ("7/10", "3/10")
    assert order_for(weights=state.order_config().weights).lane_counts == [6, 2]


def test_validate_names_every_mismatch_with_both_values():
    saved = order_for().state(10)
    other = order_for(fingerprints=("fp-a", "fp-z"), seed=8, seq_len=32).state(0)
    with pytest.raises(StateMismatchError) as info:
        saved.validate(other)
    message = str(info.value)
    assert (
        "dataset fingerprints (a different dataset): checkpoint has ['fp-a', 'fp-b'], "
        "this loader has ['fp-a', 'fp-z']" in message
    )
    assert "seed: checkpoint has 7, this loader has 8" in message
    assert "seq_len: checkpoint has 16, this loader has 32" in message
    assert "lanes:" not in message.replace("lanes per stream", "")
    saved.validate(order_for().state(999))  # the position is not compared


def test_validate_reports_lanes_window_and_weights():
    saved = order_for().state(0)
    with pytest.raises(StateMismatchError, match="lanes: checkpoint has 8, this loader has 4"):
        saved.validate(order_for(lanes=4).state(0))
    with pytest.raises(StateMismatchError, match="window: checkpoint has 0, this loader has 3"):
        saved.validate(order_for(window=3).state(0))
    with pytest.raises(StateMismatchError, match=r"stream weights: checkpoint has \['7/10', "):
        saved.validate(order_for(weights=(1, 1)).state(0))


def test_unknown_version_and_malformed_states_are_refused():
    data = order_for().state(5).to_dict()
    with pytest.raises(VersionError, match="loader state version 3 is not supported"):
        LoaderState.from_dict(data | {"version": 3})
    with pytest.raises(StateMismatchError, match=r"missing keys \['seed'\], unknown keys \['x'\]"):
        LoaderState.from_dict({k: v for k, v in data.items() if k != "seed"} | {"x": 1})
    with pytest.raises(StateMismatchError, match="key 'position': expected an int, got '5'"):
        LoaderState.from_dict(data | {"position": "5"})
    with pytest.raises(StateMismatchError, match="key 'fingerprints': expected a list of str"):
        LoaderState.from_dict(data | {"fingerprints": [1, 2]})


def test_state_restores_the_lane_count_of_the_first_run():
    """Default C is the first global batch; a resumed job at another batch keeps it."""
    first = order_for(lanes=16).state(64).to_dict()
    resumed = GlobalOrder(
        [StreamShape.from_counts(fp, 65, [65] * 30 + [12]) for fp in ("fp-a", "fp-b")],
        LoaderState.from_dict(first).order_config(),
    )
    assert resumed.lanes == 16


def test_order_config_errors_are_config_errors():
    with pytest.raises(ConfigError, match="seed must lie in"):
        order_for(seed=-1)
    with pytest.raises(ConfigError, match="weight must be >= 0"):
        order_for(weights=(1, -1))
    with pytest.raises(ConfigError, match="seq_len must be >= 1"):
        order_for(seq_len=0)


def test_a_scheduled_state_into_a_loader_without_a_schedule_says_what_to_pass():
    from zephon_stream.plan import ScheduleOrder, SchedulePhase

    shapes = [StreamShape.from_counts(fp, 65, [65] * 30 + [12]) for fp in ("fp-a", "fp-b")]
    scheduled = ScheduleOrder(shapes, [SchedulePhase(start_step=0, global_batch=8, seq_len=16, lanes=8)], seed=7)
    with pytest.raises(
        StateMismatchError,
        match=r"version 2 is a scheduled loader's .* build it with the "
        r"schedule the checkpoint was saved with",
    ):
        LoaderState.from_dict(scheduled.state(16).to_dict())
    with pytest.raises(VersionError, match=r"version 7 is not supported"):
        LoaderState.from_dict({**order_for().state(0).to_dict(), "version": 7})


def test_weights_in_other_units_are_the_same_mixture():
    five = order_for(weights=(5, 2))
    ten = order_for(weights=(10, 4))
    assert five.lane_counts == ten.lane_counts
    five.state(40).validate(ten.state(0))
    with pytest.raises(
        StateMismatchError, match=r"stream weights: checkpoint has \['5', '2'\], this loader has \['2', '5'\]"
    ):
        five.state(40).validate(order_for(weights=(2, 5)).state(0))
