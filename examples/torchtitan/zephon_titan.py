"""TorchTitan job configs that train on zephon_stream datasets.

TorchTitan (0.3.0, or main from its source tree) reads a job from a Python
function returning a ``Trainer.Config``; select one with ``--module
zephon_titan --config NAME`` (this folder on ``PYTHONPATH``) and override any
field on the command line, e.g. ``--dataloader.dataset_path s3://bucket/other``.

The only zephon_stream-specific line of each config is the ``dataloader=``
assignment; the rest is TorchTitan's own llama3 config. The batch size is
TorchTitan's to set, in its own names: 0.3.0 counts rows (``seq_len``,
``local_batch_size``), main tokens (``max_context_length``,
``num_tokens_per_microbatch_per_dp_rank``).

Environment (defaults in brackets):
    ZEPHON_DATASET   dataset URL [s3://my-bucket/zephon/stdlib-bpe2k]
    ZEPHON_ASSETS    TorchTitan hf_assets_path: the folder holding the
                     tokenizer.json the dataset was written with
                     [./assets/tokenizer-bpe2k]
    ZEPHON_DEVICE    unset: CPU batches that TorchTitan copies to the GPU
                     (the verified path); ``cuda``: delivered on the GPU
                     by the loader, not yet run on a GPU in its current
                     form (docs/torchtitan.md, "GPU delivery")
    AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, ...: S3 endpoint and credentials
"""

from __future__ import annotations

import os

from torchtitan.components.validate import Validator
from torchtitan.models.llama3.config_registry import llama3_8b, llama3_debugmodel
from torchtitan.trainer import Trainer

from zephon_stream.integrations.torchtitan import TITAN, ZephonDataLoader

DATASET = os.environ.get("ZEPHON_DATASET", "s3://my-bucket/zephon/stdlib-bpe2k")
ASSETS = os.environ.get("ZEPHON_ASSETS", "./assets/tokenizer-bpe2k")
DEVICE = os.environ.get("ZEPHON_DEVICE") or None


def llama3_debugmodel_zephon() -> Trainer.Config:
    """TorchTitan's llama3 debug model (vocab 2048) on a zephon_stream dataset.

    The dataset's tokenizer must have at most 2048 ids (make one with
    ``make_tokenizer.py``).
    """
    config = llama3_debugmodel()
    config.hf_assets_path = ASSETS
    # The one zephon_stream line. The batches are CPU tensors that the
    # trainer copies to the GPU unless ZEPHON_DEVICE=cuda.
    config.dataloader = ZephonDataLoader.Config(dataset_path=DATASET, seed=0, device=DEVICE)
    # 8 rows of 512 tokens per rank: in rows on TorchTitan 0.3.0, in tokens on main.
    if TITAN.flat_batches:
        config.training.max_context_length = 512
        config.training.num_tokens_per_microbatch_per_dp_rank = 8 * 512
    else:
        config.training.seq_len = 512
        config.training.local_batch_size = 8
    config.training.steps = 20
    config.checkpoint.enable = True
    config.checkpoint.interval = 10
    config.checkpoint.last_save_model_only = False
    # The stock validator reads a Hugging Face dataset; off here.
    config.validator = Validator.Config()
    return config


def llama3_8b_zephon() -> Trainer.Config:
    """TorchTitan's Llama 3.1 8B config streaming a dataset written with the
    Llama 3.1 tokenizer (``--tokenizer hf:./assets/hf/Llama-3.1-8B/tokenizer.json``)."""
    config = llama3_8b()
    config.dataloader = ZephonDataLoader.Config(dataset_path=DATASET, device=DEVICE)
    config.validator = Validator.Config()
    return config
