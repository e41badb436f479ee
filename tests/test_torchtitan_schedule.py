"""ZephonDataLoader with a data schedule: phases counted in TorchTitan train
steps (the first is 1), with gradient accumulation; a global batch change
asks for a relaunch and continues exactly after it; TorchTitan's config
manager reads the phases and the flag that turns off its CUDA graphs."""

from __future__ import annotations

import textwrap

import pytest

pytest.importorskip("torchtitan", reason="needs the [torchtitan] extra")

from loader_reference import run_step_hashes  # noqa: E402
from zephon_stream import Phase, StreamingLoader  # noqa: E402
from zephon_stream.errors import ConfigError  # noqa: E402
from zephon_stream.integrations.torchtitan import ZephonDataLoader  # noqa: E402
from zephon_stream.loader.front.audit import union_sha256  # noqa: E402
from test_torchtitan import job_config_parser  # noqa: E402


@pytest.fixture(scope="module")
def streams(small_dataset, small_bpe_dataset):
    return [f"{small_dataset.url}:1", f"{small_bpe_dataset.url}:1"]


def build(config, *, dp_world_size=1, dp_rank=0, **kwargs):
    return config.build(dp_world_size=dp_world_size, dp_rank=dp_rank, tokenizer=None, snapshot_every_n_steps=None,
                        **kwargs)  # fmt: skip


def titan_hashes(loader, steps):
    out, shapes = [], []
    for _ in range(steps):
        inputs, labels = next(loader)
        shapes.append(tuple(inputs["input"].shape))
        out.append(union_sha256([(loader.last_sample_positions.numpy(), inputs["input"].numpy(), labels.numpy())]))
    return out, shapes


def reference(streams, schedule, steps):
    urls = [s.rsplit(":", 1)[0] for s in streams]
    # NOTE: the TorchTitan config's default cross-document targets.
    with StreamingLoader(urls, schedule=schedule, pipeline="threads", cross_document_targets="ignore") as loader:
        return run_step_hashes([loader], steps)


@pytest.mark.parametrize("accumulation", [1, 2])
def test_phases_start_at_the_torchtitan_train_step_they_name(streams, accumulation):
    phases = [{"step": 1, "seq_len": 32}, {"step": 3, "seq_len": 64, "weights": [0, 1]}]
    config = ZephonDataLoader.Config(streams=streams, phases=phases, gradient_accumulation_steps=accumulation,
                                     pipeline="threads")  # fmt: skip
    with build(config, seq_len=32, local_batch_size=4) as loader:
        got, shapes = titan_hashes(loader, 6)
    # NOTE: train step 3 is the third train step: loader steps from 2 x accumulation on.
    start = 2 * accumulation
    assert shapes == [(4, 32)] * start + [(4, 64)] * (6 - start)
    expected = reference(streams, [Phase(start_step=0, global_batch=4, seq_len=32),
                                   Phase(start_step=start, global_batch=4, seq_len=64, weights=(0, 1))], 6)  # fmt: skip
    assert got == expected


def test_a_global_batch_change_asks_for_a_relaunch_and_continues_exactly_after_it(streams):
    config = ZephonDataLoader.Config(streams=streams, pipeline="threads",
                                     phases=[{"step": 1, "global_batch": 4}, {"step": 4, "global_batch": 12}])  # fmt: skip
    with build(config, dp_world_size=2, dp_rank=0, seq_len=32, local_batch_size=2) as loader:
        titan_hashes(loader, 3)
        with pytest.raises(ConfigError, match=r"phase 1 \(TorchTitan step 4\): global_batch 12.*--training.local_batch_size 6"):
            next(loader)
        state = loader.state_dict()
    # NOTE: relaunched at dp 3 with the new phase's local batch (12 = 3 x 4).
    ranks = [build(config, dp_world_size=3, dp_rank=r, seq_len=32, local_batch_size=4) for r in range(3)]
    got = []
    try:
        for rank in ranks:
            rank.load_state_dict(state)
        for _ in range(3):
            rows = []
            for rank in ranks:
                inputs, labels = next(rank)
                rows.append((rank.last_sample_positions.numpy(), inputs["input"].numpy(), labels.numpy()))
            got.append(union_sha256(rows))
    finally:
        for rank in ranks:
            rank.close()
    expected = reference(streams, [Phase(start_step=0, global_batch=4, seq_len=32),
                                   Phase(start_step=3, global_batch=12, seq_len=32)], 6)  # fmt: skip
    assert got == expected[3:]


def test_phases_as_json_and_bad_phases_are_refused_naming_them(streams):
    config = ZephonDataLoader.Config(streams=streams, phases='[{"step": 1}, {"step": 2, "seq_len": 64}]')
    assert config.phases.startswith("[")
    with pytest.raises(ConfigError, match=r"phases\[0\]: give 'step'"):
        ZephonDataLoader.Config(streams=streams, phases=[{"start_step": 0}])
    with pytest.raises(ConfigError, match=r"phases\[0\]: give seq_len when a later phase changes it"):
        build(ZephonDataLoader.Config(streams=streams, phases=[{"step": 1}, {"step": 3, "seq_len": 64}]),
              seq_len=32, local_batch_size=4)  # fmt: skip
    with pytest.raises(ConfigError, match="not a JSON list"):
        ZephonDataLoader.Config(streams=streams, phases="[{step: 1}]")


def test_torchtitan_config_manager_reads_phases_from_the_command_line(tmp_path, monkeypatch):
    parse = job_config_parser(
        tmp_path, monkeypatch, "zephon_phase_job",
        "ZephonDataLoader.Config(dataset_path='s3://bucket/web', "
        """phases='[{"step": 1}, {"step": 100, "seq_len": 4096}]')""",
    )
    assert parse().dataloader.phases == '[{"step": 1}, {"step": 100, "seq_len": 4096}]'
    override = parse("--dataloader.phases", '[{"step": 1, "seq_len": 512}]')
    assert override.dataloader.phases == '[{"step": 1, "seq_len": 512}]'


def test_a_run_ends_at_a_phases_end_with_dataloader_exhausted(streams):
    from torchtitan.components.dataloader import DataloaderExhaustedError

    config = ZephonDataLoader.Config(streams=streams, pipeline="threads", end_after_phase=0,
                                     phases=[{"step": 1}, {"step": 4, "weights": [0, 1]}])  # fmt: skip
    with build(config, seq_len=32, local_batch_size=4) as loader:
        titan_hashes(loader, 3)
        with pytest.raises(DataloaderExhaustedError, match="the end of phase 0"):
            next(loader)


def test_cuda_graphs_are_on_by_default_and_the_flag_docs_name_turns_them_off(tmp_path, monkeypatch):
    # NOTE: docs/torchtitan.md: a phase that changes seq_len needs
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
