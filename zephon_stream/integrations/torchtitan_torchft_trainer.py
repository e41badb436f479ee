"""The import path of job configs written before the TorchTitan integration
became a package: ``zephon_stream.integrations.torchtitan.torchft_trainer`` holds the code."""

from zephon_stream.integrations.torchtitan.torchft_trainer import ZephonFTTrainer  # noqa: F401
