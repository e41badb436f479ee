"""TorchTitan's validator over a held-out dataset: every sample exactly once per pass.

``ZephonEvalDataLoader`` is a ``BaseDataLoader`` over :class:`zephon_stream.EvalLoader`:
no shuffle, a fixed order whatever the dp degree, the ranks together reading
each sample of the held-out datasets once per pass, and the last step padded
so that every rank takes the same number of steps. Padding rows carry
``labels = -100`` (TorchTitan's ``IGNORE_INDEX``), so the validator's
valid-token count and loss leave them out. Select it as the validator's
dataloader::

    validator=Validator.Config(steps=-1, dataloader=ZephonEvalDataLoader.Config(dataset_path="s3://b/heldout"))

TorchTitan builds the validator's dataloader anew at each validation and sets
its repeat flag (``infinite`` on 0.3.0, ``repeat`` on main) from
``validator.steps``: ``steps=-1`` reads one whole pass; ``steps=N`` reads N
steps, starting another pass when one ends. Unlike TorchTitan main's own
loader, a one-pass validation runs at any dp degree.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from zephon_stream.errors import ConfigError
from zephon_stream.integrations.torchtitan.api import TITAN
from zephon_stream.integrations.torchtitan.base import (
    BaseDataLoader,
    DataloaderExhausted,
    check_tokenizer,
    redacted_config_dict,
    redacted_config_repr,
    titan_shape,
)
from zephon_stream.integrations.torchtitan.batches import titan_batch, titan_layout
from zephon_stream.integrations.torchtitan.config import parse_stream_spec, refuse_packing_outputs_on_flat_batches
from zephon_stream.loader import PackingSpec

__all__ = ["ZephonEvalDataLoader"]


class ZephonEvalDataLoader(BaseDataLoader):
    """One dp rank's rows of an exactly-once pass over held-out datasets.

    Yields ``({"input": ..., "positions": ...}, labels)``, int64 CPU tensors of
    shape ``[local_batch_size, seq_len]`` (TorchTitan main: 1-D, the rows end
    to end); padding rows have all labels -100, and by default so has each
    input EOS (``cross_document_targets``).

    Args:
        config: the loader's :class:`ZephonEvalDataLoader.Config`.
        dp_world_size: data-parallel degree.
        dp_rank: this process's data-parallel rank.
        tokenizer: optional TorchTitan tokenizer, checked against the manifests.
        seq_len: tokens per row (TorchTitan main: ``max_context_length``).
        local_batch_size: rows per step (TorchTitan main: ``num_tokens_per_batch``).
        **kwargs: other trainer keywords, ignored.
    """

    @dataclass(kw_only=True, slots=True)
    class Config(TITAN.loader_config_base(repeat=False)):
        """``ZephonEvalDataLoader``'s configuration: ``dataset_path`` or
        ``streams``, and the repeat flag TorchTitan's validator sets
        (``infinite`` on 0.3.0, ``repeat`` on main): False reads one pass,
        True starts another pass when one ends."""

        streams: list[str] = field(default_factory=list)
        """Held-out datasets read one after another (``"url"`` entries; a
        ``:weight`` suffix is accepted and ignored). Use this or ``dataset_path``."""

        storage_options: dict[str, Any] = field(default_factory=dict)
        """fsspec options (S3 endpoint, keys...); never logged."""

        prefetch_steps: int = 2
        """Steps assembled ahead of the validator."""

        cross_document_targets: str = "ignore"
        """The label of each input EOS: ``"ignore"`` (-100, as the training
        loader's default and TorchTitan's own loader) or ``"predict"``."""

        packing_outputs: bool = False
        """Also put the document outputs in ``input_dict``, as the training
        loader's ``packing_outputs`` does; a padding row is one segment."""

        packing: str = "concat"
        """``"concat"`` or ``"best_fit"``, as the training loader's
        ``packing``: a validation loss compared with the training loss reads
        the same kind of rows."""

        def __post_init__(self) -> None:
            if bool(self.dataset_path) == bool(self.streams):
                raise ConfigError("validator dataloader: set dataset_path or streams (exactly one)")
            for spec in self.streams:
                parse_stream_spec(spec)
            if self.prefetch_steps < 1:
                raise ConfigError(f"validator dataloader.prefetch_steps must be >= 1 (got {self.prefetch_steps})")
            refuse_packing_outputs_on_flat_batches(self.packing_outputs)
            PackingSpec(
                cross_document_targets=self.cross_document_targets, outputs=self.packing_outputs, rows=self.packing
            )

        def to_dict(self) -> dict:
            """The config as TorchTitan logs it, secrets redacted."""
            return redacted_config_dict(self)

        def __repr__(self) -> str:
            return redacted_config_repr(self, "ZephonEvalDataLoader.Config")

    def __init__(
        self,
        config: Config,
        *,
        dp_world_size: int,
        dp_rank: int,
        tokenizer: Any = None,
        seq_len: int | None = None,
        local_batch_size: int | None = None,
        **kwargs: Any,
    ) -> None:
        from zephon_stream.loader import EvalLoader

        self.shape = titan_shape(seq_len, local_batch_size, dict(kwargs))
        self.config = config
        urls = [parse_stream_spec(spec)[0] for spec in config.streams] or [config.dataset_path]
        self._loader = EvalLoader(
            urls,
            seq_len=self.shape.seq_len,
            local_batch_size=self.shape.rows,
            rank=dp_rank,
            world_size=dp_world_size,
            storage_options=dict(config.storage_options) or None,
            prefetch_steps=config.prefetch_steps,
            cross_document_targets=config.cross_document_targets,
            packing_outputs=config.packing_outputs,
            packing=config.packing,
        )
        self._pass: Iterator[dict[str, torch.Tensor]] | None = None
        self.passes = 0
        if tokenizer is not None:
            try:
                check_tokenizer(tokenizer, self._loader.manifests)
            except BaseException:
                self._loader.close()
                raise

    @property
    def eval_loader(self) -> Any:
        """The underlying :class:`zephon_stream.EvalLoader` (``num_samples``, ``num_steps``)."""
        return self._loader

    def __iter__(self) -> Iterator[tuple[dict[str, torch.Tensor], torch.Tensor]]:
        return self

    def __next__(self) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        while True:
            if self._pass is None:
                if self.passes and not TITAN.repeats(self.config):
                    raise DataloaderExhausted(f"validator dataloader: pass {self.passes} over the held-out data ended")
                self._pass = iter(self._loader)
                self.passes += 1
            batch = next(self._pass, None)
            if batch is not None:
                # EvalLoader copies each step's rows out of its ring (its padding
                # rows are rewritten in the copy), so it has no slot tensors to keep
                # 1-D views of; the rows are laid end to end here, a view a key.
                return titan_batch(titan_layout(batch), shape=self.shape, packing_outputs=self.config.packing_outputs)
            self._pass = None

    def state_dict(self) -> dict[str, Any]:
        """Empty: every validation reads its pass from the start."""
        return {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Nothing to restore (see :meth:`state_dict`)."""

    def close(self) -> None:
        """Stop the pass's threads; release stores and the ring (idempotent)."""
        if self._pass is not None:
            self._pass.close()  # type: ignore[attr-defined]
            self._pass = None
        self._loader.close()

    def __enter__(self) -> ZephonEvalDataLoader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
