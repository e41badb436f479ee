"""The import path of job configs written before the TorchTitan integration
became a package: ``zephon_stream.integrations.torchtitan.eval`` holds the code."""

from zephon_stream.integrations.torchtitan.eval import ZephonEvalDataLoader  # noqa: F401
