"""Which TorchTitan is installed, and everything its two data APIs do differently.

TorchTitan has two data APIs in use. 0.3.0 (PyPI, the ``torchtitan`` extra)
keeps its loader base in ``torchtitan.components.dataloader``, builds a loader
with ``seq_len`` and ``local_batch_size``, trains ``[B, L]`` batches and tells
a validator's loader ``infinite``. Main (TorchTitan's source tree, which is how
its users run it) keeps it in ``torchtitan.components.data.loader``, builds a
loader with ``max_context_length`` and ``num_tokens_per_batch``, trains 1-D
``[T]`` batches of a token budget (its attention reads documents from
``positions``) and tells a validator's loader ``repeat``. Main's
``assets/version.txt`` still says 0.2.2, so the two are told apart by what the
installed package provides, never by a version string.

This module is the one place of zephon_stream that knows both: it imports
TorchTitan (``titan_module``) and holds :data:`TITAN`, the API found; the rest
of the integration asks it. A third API changes this module alone.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import types
from dataclasses import dataclass
from typing import Any

__all__ = ["INSTALL_HINT", "TITAN", "TitanAPI", "titan_module"]

INSTALL_HINT = "pip install 'zephon-stream[torchtitan]'"

NEEDED_BY = "zephon_stream.integrations.torchtitan"


def titan_module(name: str, *, needed_by: str = NEEDED_BY) -> types.ModuleType:
    """TorchTitan's module ``name`` (``"torchtitan.trainer"``).

    Raises:
        ModuleNotFoundError: TorchTitan, or a package it needs (torchdata for
            0.3.0, grain for main), is missing, naming ``needed_by`` and what
            to install. Any other import failure is a real bug and surfaces as is.
    """
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        missing = (exc.name or "").split(".")[0]
        if missing not in ("torchtitan", "torchdata", "grain"):
            raise
        hint = INSTALL_HINT if missing != "grain" else "pip install 'grain==0.2.18' (TorchTitan main's data pipeline)"
        raise ModuleNotFoundError(
            f"{needed_by} needs TorchTitan ({exc.name} is not installed): {hint}", name=exc.name
        ) from exc


@dataclass(frozen=True)
class TitanAPI:
    """What one TorchTitan data API names and expects.

    Attributes:
        name: ``"0.3.0"`` or ``"main"``.
        loader_module: the module holding ``BaseDataLoader`` and
            ``DataloaderExhaustedError``.
        checkpoint_module: the module holding ``CheckpointManager``.
        repeat_field: the loader config's field a validator sets to say
            whether a pass repeats (``infinite`` on 0.3.0, ``repeat`` on main).
        flat_batches: batches are 1-D ``[T]`` (main) rather than ``[B, L]``.
        pp_microbatches_attr: the trainer's count of pipeline microbatches.
        batch_flag: the job-config flag that sets the tokens or rows each dp
            rank takes per microbatch (what a relaunch changes).
    """

    name: str
    loader_module: str
    checkpoint_module: str
    repeat_field: str
    flat_batches: bool
    pp_microbatches_attr: str
    batch_flag: str

    @property
    def base_loader(self) -> type:
        """TorchTitan's ``BaseDataLoader``."""
        return titan_module(self.loader_module).BaseDataLoader

    @property
    def exhausted_error(self) -> type:
        """TorchTitan's ``DataloaderExhaustedError`` (its trainer stops on it)."""
        return titan_module(self.loader_module).DataloaderExhaustedError

    def repeats(self, config: Any) -> bool:
        """Whether a loader config asks for passes that repeat."""
        return bool(getattr(config, self.repeat_field))

    @property
    def batch_layout(self) -> str:
        """The ``StreamingLoader`` batch layout this API trains: ``"tokens"``
        (1-D, the rows end to end) where batches are flat, else ``"rows"``."""
        return "tokens" if self.flat_batches else "rows"

    def batch_flag_value(self, *, rows: int, seq_len: int) -> str:
        """``--flag value`` that gives each dp rank ``rows`` rows of ``seq_len`` per microbatch."""
        return f"{self.batch_flag} {rows * seq_len if self.flat_batches else rows}"

    def loader_keywords(self, training: Any) -> dict[str, int]:
        """The shape keywords the trainer passes a loader's ``build``, from a
        job's ``training`` config (no pipeline parallelism)."""
        if self.flat_batches:
            return {
                "max_context_length": training.max_context_length,
                "num_tokens_per_batch": training.num_tokens_per_microbatch_per_dp_rank,
            }
        return {"seq_len": training.seq_len, "local_batch_size": training.local_batch_size}

    def pp_microbatches(self, trainer: Any) -> int:
        """The trainer's pipeline microbatches per gradient-accumulation step."""
        return int(getattr(trainer, self.pp_microbatches_attr))

    def loader_config_base(self, *, repeat: bool) -> type:
        """``BaseDataLoader.Config`` with the fields every loader here reads.

        Main's base config has no fields; 0.3.0's has ``dataset`` and
        ``dataset_path``. The base returned has ``dataset_path`` and the
        repeat flag under this API's name, defaulting to ``repeat``.
        """
        base = self.base_loader.Config
        have = {f.name for f in dataclasses.fields(base)}
        annotations: dict[str, Any] = {}
        namespace: dict[str, Any] = {"__annotations__": annotations, "__module__": __name__}
        if "dataset_path" not in have:
            annotations["dataset_path"] = str | None
            namespace["dataset_path"] = None
        annotations[self.repeat_field] = bool
        namespace[self.repeat_field] = repeat
        cls = type("TitanLoaderConfig", (base,), namespace)
        cls.__doc__ = f"{base.__qualname__} with dataset_path and {self.repeat_field} (TorchTitan {self.name})."
        return dataclass(kw_only=True, slots=True)(cls)


RELEASE = TitanAPI(
    name="0.3.0",
    loader_module="torchtitan.components.dataloader",
    checkpoint_module="torchtitan.components.checkpoint",
    repeat_field="infinite",
    flat_batches=False,
    pp_microbatches_attr="num_pipeline_parallel_microbatches",
    batch_flag="--training.local_batch_size",
)

MAIN = TitanAPI(
    name="main",
    loader_module="torchtitan.components.data.loader",
    checkpoint_module="torchtitan.components.checkpointer",
    repeat_field="repeat",
    flat_batches=True,
    pp_microbatches_attr="num_pp_microbatches",
    batch_flag="--training.num_tokens_per_microbatch_per_dp_rank",
)


def detect() -> TitanAPI:
    """The data API of the installed TorchTitan.

    Raises:
        ModuleNotFoundError: no TorchTitan, a package its data API needs
            (grain, torchdata), or a TorchTitan with neither API: one line
            naming what was found and what is missing.
    """
    for api in (MAIN, RELEASE):
        try:
            titan_module(api.loader_module)
            return api
        except ModuleNotFoundError as exc:
            # Only an absent TorchTitan module means "not this API"; a missing
            # grain or torchdata is the answer, with its install hint.
            if not (exc.name or "").startswith("torchtitan"):
                raise
    try:
        found = importlib.util.find_spec("torchtitan")
    except ModuleNotFoundError:
        found = None
    if found is None:
        raise ModuleNotFoundError(
            f"{NEEDED_BY} needs TorchTitan (torchtitan is not installed): {INSTALL_HINT}", name="torchtitan"
        )
    where = next(iter(found.submodule_search_locations or [found.origin]))
    raise ModuleNotFoundError(
        f"{NEEDED_BY}: the TorchTitan at {where} has neither data API this release knows "
        f"({MAIN.loader_module}, TorchTitan main; {RELEASE.loader_module}, 0.3.0): {INSTALL_HINT}",
        name=RELEASE.loader_module,
    )


TITAN: TitanAPI = detect()
"""The installed TorchTitan's data API."""
