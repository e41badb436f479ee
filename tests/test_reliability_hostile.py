"""Hostile inputs end to end (tools/reliability/hostile.py): every case runs
in a child process under a timeout and a 3 GiB address-space cap, and ends in
a clear library error naming the object, or in correct output; never a hang,
an interpreter crash, a MemoryError or wrong data.

Manifest decoding is fuzzed in depth by tests/test_format_manifest.py and
block frames by tests/test_format_block.py; these cases go through the public
load path (StreamingLoader, read_block, verify) on real written datasets."""

from __future__ import annotations

from pathlib import Path

import pytest

from tools.reliability import hostile

TRIES = {
    "manifest_mutations": 12,
    "manifest_fields": 1,
    "huge_block_range": 1,
    "bit_flips": 6,
    "frame_header_flips": 1,
    "frame_past_declared_size": 2,
    "truncated_objects": 3,
    "tiny_datasets": 1,
    "writer_text": 1,
    "hostile_state": 1,
}


@pytest.fixture(scope="module")
def outcomes(small_dataset, tmp_path_factory):
    return hostile.run_cases(
        dataset=Path(small_dataset.url), work=tmp_path_factory.mktemp("hostile"), tries=TRIES, seed=5, timeout_s=240
    )


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(TRIES))
def test_hostile_input_ends_in_a_clear_error_or_correct_output(outcomes, case):
    outcome = outcomes[case]
    assert outcome["status"] == "ok", f"{case}: {outcome['status']}\n{outcome.get('detail', '')}"
    assert outcome["tries"] > 0 and outcome["refused"] + outcome["accepted"] <= outcome["tries"]


@pytest.mark.slow
def test_every_corruption_is_detected_by_the_loader_and_by_verify(outcomes):
    flips = outcomes["bit_flips"]
    assert flips["verify_detected"] == flips["tries"] == TRIES["bit_flips"]
    # A flip in a frame header bit zstd ignores decodes to the same
    # tokens (the case checks they are identical); every other is refused.
    assert flips["detected"] + flips["accepted"] == flips["tries"] and flips["detected"] >= TRIES["bit_flips"] - 1
    assert outcomes["frame_past_declared_size"]["detected"] == TRIES["frame_past_declared_size"]
    assert outcomes["truncated_objects"]["detected"] >= TRIES["truncated_objects"] + 2


@pytest.mark.slow
def test_a_manifest_claiming_a_terabyte_block_is_a_truncation_error_not_a_memory_error(outcomes):
    outcome = outcomes["huge_block_range"]
    assert outcome["status"] == "ok", outcome.get("detail")
    assert outcome["examples"][0].startswith("TruncatedObjectError")


@pytest.mark.slow
def test_a_loader_state_with_an_out_of_range_position_is_refused_when_loaded(outcomes):
    outcome = outcomes["hostile_state"]
    assert outcome["status"] == "ok", outcome.get("detail")
    assert outcome["examples"][0].startswith("StateMismatchError: loader state key 'position'")
