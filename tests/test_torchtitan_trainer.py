"""ZephonDataLoader batches through TorchTitan's own train_step batch handling
(0.3.0 and main handle a batch with the same lines).

TorchTitan's ``Trainer`` cannot be imported on a machine without triton (its
model package imports it), so ``titan_train_step_batches`` below repeats the
batch handling of ``Trainer.train_step`` line for line, and
``test_the_repeated_lines_are_torchtitans_own`` checks each of those lines
against the installed ``torchtitan/trainer.py``: when TorchTitan changes how
it handles a batch, that test fails and this file must follow.

The handling that broke CUDA delivery: the valid-label count goes into a CPU
tensor (``torch.tensor(0)``) before the trainer moves the batch itself.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

pytest.importorskip("torchtitan", reason="needs the [torchtitan] extra")

from torchtitan.components.loss import IGNORE_INDEX  # noqa: E402

from titan_forms import trainer_keywords  # noqa: E402
from zephon_stream.integrations.torchtitan import ZephonDataLoader  # noqa: E402

# The lines of TorchTitan's Trainer.train_step that touch the batch, as they
# stand in its trainer.py (whitespace aside), 0.3.0 and main alike.
TITAN_BATCH_LINES = (
    "local_valid_tokens = torch.tensor(0, dtype=torch.int64)",
    "input_dict, labels = next(data_iterator)",
    "local_valid_tokens += (labels != IGNORE_INDEX).sum()",
    "global_valid_tokens = local_valid_tokens.to(self.device)",
    "input_dict[key] = value.to(self.device)",
    "label_mbs.append(labels.to(self.device))",
)

DEVICES = [None] + (["cuda"] if torch.cuda.is_available() else [])


def titan_train_step_batches(data_iterator, *, device: torch.device, gradient_accumulation_steps: int):
    """TorchTitan's ``Trainer.train_step`` up to the forward pass (no pipeline
    parallelism, no dp reduction): what it does with each batch."""
    microbatch_groups = []
    local_valid_tokens = torch.tensor(0, dtype=torch.int64)
    for _ in range(gradient_accumulation_steps):
        input_dict, labels = next(data_iterator)
        local_valid_tokens += (labels != IGNORE_INDEX).sum()
        microbatch_groups.append([(input_dict, labels)])
    global_valid_tokens = local_valid_tokens.to(device)
    moved = []
    for microbatches in microbatch_groups:
        for input_dict, labels in microbatches:
            for key, value in input_dict.items():
                if isinstance(value, torch.Tensor):
                    input_dict[key] = value.to(device)
            moved.append((input_dict, labels.to(device)))
    return moved, int(local_valid_tokens), global_valid_tokens


def test_the_repeated_lines_are_torchtitans_own():
    source = Path(importlib.util.find_spec("torchtitan").origin).with_name("trainer.py").read_text()
    flat = " ".join(source.split())
    for line in TITAN_BATCH_LINES:
        assert " ".join(line.split()) in flat, f"torchtitan's trainer.py no longer says: {line}"


@pytest.mark.parametrize("pipeline", ["process", "threads"])
@pytest.mark.parametrize("device", DEVICES)
def test_train_step_takes_the_batches_at_every_device_setting(small_bpe_dataset, device, pipeline):
    trainer_device = torch.device("cuda" if device else "cpu")
    reference = ZephonDataLoader.Config(dataset_path=small_bpe_dataset.url, seed=5, pipeline="threads")
    config = ZephonDataLoader.Config(dataset_path=small_bpe_dataset.url, seed=5, device=device, pipeline=pipeline)
    build = dict(dp_world_size=2, dp_rank=1, tokenizer=None, **trainer_keywords(128, 4))
    eos = small_bpe_dataset.manifest.tokenizer.eos_id
    with config.build(**build) as loader, reference.build(**build) as cpu_loader:
        batches, cpu_batches = iter(loader), iter(cpu_loader)
        # 12 microbatches held through a step: more than the ring would
        # hold if the loader did not copy what a consumer keeps.
        for _ in range(3):
            moved, counted, on_device = titan_train_step_batches(
                batches, device=trainer_device, gradient_accumulation_steps=12
            )
            want, _, _ = titan_train_step_batches(
                cpu_batches, device=torch.device("cpu"), gradient_accumulation_steps=12
            )
            # By default the label of each input EOS is IGNORE_INDEX, as TorchTitan's own loader trains.
            input_eos = sum(int((d["input"] == eos).sum()) for d, _ in want)
            assert counted == 12 * 4 * 128 - input_eos and int(on_device) == counted
            assert on_device.device.type == trainer_device.type
            for (input_dict, labels), (want_dict, want_labels) in zip(moved, want):
                assert set(input_dict) == {"input", "positions"}
                for got, expected in (
                    (input_dict["input"], want_dict["input"]),
                    (input_dict["positions"], want_dict["positions"]),
                    (labels, want_labels),
                ):
                    assert got.device.type == trainer_device.type and got.dtype == torch.int64
                    assert torch.equal(got.cpu(), expected)
