"""TorchTitan integration: dataloaders that resume at any dp degree, on
TorchTitan 0.3.0 (PyPI) and on TorchTitan main (its source tree).

Select the training loader in a TorchTitan job config::

    config.dataloader = ZephonDataLoader.Config(dataset_path="s3://bucket/dataset")

and the validator's with ``ZephonEvalDataLoader.Config``. Which TorchTitan is
installed, and everything its two data APIs do differently, sits in
``api.py`` alone (:data:`TITAN`); the other modules: ``base.py`` (the end of a
finite run, the trainer's shape keywords, the tokenizer check),
``config.py`` (``ZephonDataLoader.Config``, mixture entries, phases),
``batches.py`` (a step's batch in the installed TorchTitan's form),
``state.py`` (the checkpoint entry), ``loader.py``, ``eval.py``, and for
TorchTitan's torchft trainer ``torchft.py`` (``ZephonFTDataLoader``,
``ZephonFTCheckpointManager``) and ``torchft_trainer.py`` (``ZephonFTTrainer``,
which imports TorchTitan's trainer and so its models).

This package needs TorchTitan (``pip install 'zephon-stream[torchtitan]'``, or
TorchTitan main with ``grain``); nothing else in zephon_stream imports it.
"""

from __future__ import annotations

from zephon_stream.integrations.torchtitan.api import INSTALL_HINT, TITAN, TitanAPI
from zephon_stream.integrations.torchtitan.base import (
    BaseDataLoader,
    DataloaderExhausted,
    DataloaderExhaustedError,
    TitanShape,
    check_tokenizer,
    titan_shape,
)
from zephon_stream.integrations.torchtitan.batches import IGNORE_INDEX, titan_batch, titan_input_dict, titan_layout
from zephon_stream.integrations.torchtitan.config import ZephonDataLoaderConfig, parse_stream_spec, phase_dicts
from zephon_stream.integrations.torchtitan.eval import ZephonEvalDataLoader
from zephon_stream.integrations.torchtitan.loader import ZephonDataLoader
from zephon_stream.integrations.torchtitan.state import STATE_KEY

__all__ = [
    "IGNORE_INDEX",
    "INSTALL_HINT",
    "STATE_KEY",
    "TITAN",
    "BaseDataLoader",
    "DataloaderExhausted",
    "DataloaderExhaustedError",
    "TitanAPI",
    "TitanShape",
    "ZephonDataLoader",
    "ZephonDataLoaderConfig",
    "ZephonEvalDataLoader",
    "check_tokenizer",
    "parse_stream_spec",
    "phase_dicts",
    "titan_batch",
    "titan_input_dict",
    "titan_layout",
    "titan_shape",
]
