"""Per-step audit dumps of the credit trainer (``credit.debug.dump_dir``), read back offline.

One ``step_<N>.pt`` per training step (``torch.save`` of plain Python values and CPU tensors):

* ``keys``, ``tags``, ``uids``: per row, as stored in TransferQueue (``{uid}_{session}_{index}``);
* ``rollout_mask`` / ``response_mask``: ``(rows, R)`` masks before and after rollout correction;
* ``token_level_rewards``: ``(rows, R)`` (a session's reward is the sum over its final row);
* ``payloads``: per row, ``extra_fields["credit"]`` (transcript, spans, graph or call graph) or None;
* ``estimator``, ``credit_config`` (the ``CreditConfig`` the step used, as a mapping: the running
  omega when adaptive_omega is on), ``norm_adv_by_std_in_grpo``, ``epsilon``;
* ``trainer_advantages``: what ``_compute_advantage`` wrote; ``actor_advantages``: what the actor
  read from TransferQueue right before its update (the same rows, padded to ``R``);
* ``credit_state``: the trainer's CALL-CREDIT state after the step (adaptive omega).

``python -m verl_credit.verl.cpu.check`` recomputes every row's advantages from these inputs.
"""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Mapping
from typing import Any

import torch

__all__ = ["DUMP_PATTERN", "dump_path", "read_step_dumps", "write_step_dump"]

DUMP_PATTERN = "step_*.pt"


def dump_path(folder: str, step: int) -> str:
    return os.path.join(folder, f"step_{int(step)}.pt")


def write_step_dump(folder: str, step: int, record: Mapping[str, Any]) -> str:
    """Write ``record`` atomically (a reader never sees half a file) and return its path."""
    os.makedirs(folder, exist_ok=True)
    path = dump_path(folder, step)
    partial = f"{path}.partial"
    torch.save(dict(record), partial)
    os.replace(partial, path)
    return path


def read_step_dumps(folder: str) -> list[tuple[int, dict[str, Any]]]:
    """``[(step, record)]`` of every dump in ``folder``, by step."""
    found = []
    for path in glob.glob(os.path.join(folder, DUMP_PATTERN)):
        match = re.fullmatch(r"step_(\d+)\.pt", os.path.basename(path))
        if match:
            found.append((int(match.group(1)), torch.load(path, weights_only=False)))
    return sorted(found, key=lambda item: item[0])
