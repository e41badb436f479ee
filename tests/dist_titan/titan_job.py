"""A TorchTitan main job config for ``python -m torchtitan.train --module titan_job
--config zephon_debugmodel``: TorchTitan's own llama3 debug model and
``Trainer``, the zephon_stream loader, CPU and gloo (with cpu_site/ first on
the path), and a record of every batch each rank took.

Settings come as JSON in ``ZEPHON_TITAN_JOB``: ``dataset``, ``assets`` (the
``hf_assets_path`` with the dataset's tokenizer), ``seq_len``,
``global_rows`` (rows a step over all dp ranks), ``steps``, ``interval``
(checkpoint interval), ``packing``, ``seed``, ``record`` (a folder) and
optionally ``load`` (a checkpoint folder to start from, all of its state).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from torchtitan.components.validate import Validator
from torchtitan.experiments.graph_trainer.common_utils import GraphTrainerScaledDotProductAttention
from torchtitan.models.llama3.config_registry import llama3_debugmodel

from titan_setup import row_digests
from zephon_stream.integrations.torchtitan import ZephonDataLoader


class RecordingDataLoader(ZephonDataLoader):
    """``ZephonDataLoader`` that appends what each ``next()`` gave to ``record/rank<r>.jsonl``."""

    @dataclass(kw_only=True, slots=True)
    class Config(ZephonDataLoader.Config):
        record: str = ""

    def __next__(self):
        input_dict, labels = super().__next__()
        line = {
            "shape": list(input_dict["input"].shape),
            "positions": self.last_sample_positions.tolist(),
            "digests": row_digests(input_dict["input"], labels, self.seq_len),
        }
        with open(Path(self.config.record) / f"rank{self.dp_rank}.jsonl", "a", encoding="utf-8") as out:
            out.write(json.dumps(line) + "\n")
        return input_dict, labels


def zephon_debugmodel():
    job = json.loads(os.environ["ZEPHON_TITAN_JOB"])
    dp = int(os.environ["WORLD_SIZE"])
    config = llama3_debugmodel()
    config.hf_assets_path = job["assets"]
    config.dataloader = RecordingDataLoader.Config(
        dataset_path=job["dataset"], seed=job["seed"], prefetch_steps=2, packing=job["packing"], record=job["record"]
    )
    # Flex attention has no backward on CPU; the graph trainer's SDPA has (it
    # treats a microbatch as one causal sequence, which changes the model's
    # math, not its data).
    for layer in config.model_spec.model.layers:
        layer.attention.inner_attention = GraphTrainerScaledDotProductAttention.Config()
    config.parallelism.spmd_backend = "partial_dtensor"
    config.training.max_context_length = job["seq_len"]
    config.training.num_tokens_per_microbatch_per_dp_rank = job["global_rows"] // dp * job["seq_len"]
    config.training.steps = job["steps"]
    config.checkpoint.enable = True
    config.checkpoint.interval = job["interval"]
    if job.get("load"):
        config.checkpoint.initial_load_path = job["load"]
        config.checkpoint.initial_load_model_only = False
    config.metrics.log_freq = 1
    config.validator = Validator.Config()
    return config
