"""``zephon-stream which`` on a schedule: the phase of a step and its samples."""

from __future__ import annotations

import json

import numpy as np

from zephon_stream.cli import main
from zephon_stream.plan import ScheduleOrder, SchedulePhase, StreamShape
from zephon_stream.reader import DatasetReader

PHASES = [
    {"start_step": 0, "global_batch": 8, "seq_len": 64, "lanes": 8, "weights": [1, 0]},
    {"start_step": 6, "global_batch": 12, "seq_len": 64, "lanes": 12, "weights": [1, 1]},
    {"start_step": 10, "global_batch": 6, "seq_len": 128, "lanes": 6, "weights": [2, 1]},
]


def schedule_order(urls: list[str], seed: int) -> ScheduleOrder:
    shapes = []
    for url in urls:
        with DatasetReader.open(url) as reader:
            m = reader.manifest
            shapes.append(StreamShape.from_counts(m.fingerprint, m.block_tokens, m.block_token_counts()))
    return ScheduleOrder(shapes, [SchedulePhase.from_dict(p) for p in PHASES], seed=seed)


def test_which_prints_the_phase_of_a_step_and_its_samples(small_dataset, small_bpe_dataset, tmp_path, capsys):
    urls = [small_dataset.url, small_bpe_dataset.url]
    path = tmp_path / "schedule.json"
    path.write_text(json.dumps({"seed": 4, "phases": PHASES}))
    order = schedule_order(urls, seed=4)
    for step, phase in ((3, 0), (7, 1), (12, 2)):
        assert main(["which", *urls, "--step", str(step), "--schedule", str(path), "--world-size", "2", "--json"]) == 0
        out = json.loads(capsys.readouterr().out)
        assert out["phase"]["index"] == phase and out["seq_len"] == PHASES[phase]["seq_len"]
        pieces = [order.rank_slice(step, 2, r) for r in range(2)]
        want = np.concatenate([np.stack([p.positions, p.stream, p.block, p.sample]) for p in pieces], axis=1)
        got = np.array([[s["position"], s["stream"], s["block"], s["sample"]] for s in out["samples"]]).T
        assert np.array_equal(got, want)
        assert [s["rank"] for s in out["samples"]] == [0] * (len(want[0]) // 2) + [1] * (len(want[0]) // 2)
        assert {s["num_tokens"] for s in out["samples"]} == {PHASES[phase]["seq_len"] + 1}
    assert main(["which", *urls, "--step", "12", "--schedule", str(path)]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[1] == "phase 2 (steps 10 on): global batch 6, window 0, weights ['2', '1']"
    assert main(["which", *urls, "--step", "7", "--schedule", str(path)]) == 0
    assert capsys.readouterr().out.splitlines()[1].startswith("phase 1 (steps 6 to 9): global batch 12")


def test_which_refuses_a_bad_schedule_file(small_dataset, tmp_path, capsys):
    path = tmp_path / "schedule.json"
    path.write_text(json.dumps([{"start_step": 0, "global_batch": 8, "seq_len": 64, "lane": 8}]))
    assert main(["which", small_dataset.url, "--step", "1", "--schedule", str(path)]) == 1
    assert "schedule phase 0: unknown keys ['lane'], missing keys []" in capsys.readouterr().err
    assert main(["which", small_dataset.url, "--step", "1"]) == 1
    assert "pass --seq-len and --global-batch, or --schedule FILE" in capsys.readouterr().err
