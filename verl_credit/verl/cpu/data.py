"""verl parquet files of the built-in service world's tasks for the CPU training run.

One row per task: the service environment is built by the credit agent loop from
``extra_info.env`` and the task from ``extra_info.task`` (``{"variant", "seed"}``); the prompt column
holds the opening the environment produces (verl's dataset needs a prompt to tokenize and filter
by length; the agent loop builds its own messages from the environment).

    python -m verl_credit.verl.cpu.data --out DIR --tasks 4 [--variant refund --seed 0]
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


def write_service_dataset(out_dir: str | Path, specs: Sequence[dict[str, Any]]) -> dict[str, str]:
    """``train.parquet`` and ``val.parquet`` (the same tasks: the run checks the machinery, not
    generalization) in ``out_dir``; returns their paths."""
    import pandas as pd

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {}
    for split in ("train", "val"):
        path = out / f"{split}.parquet"
        pd.DataFrame(service_rows(specs, split)).to_parquet(path)
        paths[split] = str(path)
    return paths


def main(argv: list[str] | None = None) -> int:
    from verl_credit.verl.cpu.tiny_policy import service_specs

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--tasks", type=int, default=4)
    parser.add_argument("--variant", default="refund")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    specs = service_specs(args.tasks, variant=args.variant, seed=args.seed)
    print(json.dumps(write_service_dataset(args.out, specs)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
