"""verl's platform plugin for the CPU (selected with ``VERL_PLATFORM=cpu``).

Without it verl 0.9.1 falls back to CUDA on a machine without an accelerator
(``verl/plugin/platform/platform_manager.py:83-117``) and ``auto_set_device`` rewrites
``trainer.device=cpu`` to ``cuda`` (``verl/utils/device.py:151-166``).
"""

from __future__ import annotations

import os
import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from verl.plugin.platform.platform_base import PlatformBase
from verl.plugin.platform.platform_manager import PlatformRegistry

from verl_credit.verl.cpu import CPU_PLATFORM

__all__ = ["CPU_DEVICE_MODULE", "CpuDeviceModule", "PlatformCPU"]


def _noop(*args: Any, **kwargs: Any) -> None:
    return None


def _available_memory() -> tuple[int, int]:
    import psutil

    memory = psutil.virtual_memory()
    return memory.available, memory.total


class CpuDeviceModule(types.ModuleType):
    """Stands in for ``torch.cuda`` where verl calls its device module: ``torch.cpu`` where it has
    the function, CPU answers for the rest, no-ops for what has no CPU meaning (streams, events)."""

    _SPECIAL: dict[str, Callable[..., Any]] = {  # noqa: RUF012
        "memory_allocated": lambda *a, **k: 0,
        "memory_reserved": lambda *a, **k: 0,
        "max_memory_allocated": lambda *a, **k: 0,
        "max_memory_reserved": lambda *a, **k: 0,
        "memory_stats": lambda *a, **k: {},
        "mem_get_info": lambda *a, **k: _available_memory(),
        "get_rng_state": lambda *a, **k: torch.get_rng_state(),
        "set_rng_state": lambda state, *a, **k: torch.set_rng_state(state),
        "manual_seed": lambda seed: torch.manual_seed(seed),
        "manual_seed_all": lambda seed: torch.manual_seed(seed),
        "is_available": lambda: True,
        "current_device": lambda: 0,
        "device_count": lambda: 1,
        # verl/utils/flops_counter.py:77-85 tests `key in device_name`: None would raise TypeError
        "get_device_name": lambda *a, **k: "CPU",
    }

    def __init__(self) -> None:
        super().__init__("verl_credit_cpu_device")

    def __getattr__(self, name: str) -> Any:
        if name in self._SPECIAL:
            return self._SPECIAL[name]
        if hasattr(torch.cpu, name):
            return getattr(torch.cpu, name)
        return _noop


CPU_DEVICE_MODULE = CpuDeviceModule()


@PlatformRegistry.register(platform=CPU_PLATFORM)
class PlatformCPU(PlatformBase):
    """Device ``cpu``, collective backend ``gloo``; Ray schedules workers on logical GPUs."""

    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self) -> types.ModuleType:
        return CPU_DEVICE_MODULE

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check: bool = False) -> bool:
        return os.environ.get("VERL_PLATFORM", "").strip().lower() == CPU_PLATFORM

    def current_device(self) -> str:
        # verl passes get_device_id() straight to .to(device=...) / torch.device(...)
        # (verl/utils/fsdp_utils.py:507, engine/fsdp/transformer_impl.py:441): an int would mean
        # "accelerator 0".
        return "cpu"

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: Any) -> None:
        return None

    def synchronize(self, device_index: Any = None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def get_device_capability(self, device_index: int = 0) -> tuple[None, None]:
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        # Ray sets it for actors holding (logical) GPUs; CPU torch and vLLM-CPU ignore it.
        return "CUDA_VISIBLE_DEVICES"

    @contextmanager
    def nvtx_range(self, msg: str) -> Iterator[None]:
        yield

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def ray_resource_name(self) -> str:
        # verl's ResourcePoolManager knows only GPU/NPU (verl/single_controller/ray/base.py:208-210,
        # :230): the run starts Ray with `ray_init.num_gpus=N` logical GPUs standing for CPU slots.
        return "GPU"

    def ray_noset_envvars(self) -> list[str]:
        return ["RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"]

    def is_ipc_supported(self) -> bool:
        return False

    def rollout_env_vars(self) -> dict[str, str]:
        return {"VLLM_TARGET_DEVICE": "cpu"}

    def cudart(self) -> None:
        return None
