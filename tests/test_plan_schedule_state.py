"""The schedule state: phases begun, stream progress, and what a resume may change."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from test_plan_schedule import schedules
from zephon_stream.errors import ConfigError, StateMismatchError, VersionError
from zephon_stream.plan import (
    GlobalOrder,
    OrderConfig,
    ScheduleOrder,
    SchedulePhase,
    ScheduleState,
    StreamShape,
)

SHAPES = [StreamShape.from_counts(fp, 65, [65] * 30 + [12]) for fp in ("fp-a", "fp-b", "fp-c")]


def phases(**changes) -> list[SchedulePhase]:
    """Three phases; ``changes`` maps ``"<phase>_<field>"`` to a new value."""
    base = [
        dict(start_step=0, global_batch=8, seq_len=16, lanes=8, weights=(1, 1, 0)),
        dict(start_step=20, global_batch=12, seq_len=16, lanes=12, weights=(1, 2, 1)),
        dict(start_step=50, global_batch=6, seq_len=8, lanes=6, weights=(0, 1, 1)),
    ]
    for key, value in changes.items():
        k, name = key.split("_", 1)
        base[int(k)][name] = value
    return [SchedulePhase(**p) for p in base]


def test_state_round_trips_as_plain_values_with_the_phases_begun():
    order = ScheduleOrder(SHAPES, phases(), seed=3)
    position = order.position_of_step(30)
    data = order.state(position).to_dict()
    assert json.loads(json.dumps(data)) == data
    assert data["version"] == 2 and data["step"] == 30 and data["position"] == 20 * 8 + 10 * 12
    begun = [json.loads(p) for p in data["phases"]]
    assert [p["start_step"] for p in begun] == [0, 20]
    assert begun[1]["weights"] == ["1", "2", "1"] and begun[1]["lane_counts"] == [3, 6, 3]
    streams = [json.loads(s) for s in data["streams"]]
    assert [s["fingerprint"] for s in streams] == ["fp-a", "fp-b", "fp-c"]
    assert sum(s["samples"] for s in streams) == position
    state = ScheduleState.from_dict(data)
    state.validate(order)
    assert state.to_dict() == data
    # keys never change as the cursor moves; a phase boundary adds list entries only
    assert set(order.state(0).to_dict()) == set(data)


def test_a_phase_begins_with_its_first_sample_not_at_its_boundary():
    order = ScheduleOrder(SHAPES, phases(), seed=3)
    at_boundary = order.position_of_step(20)
    assert len(order.state(at_boundary).phases) == 1
    assert len(order.state(at_boundary + 1).phases) == 2
    saved = order.state(at_boundary).to_dict()
    # the phase that starts exactly at the checkpoint may still be edited
    ScheduleState.from_dict(saved).validate(ScheduleOrder(SHAPES, phases(**{"1_seq_len": 32}), seed=3))


def test_a_changed_phase_that_has_begun_is_refused_naming_phase_field_and_values():
    order = ScheduleOrder(SHAPES, phases(), seed=3)
    saved = ScheduleState.from_dict(order.state(order.position_of_step(30)).to_dict())
    with pytest.raises(StateMismatchError) as info:
        saved.validate(ScheduleOrder(SHAPES, phases(**{"1_seq_len": 32, "1_weights": (1, 1, 1)}), seed=3))
    message = str(info.value)
    assert "phase 1 (start step 20): seq_len: checkpoint has 16, this loader has 32" in message
    assert (
        "phase 1 (start step 20): weights: checkpoint has ['1', '2', '1'], this loader has ['1', '1', '1']" in message
    )
    with pytest.raises(
        StateMismatchError, match=r"phase 0 \(start step 0\): global_batch: checkpoint has 8, this loader has 16"
    ):
        saved.validate(ScheduleOrder(SHAPES, phases(**{"0_global_batch": 16}), seed=3))
    with pytest.raises(StateMismatchError, match="phase 1 .*: start_step: checkpoint has 20, this loader has 25"):
        saved.validate(ScheduleOrder(SHAPES, phases(**{"1_start_step": 25}), seed=3))
    with pytest.raises(StateMismatchError, match="phase 1 .*has begun but this schedule has 1 phases"):
        saved.validate(ScheduleOrder(SHAPES, phases()[:1], seed=3))
    with pytest.raises(StateMismatchError, match="seed: checkpoint has 3, this loader has 4"):
        saved.validate(ScheduleOrder(SHAPES, phases(), seed=4))


def test_future_phases_may_be_added_or_edited_and_streams_appended():
    order = ScheduleOrder(SHAPES[:2], [SchedulePhase(start_step=0, global_batch=8, seq_len=16, lanes=8)], seed=3)
    saved = ScheduleState.from_dict(order.state(order.position_of_step(12)).to_dict())
    grown = ScheduleOrder(SHAPES, phases(**{"2_seq_len": 4}), seed=3)
    saved.validate(grown)  # phases 1 and 2 begin later; stream fp-c is new and last
    # the resumed order reads what the old one read up to the checkpoint
    positions = np.arange(order.position_of_step(12))
    for a, b in zip(order.sample_at(positions), grown.sample_at(positions)):
        assert np.array_equal(a, b)
    with pytest.raises(StateMismatchError, match="phase 1 .* starts before the checkpoint's position 96"):
        saved.validate(ScheduleOrder(SHAPES, phases(**{"1_start_step": 10}), seed=3))
    reordered = ScheduleOrder([SHAPES[1], SHAPES[0]], [SchedulePhase(start_step=0, global_batch=8, seq_len=16)], seed=3)
    with pytest.raises(StateMismatchError, match=r"dataset fingerprints .*checkpoint has \['fp-a', 'fp-b'\]"):
        saved.validate(reordered)


def test_the_last_phase_batch_may_change_on_resume_unless_a_later_phase_starts_from_it():
    one = ScheduleOrder(SHAPES[:2], [SchedulePhase(start_step=0, global_batch=8, seq_len=16, lanes=8)], seed=3)
    saved = ScheduleState.from_dict(one.state(8 * 12).to_dict())
    saved.validate(
        ScheduleOrder(SHAPES[:2], [SchedulePhase(start_step=0, global_batch=16, seq_len=16, lanes=8)], seed=3)
    )
    later = [
        SchedulePhase(start_step=0, global_batch=16, seq_len=16, lanes=8),
        SchedulePhase(start_step=100, global_batch=16, seq_len=8, lanes=8),
    ]
    with pytest.raises(StateMismatchError, match="global_batch: checkpoint has 8, this loader has 16"):
        saved.validate(ScheduleOrder(SHAPES[:2], later, seed=3))


def test_a_version_1_state_loads_as_a_one_phase_schedule():
    config = OrderConfig(seed=7, seq_len=16, lanes=8, weights=(0.7, "3/10"))
    v1 = GlobalOrder(SHAPES[:2], config).state(1234).to_dict()
    state = ScheduleState.from_dict(v1)
    assert state.version == 1 and state.position == 1234 and state.step is None
    assert state.phases[0]["global_batch"] is None and state.phases[0]["lane_counts"] == [6, 2]
    state.validate(ScheduleOrder.single(SHAPES[:2], config, global_batch=16))
    future = [
        SchedulePhase(start_step=0, global_batch=16, seq_len=16, lanes=8, weights=(0.7, "3/10")),
        SchedulePhase(start_step=500, global_batch=16, seq_len=32, lanes=8),
    ]
    state.validate(ScheduleOrder(SHAPES[:2], future, seed=7))
    with pytest.raises(
        StateMismatchError, match=r"phase 0 \(start step 0\): lanes: checkpoint has 8, this loader has 4"
    ):
        state.validate(
            ScheduleOrder.single(SHAPES[:2], OrderConfig(seed=7, seq_len=16, lanes=4, weights=(0.7, "3/10")), 16)
        )
    assert ScheduleState.from_dict(state.to_dict()).version == 2


def test_unknown_versions_and_malformed_states_are_refused():
    data = ScheduleOrder(SHAPES, phases(), seed=3).state(5).to_dict()
    with pytest.raises(VersionError, match="loader state version 3 is not supported"):
        ScheduleState.from_dict(data | {"version": 3})
    with pytest.raises(StateMismatchError, match=r"missing keys \['streams'\], unknown keys \['x'\]"):
        ScheduleState.from_dict({k: v for k, v in data.items() if k != "streams"} | {"x": 1})
    with pytest.raises(StateMismatchError, match="'position': 4611686018427387904 is outside"):
        ScheduleState.from_dict(data | {"position": 2**62})
    with pytest.raises(StateMismatchError, match="phase 0: not a JSON object"):
        ScheduleState.from_dict(data | {"phases": ["[1]"]})
    with pytest.raises(StateMismatchError, match=r"phase 0: missing keys \['window'\]"):
        phase = json.loads(data["phases"][0])
        del phase["window"]
        ScheduleState.from_dict(data | {"phases": [json.dumps(phase)]})


def test_recorded_progress_is_checked_against_the_progress_this_code_computes():
    order = ScheduleOrder(SHAPES, phases(), seed=3)
    data = order.state(order.position_of_step(30)).to_dict()
    stream = json.loads(data["streams"][1])
    stream["samples"] += 1
    data["streams"][1] = json.dumps(stream)
    with pytest.raises(StateMismatchError, match="stream 1 progress: checkpoint has"):
        ScheduleState.from_dict(data).validate(order)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])
@given(order=schedules(), data=st.data())
def test_a_resume_may_edit_only_phases_not_begun_and_reads_the_same_until_them(order, data):
    shapes = order.shapes
    specs = [p.spec for p in order.phases]
    k = data.draw(st.integers(1, len(specs) - 1))
    cut = order.phases[k].start_position
    edited = list(specs)
    edited[k] = dataclasses.replace(specs[k], seq_len=specs[k].seq_len * 2, global_batch=specs[k].global_batch + 1)
    try:
        resumed = ScheduleOrder(shapes, edited, seed=order.seed)
    except ConfigError:
        assume(False)
    # The phase's first position always: there the edited phase cuts the
    # epoch in progress its own way, and the state must not depend on it.
    for position in (data.draw(st.integers(0, cut)), cut):
        ScheduleState.from_dict(order.state(position).to_dict()).validate(resumed)
    positions = np.arange(cut)
    for a, b in zip(order.sample_at(positions), resumed.sample_at(positions)):
        assert np.array_equal(a, b)
    later = ScheduleState.from_dict(order.state(cut + 1).to_dict())
    with pytest.raises(
        StateMismatchError, match=f"phase {k} \\(start step {specs[k].start_step}\\): seq_len: checkpoint has"
    ):
        later.validate(resumed)


def test_the_same_weights_in_other_units_resume_and_a_damaged_stream_list_is_named():
    order = ScheduleOrder(
        SHAPES[:3], [SchedulePhase(start_step=0, global_batch=8, seq_len=16, lanes=8, weights=(5, 2, 1))], seed=3
    )
    state = order.state(40).to_dict()
    tenfold = ScheduleOrder(
        SHAPES[:3], [SchedulePhase(start_step=0, global_batch=8, seq_len=16, lanes=8, weights=(10, 4, 2))], seed=3
    )
    ScheduleState.from_dict(state).validate(tenfold)  # 10:4:2 splits the lanes as 5:2:1
    with pytest.raises(
        StateMismatchError,
        match=r"phase 0: weights has 3 entries for the 2 streams of its "
        r"fingerprints: the state is damaged or was edited",
    ):
        ScheduleState.from_dict({**state, "fingerprints": state["fingerprints"][:2]})
    # A stream appended since the checkpoint shows as weight 0 in a begun phase, and the message says so.
    shorter = ScheduleOrder(
        SHAPES[:2], [SchedulePhase(start_step=0, global_batch=8, seq_len=16, lanes=8, weights=(1, 1))], seed=3
    )
    grown = ScheduleOrder(
        SHAPES[:3], [SchedulePhase(start_step=0, global_batch=8, seq_len=16, lanes=8, weights=(1, 1, 1))], seed=3
    )
    with pytest.raises(StateMismatchError) as info:
        ScheduleState.from_dict(shorter.state(40).to_dict()).validate(grown)
    assert (
        "weights: checkpoint has ['1', '1', '0'] (with 0 for the 1 streams added since), this loader has "
        "['1', '1', '1']" in str(info.value)
    )
