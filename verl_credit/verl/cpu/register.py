"""The CPU platform's registration, imported first by ``verl_credit.verl.plugin`` (the ``verl.plugins``
entry point, loaded on every ``import verl``).

Does nothing unless ``VERL_PLATFORM=cpu``. Then: registers the CPU platform, applies the
process-group patches, and selects verl's FSDP engine: engines are registered for the devices
``cuda``/``npu`` only (``verl/workers/engine/fsdp/transformer_impl.py:1143,1594``), and
``EngineRegistry.get_engine_cls`` honours ``VERL_ENGINE_DEVICE`` (``verl/workers/engine/base.py:405-409``).
"""

from __future__ import annotations

import os
import sys
import traceback

from verl_credit.verl.cpu import enabled

if enabled():
    try:
        from verl_credit.verl.cpu import (
            cpu_platform,  # noqa: F401  (registers "cpu")
            patches,
        )

        patches.apply()
        os.environ.setdefault("VERL_ENGINE_DEVICE", "cuda")
    except BaseException:
        # verl swallows plugin load errors at DEBUG level: say it loudly, then fail
        print(
            f"[verl_credit] ERROR: the CPU platform failed to register (pid {os.getpid()}):\n" + traceback.format_exc(),
            file=sys.stderr,
            flush=True,
        )
        raise
