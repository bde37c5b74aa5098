"""verl parquet files of the built-in service world's tasks for the CPU training run.

One row per task: the service environment is built by the credit agent loop from
``extra_info.env`` and the task from ``extra_info.task`` (``{"variant", "seed"}``); the prompt column
holds the opening the environment produces (verl's dataset needs a prompt to tokenize and filter
by length; the agent loop builds its own messages from the environment).

    python -m verl_credit.verl.cpu.data --out DIR --tasks 4 [--val-tasks 16] [--variant refund --seed 0]

Without ``--val-tasks`` the validation file holds the training tasks (the smoke run checks the
machinery, not generalization); with ``--val-tasks M`` it holds the ``M`` tasks that follow the
training ones (task seeds ``N .. N+M-1``), which training never samples.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["service_rows", "write_service_dataset"]

AGENT_NAME = "credit_agent"


def service_rows(specs: Sequence[dict[str, Any]], split: str) -> list[dict[str, Any]]:
    """One verl row per service task spec."""
    from verl_credit.envs.service.tools import SYSTEM_PROMPT
    from verl_credit.envs.service.user import OPENING_MESSAGE

    return [
        {
            "data_source": "service",
            "agent_name": AGENT_NAME,
            "ability": "agent",
            "prompt": [
                {"role": "system", "content": SYSTEM_PROMPT},
                {"role": "user", "content": OPENING_MESSAGE},
            ],
            "reward_model": {"style": "env", "ground_truth": ""},
            "extra_info": {"env": "service", "task": dict(spec), "split": split, "index": index},
        }
        for index, spec in enumerate(specs)
    ]


def write_service_dataset(
    out_dir: str | Path, specs: Sequence[dict[str, Any]], val_specs: Sequence[dict[str, Any]] | None = None
) -> dict[str, str]:
    """``train.parquet`` (``specs``) and ``val.parquet`` (``val_specs``; default: the training
    tasks) in ``out_dir``; returns their paths."""
    import pandas as pd

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {}
    for split, split_specs in (("train", specs), ("val", specs if val_specs is None else val_specs)):
        path = out / f"{split}.parquet"
        pd.DataFrame(service_rows(split_specs, split)).to_parquet(path)
        paths[split] = str(path)
    return paths


def main(argv: list[str] | None = None) -> int:
    from verl_credit.verl.cpu.tiny_policy import service_specs

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--tasks", type=int, default=4)
    parser.add_argument(
        "--val-tasks", type=int, default=0, help="held-out validation tasks (0: validate on the training tasks)"
    )
    parser.add_argument("--variant", default="refund")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.val_tasks < 0:
        parser.error(f"--val-tasks must be >= 0, got {args.val_tasks}")
    every = service_specs(args.tasks + args.val_tasks, variant=args.variant, seed=args.seed)
    specs, held_out = every[: args.tasks], every[args.tasks :]
    print(json.dumps(write_service_dataset(args.out, specs, held_out or None)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
