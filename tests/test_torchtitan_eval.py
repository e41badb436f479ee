"""ZephonEvalDataLoader as TorchTitan's validator builds and reads it: one pass
reads every held-out sample exactly once over the dp ranks, at any dp degree,
with padding rows' labels at TorchTitan's IGNORE_INDEX."""

from __future__ import annotations

import dataclasses

import pytest
import torch

pytest.importorskip("torchtitan", reason="needs the [torchtitan] extra")

from torchtitan.components.loss import IGNORE_INDEX  # noqa: E402

from titan_forms import as_rows, repeat, trainer_keywords  # noqa: E402
from zephon_stream.errors import ConfigError  # noqa: E402
from zephon_stream.integrations.torchtitan import TITAN, DataloaderExhausted, ZephonEvalDataLoader  # noqa: E402

SEQ_LEN, LOCAL_BATCH = 128, 3


def validation_rows(config, dp_world_size):
    """Each rank's (input rows, labels rows) of one validation, built and
    iterated as TorchTitan's Validator.validate does (until StopIteration)."""
    config = dataclasses.replace(config, **repeat(False))  # what the validator does for steps = -1
    per_rank = []
    for rank in range(dp_world_size):
        with config.build(
            dp_world_size=dp_world_size, dp_rank=rank, tokenizer=None, **trainer_keywords(SEQ_LEN, LOCAL_BATCH)
        ) as loader:
            batches = [(as_rows(d["input"], SEQ_LEN), as_rows(labels, SEQ_LEN)) for d, labels in loader]
            with pytest.raises(DataloaderExhausted):
                next(loader)
            num_samples = loader.eval_loader.num_samples
        per_rank.append(batches)
    return per_rank, num_samples


@pytest.mark.parametrize("dp_world_size", [1, 2, 3])
def test_one_validation_reads_each_held_out_sample_once_at_any_dp_degree(small_dataset, dp_world_size):
    config = ZephonEvalDataLoader.Config(dataset_path=small_dataset.url)
    per_rank, num_samples = validation_rows(config, dp_world_size)
    steps = {len(batches) for batches in per_rank}
    assert len(steps) == 1, "every rank takes the same number of steps"
    valid = [
        row.tolist()
        for batches in per_rank
        for inputs, labels in batches
        for row, label in zip(inputs, labels)
        if (label != IGNORE_INDEX).any()
    ]
    padded = sum(int((labels == IGNORE_INDEX).all(dim=1).sum()) for batches in per_rank for _, labels in batches)
    assert len(valid) == num_samples
    assert padded == steps.pop() * LOCAL_BATCH * dp_world_size - num_samples
    reference, _ = validation_rows(config, 1)
    want = [
        row.tolist()
        for inputs, labels in reference[0]
        for row, label in zip(inputs, labels)
        if (label != IGNORE_INDEX).any()
    ]
    assert sorted(valid) == sorted(want)


def test_repeat_starts_another_pass_and_labels_follow_inputs(small_dataset):
    config = ZephonEvalDataLoader.Config(dataset_path=small_dataset.url, **repeat(True))
    with config.build(dp_world_size=1, dp_rank=0, tokenizer=None, **trainer_keywords(SEQ_LEN, LOCAL_BATCH)) as loader:
        steps = loader.eval_loader.num_steps
        batches = [
            ({"input": as_rows(d["input"], SEQ_LEN)}, as_rows(labels, SEQ_LEN))
            for d, labels in (next(loader) for _ in range(steps + 2))
        ]
        assert loader.passes == 2
        eos = loader.eval_loader.manifests[0][1].tokenizer.eos_id
    for (first, _), (again, _) in zip(batches[:2], batches[steps:]):
        assert torch.equal(first["input"], again["input"])
    inputs = torch.cat([input_dict["input"] for input_dict, _ in batches[: steps - 1]])
    labels = torch.cat([labels for _, labels in batches[: steps - 1]])
    follows = labels[:, :-1] == inputs[:, 1:]
    assert follows[inputs[:, :-1] != eos].all()
    assert (inputs == eos).sum() > 0
    assert (labels[inputs == eos] == IGNORE_INDEX).all(), "input EOS labels are ignored by default"


def test_config_needs_one_source_and_hides_secrets():
    with pytest.raises(ConfigError, match="exactly one"):
        ZephonEvalDataLoader.Config()
    config = ZephonEvalDataLoader.Config(dataset_path="s3://b/heldout", storage_options={"secret": "hunter2"})
    assert "hunter2" not in repr(config) and "hunter2" not in str(config.to_dict())


def test_the_validators_own_lines_build_one_pass_or_repeating_passes(small_dataset):
    """TorchTitan's ``Validator`` sets the repeat flag with ``replace`` and
    builds the loader with the trainer's keywords at each validation; its
    lines, checked against the installed source, on our config."""
    import importlib.util
    from pathlib import Path

    source = Path(importlib.util.find_spec("torchtitan.components.validate").origin).read_text()
    flat = " ".join(source.split())
    replace_line = f"self.dl_config = replace(config.dataloader, {TITAN.repeat_field}=config.steps != -1)"
    assert replace_line in flat, f"torchtitan's validate.py no longer says: {replace_line}"
    build_line = (
        "max_context_length=self.seq_len, num_tokens_per_batch=self.num_tokens_per_batch"
        if TITAN.flat_batches
        else "seq_len=self.seq_len, local_batch_size="
    )
    assert build_line in flat, f"torchtitan's validate.py no longer says: {build_line}"
    for steps, passes in ((-1, 1), (5, 2)):
        dl_config = dataclasses.replace(
            ZephonEvalDataLoader.Config(dataset_path=small_dataset.url), **{TITAN.repeat_field: steps != -1}
        )
        with dl_config.build(dp_world_size=2, dp_rank=1, tokenizer=None, **trainer_keywords(SEQ_LEN, 64)) as loader:
            for taken, _ in enumerate(loader, start=1):
                if taken == loader.eval_loader.num_steps + 1:
                    break
            assert loader.passes == passes
