"""Check the data side of a TorchTitan job on any machine, before it goes to the GPUs.

    python examples/torchtitan/check_job.py --module zephon_titan --config llama3_debugmodel_zephon \\
        [--steps 3] [TorchTitan overrides, e.g. --dataloader.dataset_path ./out/ds-bpe]

It parses the job as TorchTitan's own ConfigManager does (this folder is on
the path, so ``--module zephon_titan`` is the example's), builds the trainer's
tokenizer from ``hf_assets_path`` and the job's dataloader as the installed
TorchTitan's trainer builds it (0.3.0: ``seq_len``, ``local_batch_size``;
main: ``max_context_length``, ``num_tokens_per_batch``), as dp rank 0 of 1,
and prints what its first batches hold and the checkpoint entry it saves.
TorchTitan's model package imports triton in one module, which CUDA builds
of torch bring and CPU builds lack; where triton is missing, that module is
stood in for (nothing here runs a kernel).
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import types


def stand_in_for_triton_kernels() -> None:
    """TorchTitan's one triton module, on a machine without triton: a module whose kernels raise when run."""
    name = "torchtitan.distributed.minimal_async_ep.kernels"
    if importlib.util.find_spec("triton") is not None or name in sys.modules:
        return

    def kernel(attribute: str):
        if attribute.startswith("__"):
            raise AttributeError(attribute)

        def run(*args, **kwargs):
            raise RuntimeError(f"{attribute} is a triton kernel: not on a machine without triton")

        return run

    module = types.ModuleType(name)
    module.__getattr__ = kernel
    sys.modules[name] = module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=3, help="batches to take (default 3)")
    args, titan_args = parser.parse_known_args()
    stand_in_for_triton_kernels()
    from torchtitan.config import ConfigManager

    from zephon_stream.integrations.torchtitan import STATE_KEY, TITAN

    config = ConfigManager().parse_args(titan_args)
    keywords = TITAN.loader_keywords(config.training)
    print(f"TorchTitan {TITAN.name}: dataloader.build({', '.join(f'{k}={v}' for k, v in keywords.items())})")
    print(f"  {config.dataloader!r}")
    tokenizer = config.tokenizer.build(tokenizer_path=config.hf_assets_path)
    with config.dataloader.build(dp_world_size=1, dp_rank=0, tokenizer=tokenizer, **keywords) as loader:
        for step, (input_dict, labels) in zip(range(args.steps), loader):
            shapes = ", ".join(f"{key} {tuple(value.shape)}" for key, value in input_dict.items())
            starts = int((input_dict["positions"] == 0).sum())
            print(
                f"step {step}: {shapes}, labels {tuple(labels.shape)}; {int((labels != -100).sum())} tokens "
                f"trained, {starts} positions 0 (a row or a document starts), samples "
                f"{loader.last_sample_positions.tolist()}"
            )
        state = loader.state_dict()
    print(f"checkpoint entry: dataloader.{STATE_KEY} ({len(state[STATE_KEY])} bytes of JSON, equal on every rank)")


if __name__ == "__main__":
    main()
