"""tau2-bench evaluation: pass^k from per-trial results, and the runner that produces them.

Metric (tau2 ``metrics/agent_metrics.py``, from tau-bench, arXiv 2406.12045): a trial succeeds when
its reward is 1 (within 1e-6); for a task with ``n`` trials of which ``c`` succeeded,

    pass^k(task) = C(c, k) / C(n, k)          (the chance that k trials drawn without replacement all succeed)

``pass^k(domain)`` is the mean over the domain's tasks, and the paper's headline number is the
domain-macro mean ``pass^k = mean over domains of pass^k(domain)`` (airline, retail, telecom),
reported as a percentage. ``pass^1`` is the mean success rate. As in tau2, ``k`` runs up to the
smallest number of trials any task has.

Command line::

    python -m verl_credit.envs.tau2.evaluate run --policy-base-url http://HOST:8000/v1 --policy-model policy \
        --user-base-url http://HOST:8000/v1 --user-model Qwen/Qwen3-32B --split test --trials 4 --out results.jsonl
    python -m verl_credit.envs.tau2.evaluate score results.jsonl [--json metrics.json]

The simulated user of an evaluation is its own: ``--user-base-url`` / ``--user-model`` name any
OpenAI-compatible server, and it should be held out -- a policy trained against one user model
can learn that model's habits (what it accepts, how it phrases a confirmation), which inflates
pass^k measured against the same user. ``--training-user-base-url`` / ``--training-user-model``
name the user the policy was trained against: an evaluation user at one of its URLs is refused
unless ``--same-user`` is given (URLs compared after normalization: scheme and host lowercased,
``localhost`` = ``127.0.0.1``, default ports and trailing slashes dropped). Both users are
recorded in every result line (``user``, ``training_user``, ``same_user``) and in the metrics
JSON (``users``); a results file holding trials of another evaluation user is refused on resume.

Episodes follow training: ``--max-parallel-calls`` (default 16) is verl's
``multi_turn.max_parallel_calls`` (calls past it in one assistant turn are dropped, counted in
``dropped_tool_calls``), ``--max-steps`` / ``--max-errors`` tau2's limits (defaults 200 / 10, as
``tau2 run`` and the training environment). The summary after the table counts terminations,
dropped calls and simulated-user replies read from ``reasoning_content``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from verl_credit.envs.tau2.runner import DEFAULT_MAX_PARALLEL_CALLS
from verl_credit.envs.tau2.termination import DEFAULT_MAX_ERRORS, DEFAULT_MAX_STEPS

__all__ = [
    "PassHatK",
    "UserSetup",
    "check_held_out_user",
    "compute_pass_hat_k",
    "episode_summary",
    "is_success",
    "main",
    "normalize_url",
    "pass_hat_k",
]

SUCCESS_TOLERANCE = 1e-6


def is_success(reward: float) -> bool:
    """tau2's ``is_successful``: reward within 1e-6 of 1."""
    return (1 - SUCCESS_TOLERANCE) <= float(reward) <= (1 + SUCCESS_TOLERANCE)


def pass_hat_k(num_trials: int, num_successes: int, k: int) -> float:
    """``C(c, k) / C(n, k)`` for one task with ``n`` trials and ``c`` successes."""
    if not 0 <= num_successes <= num_trials:
        raise ValueError(f"successes must be in [0, trials], got {num_successes} of {num_trials}")
    if not 1 <= k <= num_trials:
        raise ValueError(f"k must be in [1, trials={num_trials}], got {k}")
    return math.comb(num_successes, k) / math.comb(num_trials, k)


@dataclass(frozen=True)
class PassHatK:
    """pass^k per domain and domain-macro, for k = 1..max_k (fractions in [0, 1])."""

    max_k: int
    per_domain: dict[str, dict[int, float]]
    """``{domain: {k: mean over the domain's tasks of pass^k}}``."""
    macro: dict[int, float]
    """``{k: mean over domains of per_domain[domain][k]}`` (the paper's number)."""
    micro: dict[int, float]
    """``{k: mean over all tasks}`` (tau2's single-domain ``pass_hat_k``)."""
    tasks_per_domain: dict[str, int]
    trials_per_task: dict[str, int]
    """``{domain: number of trials per task}`` (the minimum, if tasks differ)."""
    avg_reward: float

    def to_json(self) -> dict[str, Any]:
        return {
            "max_k": self.max_k,
            "macro": {f"pass^{k}": v for k, v in self.macro.items()},
            "micro": {f"pass^{k}": v for k, v in self.micro.items()},
            "per_domain": {d: {f"pass^{k}": v for k, v in ks.items()} for d, ks in self.per_domain.items()},
            "tasks_per_domain": self.tasks_per_domain,
            "trials_per_task": self.trials_per_task,
            "avg_reward": self.avg_reward,
        }


def compute_pass_hat_k(records: Iterable[Mapping[str, Any]], max_k: int | None = None) -> PassHatK:
    """pass^k from per-trial records ``{"domain", "task_id", "reward"}`` (one record per trial).

    ``max_k`` defaults to the smallest number of trials any task has (tau2 does the same); asking
    for more than that raises ``ValueError``.
    """
    successes: dict[tuple[str, str], list[bool]] = defaultdict(list)
    rewards: list[float] = []
    for number, record in enumerate(records):
        for key in ("domain", "task_id", "reward"):
            if key not in record:
                raise ValueError(f"result record {number} has no {key!r}")
        successes[(str(record["domain"]), str(record["task_id"]))].append(is_success(record["reward"]))
        rewards.append(float(record["reward"]))
    if not successes:
        raise ValueError("no result records")
    min_trials = min(len(trials) for trials in successes.values())
    k_top = min_trials if max_k is None else int(max_k)
    if not 1 <= k_top <= min_trials:
        raise ValueError(f"max_k must be in [1, {min_trials}] (the fewest trials of any task), got {max_k}")

    by_domain: dict[str, list[list[bool]]] = defaultdict(list)
    for (domain, _task_id), trials in sorted(successes.items()):
        by_domain[domain].append(trials)
    per_domain = {
        domain: {
            k: sum(pass_hat_k(len(trials), sum(trials), k) for trials in tasks) / len(tasks)
            for k in range(1, k_top + 1)
        }
        for domain, tasks in by_domain.items()
    }
    all_tasks = [trials for tasks in by_domain.values() for trials in tasks]
    micro = {k: sum(pass_hat_k(len(t), sum(t), k) for t in all_tasks) / len(all_tasks) for k in range(1, k_top + 1)}
    macro = {k: sum(values[k] for values in per_domain.values()) / len(per_domain) for k in range(1, k_top + 1)}
    return PassHatK(
        max_k=k_top,
        per_domain=per_domain,
        macro=macro,
        micro=micro,
        tasks_per_domain={domain: len(tasks) for domain, tasks in by_domain.items()},
        trials_per_task={domain: min(len(t) for t in tasks) for domain, tasks in by_domain.items()},
        avg_reward=sum(rewards) / len(rewards),
    )


def format_table(result: PassHatK) -> str:
    """Plain-text table: one row per domain and a macro row, pass^k in percent."""
    ks = range(1, result.max_k + 1)
    header = "domain     tasks  " + "  ".join(f"pass^{k:<3d}" for k in ks)
    lines = [header]
    for domain, values in sorted(result.per_domain.items()):
        cells = "  ".join(f"{100 * values[k]:8.2f}" for k in ks)
        lines.append(f"{domain:<10} {result.tasks_per_domain[domain]:5d}  {cells}")
    lines.append(
        f"{'macro':<10} {sum(result.tasks_per_domain.values()):5d}  "
        + "  ".join(f"{100 * result.macro[k]:8.2f}" for k in ks)
    )
    return "\n".join(lines)


def episode_summary(records: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Counts over the result records that the reward alone does not show: how episodes ended,
    tool calls dropped past ``max_parallel_calls``, user replies taken from the reasoning field."""
    records = list(records)
    dropped = [int(r.get("dropped_tool_calls") or 0) for r in records]
    return {
        "episodes": len(records),
        "terminations": dict(sorted(Counter(str(r.get("termination")) for r in records).items())),
        "dropped_tool_calls": sum(dropped),
        "episodes_with_dropped_tool_calls": sum(1 for d in dropped if d),
        "user_reasoning_fallbacks": sum(int(r.get("user_reasoning_fallbacks") or 0) for r in records),
    }


# -- command line --------------------------------------------------------------------------------


# -- the held-out user -----------------------------------------------------------------------------

_DEFAULT_PORTS = {"http": 80, "https": 443}
_LOOPBACK = {"localhost", "127.0.0.1", "::1", "[::1]", "0.0.0.0"}


def normalize_url(url: str) -> str:
    """``scheme://host:port/path`` with scheme and host lowercased, loopback names as
    ``127.0.0.1``, the port explicit and trailing slashes dropped (two spellings of one server
    compare equal)."""
    parts = urlsplit(url.strip())
    scheme = (parts.scheme or "http").lower()
    host = (parts.hostname or "").lower()
    host = "127.0.0.1" if host in _LOOPBACK else host
    port = parts.port or _DEFAULT_PORTS.get(scheme)
    return f"{scheme}://{host}:{port}{parts.path.rstrip('/')}"


@dataclass(frozen=True)
class UserSetup:
    """The evaluation's simulated user and the one the policy was trained against."""

    base_urls: tuple[str, ...]
    model: str
    training_base_urls: tuple[str, ...] = ()
    training_model: str | None = None
    same_user: bool = False
    """``--same-user``: evaluating against the training user on purpose."""

    def shared_urls(self) -> list[str]:
        training = {normalize_url(url) for url in self.training_base_urls}
        return [url for url in self.base_urls if normalize_url(url) in training]

    def to_json(self) -> dict[str, Any]:
        return {
            "user": {"base_urls": list(self.base_urls), "model": self.model},
            "training_user": (
                {"base_urls": list(self.training_base_urls), "model": self.training_model}
                if self.training_base_urls or self.training_model
                else None
            ),
            "same_user": self.same_user or bool(self.shared_urls()),
        }


def check_held_out_user(users: UserSetup) -> list[str]:
    """Raise ``ValueError`` when an evaluation user URL is one of the training user's (unless
    ``same_user``); return warnings (no training user given, or the same model behind another URL)."""
    shared = users.shared_urls()
    if shared and not users.same_user:
        raise ValueError(
            f"the evaluation user {shared[0]} is the training user ({', '.join(users.training_base_urls)}): "
            "evaluate against a held-out user (another server and model: --user-base-url, --user-model), "
            "or pass --same-user to measure against the training user on purpose"
        )
    warnings = []
    if not users.training_base_urls:
        warnings.append("no --training-user-base-url: cannot check that the evaluation user is held out")
    elif not shared and users.training_model is not None and users.training_model == users.model:
        warnings.append(
            f"the evaluation user serves the training user's model ({users.model}) behind another URL: "
            "not a held-out user model"
        )
    return warnings


def _check_resumed_user(records: list[dict[str, Any]], users: UserSetup, path: Path) -> None:
    """A results file holds the trials of one evaluation user: resuming with another is refused."""
    expected = users.to_json()["user"]
    for line, record in enumerate(records, start=1):
        found = record.get("user")
        if found is not None and found != expected:
            raise ValueError(
                f"{path}:{line}: user: the trials were played against {found}, not {expected}; "
                "write the new evaluation to another --out"
            )


def _read_records(path: Path) -> list[dict[str, Any]]:
    records = []
    with path.open() as handle:
        for line_number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as error:
                raise ValueError(f"{path}:{line_number}: not JSON ({error.msg})") from None
    return records


def _metrics(records: list[dict[str, Any]], max_k: int | None = None) -> dict[str, Any]:
    """pass^k (printed as a table) plus :func:`episode_summary` (printed as one JSON line)."""
    result = compute_pass_hat_k(records, max_k=max_k)
    summary = episode_summary(records)
    print(format_table(result))
    print(json.dumps({"summary": summary}))
    metrics = {**result.to_json(), "summary": summary}
    recorded = next((r for r in records if "user" in r), None)
    if recorded is not None:  # trials played by this module carry both users
        metrics["users"] = {key: recorded.get(key) for key in ("user", "training_user", "same_user")}
    return metrics


def _score(args: argparse.Namespace) -> int:
    metrics = _metrics(_read_records(Path(args.results)), max_k=args.k)
    if args.json:
        Path(args.json).write_text(json.dumps(metrics, indent=2) + "\n")
    return 0


def _episodes(args: argparse.Namespace) -> list[dict[str, Any]]:
    """``[{"domain", "task_id", "trial"}]`` from ``--data`` (prepared parquet) or the tau2 ``--split``."""
    if args.data:
        import pandas as pd

        frame = pd.read_parquet(args.data)
        tasks = [(str(info["domain"]), str(info["task_id"])) for info in frame["extra_info"]]
        tasks = [t for t in tasks if t[0] in args.domains]
    else:
        from verl_credit.envs.tau2.domains import load_split

        tasks = [(domain, task.id) for domain in args.domains for task in load_split(domain, args.split)]
    return [{"domain": d, "task_id": t, "trial": trial} for d, t in tasks for trial in range(args.trials)]


async def _run_all(args: argparse.Namespace, episodes: list[dict[str, Any]], users: UserSetup) -> None:
    from verl_credit.envs.tau2.env import Tau2Environment
    from verl_credit.envs.tau2.runner import PolicyClient, PolicyConfig, run_episode
    from verl_credit.openai_chat import make_async_client

    policy_config = PolicyConfig(
        base_url=args.policy_base_url,
        model=args.policy_model,
        temperature=args.temperature,
        max_tokens=args.max_tokens,
    )
    semaphore = asyncio.Semaphore(args.concurrency)
    out = Path(args.out)
    lock = asyncio.Lock()
    # in-cluster endpoints: no HTTP(S)_PROXY from the environment unless --trust-env
    async with make_async_client(timeout=policy_config.timeout_s, trust_env=args.trust_env) as client:
        policy = PolicyClient(policy_config, client)

        async def one(episode: dict[str, Any]) -> None:
            async with semaphore:
                seed = args.seed + episode["trial"]
                user = {
                    "base_urls": args.user_base_url,
                    "model": args.user_model,
                    "seed": seed,
                    "trust_env": args.trust_env,
                }
                env = Tau2Environment(user=user, max_steps=args.max_steps, max_errors=args.max_errors)
                try:
                    result = await run_episode(
                        env,
                        episode,
                        policy,
                        trial=episode["trial"],
                        max_turns=args.max_turns,
                        seed=seed,
                        max_parallel_calls=args.max_parallel_calls,
                    )
                finally:
                    await env.close()
                record = {**result.to_record(with_messages=args.save_messages), **users.to_json()}
                async with lock:
                    with out.open("a") as handle:
                        handle.write(json.dumps(record) + "\n")

        await asyncio.gather(*(one(episode) for episode in episodes))


def _run(args: argparse.Namespace) -> int:
    args.domains = [d for d in args.domains.split(",") if d]
    users = UserSetup(
        base_urls=tuple(args.user_base_url),
        model=args.user_model,
        training_base_urls=tuple(args.training_user_base_url or ()),
        training_model=args.training_user_model,
        same_user=args.same_user,
    )
    for warning in check_held_out_user(users):
        print(f"evaluate: warning: {warning}", file=sys.stderr)
    episodes = _episodes(args)
    out = Path(args.out)
    done: set[tuple[str, str, int]] = set()
    if out.exists():
        existing = _read_records(out)
        _check_resumed_user(existing, users, out)
        done = {(str(r["domain"]), str(r["task_id"]), int(r["trial"])) for r in existing}
    todo = [e for e in episodes if (e["domain"], e["task_id"], e["trial"]) not in done]
    plan = {
        "episodes": len(episodes),
        "todo": len(todo),
        "tasks_per_domain": {d: len({e["task_id"] for e in episodes if e["domain"] == d}) for d in args.domains},
        "trials": args.trials,
        "max_turns": args.max_turns,
        "max_parallel_calls": args.max_parallel_calls,
        "max_steps": args.max_steps,
        "max_errors": args.max_errors,
        "policy": {"base_url": args.policy_base_url, "model": args.policy_model, "temperature": args.temperature},
        **users.to_json(),
        "out": str(out),
    }
    print(json.dumps(plan), flush=True)
    if args.dry_run:
        return 0
    out.parent.mkdir(parents=True, exist_ok=True)
    asyncio.run(_run_all(args, todo, users))
    metrics = _metrics(_read_records(out))
    out.with_suffix(".metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m verl_credit.envs.tau2.evaluate", description=__doc__.split("\n")[0]
    )
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="play every task of a split `--trials` times against a served policy")
    run.add_argument("--policy-base-url", required=True, help="OpenAI-compatible endpoint of the policy (…/v1)")
    run.add_argument("--policy-model", required=True, help="served model name of the policy")
    run.add_argument("--user-base-url", action="append", required=True, help="user-simulator endpoint(s) (…/v1)")
    run.add_argument("--user-model", required=True, help="served model name of the user simulator")
    run.add_argument(
        "--training-user-base-url",
        action="append",
        default=None,
        help="endpoint(s) of the user the policy was trained against: an evaluation user there is refused",
    )
    run.add_argument("--training-user-model", default=None, help="served model name of the training user")
    run.add_argument(
        "--same-user", action="store_true", help="evaluate against the training user on purpose (not held out)"
    )
    run.add_argument("--split", default="test", help="tau2 task split (default: test)")
    run.add_argument("--data", default=None, help="a prepared parquet (scripts/prepare_tau2.py) instead of --split")
    run.add_argument("--domains", default="airline,retail,telecom")
    run.add_argument("--trials", type=int, default=4)
    run.add_argument("--max-turns", type=int, default=30, help="assistant turns per episode")
    run.add_argument(
        "--max-parallel-calls",
        type=int,
        default=DEFAULT_MAX_PARALLEL_CALLS,
        help="tool calls executed per assistant turn, the rest dropped and counted "
        "(verl's multi_turn.max_parallel_calls; default %(default)s)",
    )
    run.add_argument("--max-steps", type=int, default=DEFAULT_MAX_STEPS, help="tau2's max_steps (default 200)")
    run.add_argument("--max-errors", type=int, default=DEFAULT_MAX_ERRORS, help="tau2's max_errors (default 10)")
    run.add_argument("--temperature", type=float, default=0.0, help="policy sampling temperature (tau2 default 0)")
    run.add_argument("--max-tokens", type=int, default=4096, help="policy tokens per turn")
    run.add_argument("--seed", type=int, default=300, help="trial t uses seed + t (tau2's default seed: 300)")
    run.add_argument("--concurrency", type=int, default=32, help="episodes in flight")
    run.add_argument("--out", required=True, help="results JSONL (appended; finished trials are skipped)")
    run.add_argument("--save-messages", action="store_true", help="keep each transcript in the results")
    run.add_argument("--dry-run", action="store_true", help="print the plan and exit without any request")
    run.add_argument(
        "--trust-env",
        action="store_true",
        help="let the HTTP clients use HTTP(S)_PROXY / NO_PROXY from the environment (default: ignore them)",
    )
    run.set_defaults(func=_run)

    score = sub.add_parser("score", help="pass^k per domain and domain-macro from a results JSONL")
    score.add_argument("results")
    score.add_argument("--k", type=int, default=None, help="largest k (default: fewest trials of any task)")
    score.add_argument("--json", default=None, help="also write the metrics as JSON here")
    score.set_defaults(func=_score)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    for name in ("trials", "max_turns", "concurrency", "max_parallel_calls", "max_steps", "max_errors"):
        if getattr(args, name, 1) < 1:
            print(f"evaluate: error: --{name.replace('_', '-')} must be >= 1", file=sys.stderr)
            return 2
    try:
        return int(args.func(args))
    except (ValueError, FileNotFoundError) as error:
        print(f"evaluate: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
