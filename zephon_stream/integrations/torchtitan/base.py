"""What TorchTitan's loaders here build on: the end of a finite run, the
trainer's shape keywords, configs printed without secrets and the trainer's
tokenizer checked against the datasets.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from zephon_stream.errors import ConfigError, TokenizerError
from zephon_stream.integrations.torchtitan.api import TITAN
from zephon_stream.storage.redact import redact_options

__all__ = [
    "BaseDataLoader",
    "DataloaderExhausted",
    "DataloaderExhaustedError",
    "TitanShape",
    "check_tokenizer",
    "redacted_config_dict",
    "redacted_config_repr",
    "titan_shape",
]

logger = logging.getLogger("zephon_stream.integrations")

BaseDataLoader = TITAN.base_loader
DataloaderExhaustedError = TITAN.exhausted_error


class DataloaderExhausted(DataloaderExhaustedError, StopIteration):
    """The end of a finite run.

    It is TorchTitan's ``DataloaderExhaustedError`` (its trainer stops on it)
    and a ``StopIteration``, so ``for`` loops and TorchTitan's validator, which
    catches ``StopIteration``, end cleanly too. ``ZephonDataLoader`` is a plain
    iterator, not a generator, so PEP 479 does not turn it into a RuntimeError.
    """


def redacted_config_dict(config: Any) -> dict:
    """A loader config's ``to_dict()`` with its storage options redacted.

    The trainer prints this dict and writes it to the dump folder and
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


@dataclass(frozen=True)
class TitanShape:
    """What one ``next()`` of a loader holds on one dp rank.

    Attributes:
        seq_len: tokens per row (TorchTitan main: ``max_context_length``).
        rows: rows per batch (0.3.0: ``local_batch_size``; main:
            ``num_tokens_per_batch // max_context_length``).
        pad_tokens: padding after the rows of a 1-D batch, when main's
            ``num_tokens_per_batch`` is not a multiple of ``max_context_length``.
    """

    seq_len: int
    rows: int
    pad_tokens: int = 0


def titan_shape(seq_len: int | None, local_batch_size: int | None, extra: dict[str, Any]) -> TitanShape:
    """The batch shape from the keywords TorchTitan's trainer passes.

    0.3.0 passes ``seq_len`` and ``local_batch_size``; main passes
    ``max_context_length`` and ``num_tokens_per_batch``. A row keeps its
    identity either way (``seq_len`` tokens of the global order), so a
    batch of main's token budget is ``num_tokens_per_batch // seq_len`` rows;
    what is left over is padding (input 0, labels -100, positions from 0, as
    main's own collator pads), logged once, since those tokens train nothing.
    0.3.0's ``[B, L]`` batches have no room for padding: there it is an error.

    Raises:
        ConfigError: a missing or non-positive size, sizes that disagree, a
            token budget below one row, or padding a ``[B, L]`` batch would need.
    """
    max_context_length = extra.pop("max_context_length", None)
    num_tokens_per_batch = extra.pop("num_tokens_per_batch", None)
    if max_context_length is not None:
        if seq_len is not None and seq_len != max_context_length:
            raise ConfigError(f"seq_len {seq_len} and max_context_length {max_context_length} disagree")
        seq_len = max_context_length
    if seq_len is None or seq_len < 1:
        raise ConfigError(f"ZephonDataLoader needs seq_len (or max_context_length) >= 1 (got {seq_len})")
    pad_tokens = 0
    if num_tokens_per_batch is not None:
        rows, pad_tokens = divmod(num_tokens_per_batch, seq_len)
        if rows < 1:
            raise ConfigError(
                f"num_tokens_per_batch {num_tokens_per_batch} is less than one row of max_context_length {seq_len}"
            )
        if pad_tokens and not TITAN.flat_batches:
            raise ConfigError(
                f"num_tokens_per_batch {num_tokens_per_batch} is not a multiple of seq_len {seq_len}: "
                "every row of a [B, L] batch holds exactly seq_len tokens"
            )
        if local_batch_size is not None and local_batch_size != rows:
            raise ConfigError(
                f"local_batch_size {local_batch_size} and num_tokens_per_batch {num_tokens_per_batch} "
                f"(= {rows} rows of {seq_len}) disagree"
            )
        local_batch_size = rows
        if pad_tokens:
            logger.warning(
                "num_tokens_per_batch %d is not a multiple of max_context_length %d: each batch holds %d rows and "
                "%d padding tokens (labels -100, %.1f%% of the batch trains nothing); a multiple wastes none",
                num_tokens_per_batch,
                seq_len,
                rows,
                pad_tokens,
                100 * pad_tokens / num_tokens_per_batch,
            )
    if local_batch_size is None or local_batch_size < 1:
        raise ConfigError(
            f"ZephonDataLoader needs local_batch_size (or num_tokens_per_batch) >= 1 (got {local_batch_size})"
        )
    return TitanShape(seq_len=seq_len, rows=local_batch_size, pad_tokens=pad_tokens)


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
