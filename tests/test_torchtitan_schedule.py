"""ZephonDataLoader with a data schedule: phases counted in TorchTitan train
steps (the first is 1), with gradient accumulation; a global batch change
asks for a relaunch and continues exactly after it; TorchTitan's config
manager reads the phases and the flag that turns off its CUDA graphs."""

from __future__ import annotations

import textwrap

import pytest

pytest.importorskip("torchtitan", reason="needs the [torchtitan] extra")

from loader_reference import run_step_hashes  # noqa: E402
from test_torchtitan import job_config_parser  # noqa: E402
from titan_forms import as_rows, trainer_keywords  # noqa: E402
from zephon_stream import Phase, StreamingLoader  # noqa: E402
from zephon_stream.errors import ConfigError  # noqa: E402
from zephon_stream.integrations.torchtitan import TITAN, DataloaderExhaustedError, ZephonDataLoader  # noqa: E402
from zephon_stream.loader.front.audit import union_sha256  # noqa: E402


@pytest.fixture(scope="module")
def streams(small_dataset, small_bpe_dataset):
    return [f"{small_dataset.url}:1", f"{small_bpe_dataset.url}:1"]


def build(config, *, dp_world_size=1, dp_rank=0, seq_len, local_batch_size):
    """``config.build`` as the installed TorchTitan's trainer calls it."""
    return config.build(
        dp_world_size=dp_world_size, dp_rank=dp_rank, tokenizer=None, **trainer_keywords(seq_len, local_batch_size)
    )


def rows_of(loader, inputs, labels):
    """``(sample positions, input rows, label rows)`` of the batch just taken, as arrays."""
    seq_len = inputs["input"].numel() // len(loader.last_sample_positions)
    return (
        loader.last_sample_positions.numpy(),
        as_rows(inputs["input"], seq_len).numpy(),
        as_rows(labels, seq_len).numpy(),
    )


def titan_hashes(loader, steps):
    out, shapes = [], []
    for _ in range(steps):
        inputs, labels = next(loader)
        positions, rows, label_rows = rows_of(loader, inputs, labels)
        shapes.append(rows.shape)
        out.append(union_sha256([(positions, rows, label_rows)]))
    return out, shapes


def reference(streams, schedule, steps):
    urls = [s.rsplit(":", 1)[0] for s in streams]
    # The TorchTitan config's default cross-document targets.
    with StreamingLoader(urls, schedule=schedule, pipeline="threads", cross_document_targets="ignore") as loader:
        return run_step_hashes([loader], steps)


@pytest.mark.parametrize("accumulation", [1, 2])
def test_phases_start_at_the_torchtitan_train_step_they_name(streams, accumulation):
    phases = [{"step": 1, "seq_len": 32}, {"step": 3, "seq_len": 64, "weights": [0, 1]}]
    config = ZephonDataLoader.Config(
        streams=streams, phases=phases, gradient_accumulation_steps=accumulation, pipeline="threads"
    )
    with build(config, seq_len=32, local_batch_size=4) as loader:
        got, shapes = titan_hashes(loader, 6)
    # Train step 3 is the third train step: loader steps from 2 x accumulation on.
    start = 2 * accumulation
    assert shapes == [(4, 32)] * start + [(4, 64)] * (6 - start)
    expected = reference(
        streams,
        [
            Phase(start_step=0, global_batch=4, seq_len=32),
            Phase(start_step=start, global_batch=4, seq_len=64, weights=(0, 1)),
        ],
        6,
    )
    assert got == expected


def test_a_global_batch_change_asks_for_a_relaunch_and_continues_exactly_after_it(streams):
    config = ZephonDataLoader.Config(
        streams=streams, pipeline="threads", phases=[{"step": 1, "global_batch": 4}, {"step": 4, "global_batch": 12}]
    )
    with build(config, dp_world_size=2, dp_rank=0, seq_len=32, local_batch_size=2) as loader:
        titan_hashes(loader, 3)
        # 0.3.0 counts rows a rank, main tokens: 6 rows of 32.
        flag = (
            "--training.num_tokens_per_microbatch_per_dp_rank 192"
            if TITAN.flat_batches
            else "--training.local_batch_size 6"
        )
        with pytest.raises(ConfigError, match=r"phase 1 \(TorchTitan step 4\): global_batch 12.*" + flag):
            next(loader)
        state = loader.state_dict()
    # Relaunched at dp 3 with the new phase's local batch (12 = 3 x 4).
    ranks = [build(config, dp_world_size=3, dp_rank=r, seq_len=32, local_batch_size=4) for r in range(3)]
    got = []
    try:
        for rank in ranks:
            rank.load_state_dict(state)
        for _ in range(3):
            rows = []
            for rank in ranks:
                rows.append(rows_of(rank, *next(rank)))
            got.append(union_sha256(rows))
    finally:
        for rank in ranks:
            rank.close()
    expected = reference(
        streams, [Phase(start_step=0, global_batch=4, seq_len=32), Phase(start_step=3, global_batch=12, seq_len=32)], 6
    )
    assert got == expected[3:]


def test_phases_as_json_and_bad_phases_are_refused_naming_them(streams):
    config = ZephonDataLoader.Config(streams=streams, phases='[{"step": 1}, {"step": 2, "seq_len": 64}]')
    assert config.phases.startswith("[")
    with pytest.raises(ConfigError, match=r"phases\[0\]: give 'step'"):
        ZephonDataLoader.Config(streams=streams, phases=[{"start_step": 0}])
    with pytest.raises(ConfigError, match=r"phases\[0\]: give seq_len when a later phase changes it"):
        build(
            ZephonDataLoader.Config(streams=streams, phases=[{"step": 1}, {"step": 3, "seq_len": 64}]),
            seq_len=32,
            local_batch_size=4,
        )
    with pytest.raises(ConfigError, match="not a JSON list"):
        ZephonDataLoader.Config(streams=streams, phases="[{step: 1}]")


def test_torchtitan_config_manager_reads_phases_from_the_command_line(tmp_path, monkeypatch):
    parse = job_config_parser(
        tmp_path,
        monkeypatch,
        "zephon_phase_job",
        "ZephonDataLoader.Config(dataset_path='s3://bucket/web', "
        """phases='[{"step": 1}, {"step": 100, "seq_len": 4096}]')""",
    )
    assert parse().dataloader.phases == '[{"step": 1}, {"step": 100, "seq_len": 4096}]'
    override = parse("--dataloader.phases", '[{"step": 1, "seq_len": 512}]')
    assert override.dataloader.phases == '[{"step": 1, "seq_len": 512}]'


def test_phases_in_torchtitan_mains_terms_are_the_same_schedule(streams):
    """``max_context_length`` is ``seq_len``; ``num_tokens_per_train_step`` is
    ``global_batch x gradient_accumulation_steps x seq_len`` (on either TorchTitan)."""
    rows = [{"step": 1, "seq_len": 32, "global_batch": 4}, {"step": 3, "seq_len": 64, "global_batch": 4}]
    tokens = [
        {"step": 1, "max_context_length": 32, "num_tokens_per_train_step": 256},
        {"step": 3, "max_context_length": 64, "num_tokens_per_train_step": 512},
    ]
    got = {}
    for name, phases in (("rows", rows), ("tokens", tokens)):
        config = ZephonDataLoader.Config(
            streams=streams, phases=phases, gradient_accumulation_steps=2, pipeline="threads"
        )
        with build(config, seq_len=32, local_batch_size=4) as loader:
            got[name] = titan_hashes(loader, 5)[0]
    assert got["rows"] == got["tokens"]
    with pytest.raises(ConfigError, match=r"phases\[1\]: num_tokens_per_train_step 1000 is not a whole number"):
        build(
            ZephonDataLoader.Config(
                streams=streams, phases=[tokens[0], {"step": 3, "num_tokens_per_train_step": 1000}]
            ),
            seq_len=32,
            local_batch_size=4,
        )
    with pytest.raises(ConfigError, match="disagree"):
        ZephonDataLoader.Config(streams=streams, phases=[{"step": 1, "seq_len": 32, "max_context_length": 64}])


def test_a_run_ends_at_a_phases_end_with_dataloader_exhausted(streams):
    config = ZephonDataLoader.Config(
        streams=streams, pipeline="threads", end_after_phase=0, phases=[{"step": 1}, {"step": 4, "weights": [0, 1]}]
    )
    with build(config, seq_len=32, local_batch_size=4) as loader:
        titan_hashes(loader, 3)
        with pytest.raises(DataloaderExhaustedError, match="the end of phase 0"):
            next(loader)


def test_cuda_graphs_are_on_by_default_and_the_flag_docs_name_turns_them_off(tmp_path, monkeypatch):
    # docs/torchtitan.md: a phase that changes seq_len needs
    # --training.disable-cuda-graphs, TorchTitan's graphs taking one shape only.
    job = textwrap.dedent(
        """
        from dataclasses import dataclass, field
        from torchtitan.config.configs import TrainingConfig

        @dataclass(kw_only=True, slots=True)
        class Job:
            hf_assets_path: str = "."
            training: TrainingConfig = field(default_factory=TrainingConfig)

        def job():
            return Job()
        """
    )
    (tmp_path / "zephon_graphs_job.py").write_text(job)
    monkeypatch.syspath_prepend(str(tmp_path))
    from torchtitan.config import ConfigManager

    def parse(*overrides):
        return ConfigManager().parse_args(["--module", "zephon_graphs_job", "--config", "job", *overrides])

    assert parse().training.disable_cuda_graphs is False
    assert parse("--training.disable-cuda-graphs").training.disable_cuda_graphs is True
    assert parse("--training.disable_cuda_graphs").training.disable_cuda_graphs is True
