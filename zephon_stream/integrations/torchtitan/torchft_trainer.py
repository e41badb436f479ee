"""``ZephonFTTrainer``: TorchTitan's torchft trainer with the group's
``TorchFTManager`` handed to its ``ZephonFTDataLoader``.

Select it in a TorchTitan job config::

    ZephonFTTrainer.Config(
        ...,
        dataloader=ZephonFTDataLoader.Config(dataset_path="s3://bucket/dataset"),
        checkpoint=ZephonFTCheckpointManager.Config(interval=100),
        optimizer=TorchFTOptimizersContainer.Config(...),
        fault_tolerance=FaultTolerance(enable=True, group_size=4, replica_id=k),
    )

Importing TorchTitan's trainer imports triton (its model package
does); CUDA builds of torch bring it, CPU builds do not.
"""

from __future__ import annotations

from dataclasses import dataclass

from zephon_stream.integrations.torchtitan.api import TITAN, titan_module
from zephon_stream.integrations.torchtitan.torchft import check_titan_ft_config

FaultTolerantTrainer = titan_module("torchtitan.experiments.torchft.trainer", needed_by=__name__).FaultTolerantTrainer

__all__ = ["ZephonFTTrainer"]


class ZephonFTTrainer(FaultTolerantTrainer):
    """``FaultTolerantTrainer`` whose dataloader serves the step's quorum.

    TorchTitan builds the dataloader with its static split before the
    gradient accumulation is known; this binds it right after, with
    ``microbatches`` = gradient accumulation steps x pipeline microbatches
    (the ``next()`` calls of one ``train_step``). ``train_step`` itself is
    TorchTitan's: ``optimizers.zero_grad()`` (torchft's optimizer wrapper
    starts the quorum), then the ``next()`` calls, then backward, allreduce
    and ``optimizers.step()`` (``should_commit``).
    """

    @dataclass(kw_only=True, slots=True)
    class Config(FaultTolerantTrainer.Config):
        pass

    def __init__(self, config: Config) -> None:
        check_titan_ft_config(config)
        FaultTolerantTrainer.__init__(self, config)
        self.dataloader.bind_torchft(
            self.ft_manager, microbatches=self.gradient_accumulation_steps * TITAN.pp_microbatches(self)
        )
