"""What TorchTitan's loaders here build on: the one import of TorchTitan,
the end of a finite run, the trainer's shape keywords, configs printed without
secrets and the trainer's tokenizer checked against the datasets.

NOTE: this is the one module of zephon_stream that imports TorchTitan
(``titan_module``, which torchtitan_torchft*.py use for its torchft
experiment too); a missing TorchTitan (or torchdata) raises here with the
install hint.
"""

from __future__ import annotations

import dataclasses
import importlib
import types
from collections.abc import Sequence
from typing import Any

from zephon_stream.errors import ConfigError, TokenizerError
from zephon_stream.storage.redact import redact_options

INSTALL_HINT = "pip install 'zephon-stream[torchtitan]'"



def titan_module(name: str, *, needed_by: str) -> types.ModuleType:
    """TorchTitan's module ``name`` (``"torchtitan.components.dataloader"``).

    Raises:
        ModuleNotFoundError: TorchTitan (or torchdata) is missing, naming
            ``needed_by`` and the install hint.
    """
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        # NOTE: only a missing TorchTitan (or torchdata, which it needs) gets the
        # install hint; any other import failure is a real bug and surfaces as is.
        if (exc.name or "").split(".")[0] not in ("torchtitan", "torchdata"):
            raise
        raise ModuleNotFoundError(
            f"{needed_by} needs TorchTitan ({exc.name} is not installed): {INSTALL_HINT}", name=exc.name
        ) from exc


_dataloader = titan_module("torchtitan.components.dataloader", needed_by="zephon_stream.integrations.torchtitan")
BaseDataLoader = _dataloader.BaseDataLoader
DataloaderExhaustedError = _dataloader.DataloaderExhaustedError

__all__ = ["INSTALL_HINT", "BaseDataLoader", "DataloaderExhausted", "DataloaderExhaustedError", "check_tokenizer",
           "local_shape", "redacted_config_dict", "redacted_config_repr", "titan_module"]


class DataloaderExhausted(DataloaderExhaustedError, StopIteration):
    """The end of a finite run.

    It is TorchTitan's ``DataloaderExhaustedError`` (its trainer stops on it)
    and a ``StopIteration``, so ``for`` loops and TorchTitan's validator, which
    catches ``StopIteration``, end cleanly too. ``ZephonDataLoader`` is a plain
    iterator, not a generator, so PEP 479 does not turn it into a RuntimeError.
    """


def redacted_config_dict(config: Any) -> dict:
    """A loader config's ``to_dict()`` with its storage options redacted.

    NOTE: the trainer prints this dict and writes it to the dump folder and
    metric backends; storage options may hold keys. (Called with the config,
    since a slotted dataclass has no zero-argument super() on Python 3.10/3.11.)
    """
    out = BaseDataLoader.Config.to_dict(config)
    out["storage_options"] = redact_options(config.storage_options)
    return out


def redacted_config_repr(config: Any, name: str) -> str:
    """``name(field=value, ...)`` of a loader config, storage options redacted."""
    values = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}
    values["storage_options"] = redact_options(config.storage_options)
    return f"{name}(" + ", ".join(f"{key}={value!r}" for key, value in values.items()) + ")"


def local_shape(
    seq_len: int | None, local_batch_size: int | None, extra: dict[str, Any]
) -> tuple[int, int]:
    """``(seq_len, local_batch_size)`` from 0.3.0 or newer TorchTitan keywords."""
    max_context_length = extra.pop("max_context_length", None)
    num_tokens_per_batch = extra.pop("num_tokens_per_batch", None)
    if max_context_length is not None:
        if seq_len is not None and seq_len != max_context_length:
            raise ConfigError(f"seq_len {seq_len} and max_context_length {max_context_length} disagree")
        seq_len = max_context_length
    if seq_len is None or seq_len < 1:
        raise ConfigError(f"ZephonDataLoader needs seq_len (or max_context_length) >= 1 (got {seq_len})")
    if num_tokens_per_batch is not None:
        if num_tokens_per_batch % seq_len:
            raise ConfigError(
                f"num_tokens_per_batch {num_tokens_per_batch} is not a multiple of seq_len {seq_len}: "
                "every row of a batch holds exactly seq_len tokens"
            )
        rows = num_tokens_per_batch // seq_len
        if local_batch_size is not None and local_batch_size != rows:
            raise ConfigError(
                f"local_batch_size {local_batch_size} and num_tokens_per_batch {num_tokens_per_batch} "
                f"(= {rows} rows of {seq_len}) disagree"
            )
        local_batch_size = rows
    if local_batch_size is None or local_batch_size < 1:
        raise ConfigError(
            f"ZephonDataLoader needs local_batch_size (or num_tokens_per_batch) >= 1 (got {local_batch_size})"
        )
    return seq_len, local_batch_size


def check_tokenizer(tokenizer: Any, manifests: Sequence[tuple[str, Any]]) -> None:
    """Refuse a TorchTitan tokenizer that did not produce the datasets.

    Compares the vocabulary size (``get_vocab_size()``) and the EOS id
    (``eos_id``, when the tokenizer knows it) with each manifest's tokenizer.

    Args:
        tokenizer: a TorchTitan ``BaseTokenizer`` (or anything with
            ``get_vocab_size()`` and ``eos_id``).
        manifests: ``(url, Manifest)`` per dataset.

    Raises:
        TokenizerError: naming the dataset and both values.
    """
    vocab_size = tokenizer.get_vocab_size() if hasattr(tokenizer, "get_vocab_size") else None
    eos_id = getattr(tokenizer, "eos_id", None)
    for url, manifest in manifests:
        info = manifest.tokenizer
        if vocab_size is not None and int(vocab_size) != info.vocab_size:
            raise TokenizerError(
                f"dataset {url}: written with tokenizer {info.name!r} of vocab size {info.vocab_size}, "
                f"but the trainer's tokenizer has vocab size {vocab_size}"
            )
        if eos_id is not None and int(eos_id) != info.eos_id:
            raise TokenizerError(
                f"dataset {url}: written with tokenizer {info.name!r} whose EOS id is {info.eos_id}, "
                f"but the trainer's tokenizer has EOS id {eos_id}"
            )
