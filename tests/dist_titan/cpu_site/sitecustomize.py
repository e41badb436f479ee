"""CPU stand-ins that let TorchTitan main's own ``Trainer`` run on a CPU build of
torch with gloo, for the tests only (this folder goes first on the workers'
``PYTHONPATH``, so Python imports it at start-up, before TorchTitan).

What each stands in for, and why (none touches the data path):
- ``torchtitan.distributed.minimal_async_ep.kernels``: imports triton, which
  CPU builds of torch lack; nothing the debug model runs calls it.
- ``torchtitan.tools.utils``: sees no accelerator and falls back to "cuda";
  here it sees the CPU, and ``torch.cpu`` answers what the metrics ask of a
  device (name, properties, memory statistics).
- ``torch.distributed.barrier``: TorchTitan passes ``device_ids``, which gloo
  does not take.
- ``torch.distributed.set_timeout``: absent from torch 2.13.0; the private
  setter it wraps is there.
- FSDP's gradient reduce-scatter: TorchTitan turns FSDP's division off and
  FSDP then asks for PREMUL_SUM, which gloo lacks; a plain sum instead (the
  trainer divides by the global token count itself).
"""

import importlib.abc
import importlib.machinery
import sys
import types

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d

_kernels = types.ModuleType("torchtitan.distributed.minimal_async_ep.kernels")


def _triton_kernel(name: str):
    if name.startswith("__"):
        raise AttributeError(name)

    def kernel(*args, **kwargs):
        raise RuntimeError(f"{name} is a triton kernel: not on a CPU-only machine")

    return kernel


_kernels.__getattr__ = _triton_kernel
sys.modules[_kernels.__name__] = _kernels

if not hasattr(dist, "set_timeout"):
    dist.set_timeout = lambda timeout, group=None: distributed_c10d._set_pg_timeout(timeout, group)

_barrier = dist.barrier


def _barrier_without_devices(group=None, async_op=False, device_ids=None):
    return _barrier(group=group, async_op=async_op)


dist.barrier = _barrier_without_devices


class _CpuProperties:
    name = "cpu"
    total_memory = 1 << 34


_MEMORY = {
    "active_bytes.all.peak": 0,
    "active_bytes.all.current": 0,
    "reserved_bytes.all.peak": 0,
    "num_alloc_retries": 0,
    "num_ooms": 0,
}
torch.cpu.get_device_name = lambda device=None: "cpu"
torch.cpu.get_device_properties = lambda device=None: _CpuProperties()
torch.cpu.reset_peak_memory_stats = lambda device=None: None
torch.cpu.empty_cache = lambda: None
torch.cpu.memory_stats = lambda device=None: dict(_MEMORY)


def _on_the_cpu(module):
    module.get_device_info = lambda: ("cpu", torch.cpu)
    module.device_type, module.device_module = "cpu", torch.cpu


def _plain_sum_reduction(module):
    disable = module.disable_fsdp_gradient_division

    def disable_division_and_sum(model):
        disable(model)
        for sub in model.modules():
            if isinstance(sub, module.FSDPModule):
                sub.set_force_sum_reduction_for_comms(True)

    module.disable_fsdp_gradient_division = disable_division_and_sum


AFTER_IMPORT = {"torchtitan.tools.utils": _on_the_cpu, "torchtitan.distributed.fsdp": _plain_sum_reduction}


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs ``AFTER_IMPORT[name]`` on a module right after its own code ran,
    before any other module takes names from it."""

    def find_spec(self, name, path=None, target=None):
        if name not in AFTER_IMPORT:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None:
            return None
        exec_module = spec.loader.exec_module

        def run(module):
            exec_module(module)
            AFTER_IMPORT[name](module)

        spec.loader.exec_module = run
        return spec


sys.meta_path.insert(0, _AfterImport())
