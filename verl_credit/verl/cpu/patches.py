"""Process-group fixes for verl 0.9.1 on the CPU platform (applied by :mod:`register`).

``verl/utils/distributed.py:63`` and ``:88-93`` build the backend string
``f"cpu:gloo,{device}:{backend}"``, which on the CPU platform is ``cpu:gloo,cpu:gloo``; torch
rejects it ("Duplicate device type cpu", ``torch/distributed/distributed_c10d.py:459``). Both
initializers are rebound to ``cpu:gloo``, including the names other verl modules imported with
``from verl.utils.distributed import ...``.
"""

from __future__ import annotations

import functools
import os
import sys
from datetime import timedelta
from typing import Any

__all__ = ["CPU_BACKEND", "apply"]

CPU_BACKEND = "cpu:gloo"
_applied = False


def _rebind(module_name: str, attribute: str, replacement: Any) -> Any:
    """Set ``module.attribute`` and every already-imported binding of the same object."""
    module = sys.modules[module_name]
    original = getattr(module, attribute)
    setattr(module, attribute, replacement)
    for other in list(sys.modules.values()):
        # the module's own namespace only: getattr on a lazy module (transformers') would import
        namespace = getattr(other, "__dict__", None)
        if isinstance(namespace, dict) and namespace.get(attribute) is original:
            setattr(other, attribute, replacement)
    return original


def _patch_process_groups() -> None:
    import verl.utils.distributed as distributed

    original_ray = distributed.initialize_global_process_group_ray

    @functools.wraps(original_ray)
    def initialize_global_process_group_ray(timeout_second: Any = None, backend: Any = None) -> Any:
        return original_ray(timeout_second=timeout_second, backend=backend or CPU_BACKEND)

    _rebind("verl.utils.distributed", "initialize_global_process_group_ray", initialize_global_process_group_ray)

    original = distributed.initialize_global_process_group

    @functools.wraps(original)
    def initialize_global_process_group(timeout_second: int = 36000) -> tuple[int, int, int]:
        import torch.distributed as dist

        dist.init_process_group(
            backend=CPU_BACKEND,
            timeout=timedelta(seconds=timeout_second),
            init_method=os.environ.get("DIST_INIT_METHOD", None),
        )
        return int(os.environ["LOCAL_RANK"]), int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])

    _rebind("verl.utils.distributed", "initialize_global_process_group", initialize_global_process_group)


def apply() -> None:
    """Idempotent; only :mod:`register` calls it, and only with ``VERL_PLATFORM=cpu``."""
    global _applied
    if _applied:
        return
    _applied = True
    _patch_process_groups()
