"""The import path of job configs written before the TorchTitan integration
became a package: ``zephon_stream.integrations.torchtitan.torchft`` holds the code."""

from zephon_stream.integrations.torchtitan.torchft import (  # noqa: F401
    ZephonFTCheckpointManager,
    ZephonFTDataLoader,
    check_titan_ft_config,
)
