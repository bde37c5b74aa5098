"""``verl-credit annotate``: rollouts JSONL -> graphs JSONL (DESIGN.md section 8).

A record that carries its own ``graph`` keeps it (validated, ``source = "given"``); every other
trajectory goes to the chosen annotator, behind the sqlite cache when ``--cache`` is given.

Each line of the graphs JSONL also says whether the trajectory is ``uncertain`` (the rule
annotator's flag, DESIGN.md section 5: the hybrid annotator escalates these) and, when it is, the
``uncertain_reasons`` (the rules' criteria ``U1`` .. ``U7`` with what triggered them); the summary
counts uncertain trajectories by criterion.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from typing import Any

from tqdm import tqdm

from verl_credit.annotate.base import AnnotationResult, AnnotationStats, Annotator, build_annotator
from verl_credit.io import count_lines, read_rollouts, write_jsonl
from verl_credit.pipeline import annotate_trajectories

LLM_ANNOTATORS = ("llm", "hybrid")
_LLM_NUMBERS = ("timeout", "max_retries", "max_model_len", "max_prompt_tokens")


def _any_set(args: argparse.Namespace, names: tuple[str, ...]) -> bool:
    return any(getattr(args, name) is not None for name in names)


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "annotate",
        help="annotate rollouts with influence graphs (rules, llm or hybrid)",
        description="Read a rollouts JSONL and write one influence graph per trajectory.",
    )
    parser.add_argument("--input", required=True, help="rollouts JSONL (DESIGN.md section 8)")
    parser.add_argument("--out", required=True, help="graphs JSONL to write")
    add_annotator_arguments(parser)
    parser.set_defaults(run=run)


def add_annotator_arguments(parser: argparse.ArgumentParser) -> None:
    """The annotator flags shared by ``annotate`` and ``route`` (read by :func:`build_cli_annotator`)."""
    parser.add_argument("--annotator", default="rules", help="rules | llm | hybrid")
    parser.add_argument(
        "--base-url",
        action="append",
        default=None,
        help="OpenAI-compatible endpoint of the LLM annotator (repeatable, used round-robin)",
    )
    parser.add_argument("--model", default=None, help="served model name of the LLM annotator")
    parser.add_argument("--cache", default=None, help="sqlite annotation cache (created if missing)")
    parser.add_argument("--concurrency", type=int, default=None, help="trajectories / requests in flight")
    parser.add_argument("--timeout", type=float, default=None, help="seconds per LLM request")
    parser.add_argument("--max-retries", type=int, default=None, help="retries per LLM request")
    parser.add_argument(
        "--fallback", choices=("rules", "uniform"), default=None, help="graph used when the LLM fails (default rules)"
    )
    parser.add_argument(
        "--max-model-len",
        type=int,
        default=None,
        help="the LLM server's context length in tokens (default: read from its /v1/models; 0: no context budget)",
    )
    parser.add_argument(
        "--max-prompt-tokens", type=int, default=None, help="cap on the annotation prompt's estimated tokens"
    )
    parser.add_argument(
        "--trust-env",
        action="store_true",
        default=None,
        help="let the LLM client use HTTP(S)_PROXY/NO_PROXY from the environment (default: ignore them)",
    )


def build_cli_annotator(args: argparse.Namespace) -> Annotator:
    """The annotator the flags describe, wrapped in the cache when ``--cache`` is given."""
    options: dict[str, Any] = {}
    if args.annotator in LLM_ANNOTATORS:
        flags = {
            "base_urls": args.base_url,
            "model": args.model,
            "concurrency": args.concurrency,
            "timeout": args.timeout,
            "max_retries": args.max_retries,
            "fallback": args.fallback,
            "max_model_len": args.max_model_len,
            "max_prompt_tokens": args.max_prompt_tokens,
            "trust_env": args.trust_env,
        }
        options = {key: value for key, value in flags.items() if value is not None}
    elif args.base_url or args.model or args.fallback or args.trust_env or _any_set(args, _LLM_NUMBERS):
        raise ValueError(
            f"--base-url/--model/--timeout/--max-retries/--fallback/--max-model-len/--max-prompt-tokens/"
            f"--trust-env apply to the llm and hybrid annotators, not {args.annotator!r}"
        )
    if args.concurrency is not None and args.concurrency < 1:
        raise ValueError(f"--concurrency must be >= 1, got {args.concurrency}")
    annotator = build_annotator(args.annotator, **options)
    if args.concurrency is not None:
        annotator.concurrency = args.concurrency
    if args.cache:
        from verl_credit.annotate.cache import CachedAnnotator

        annotator = CachedAnnotator(annotator, args.cache)
    return annotator


def format_summary(stats: AnnotationStats, results: list[AnnotationResult], annotator: Annotator) -> list[str]:
    """The closing summary: parse rate, fallback rate, cache hits (and the LLM's request counts)."""
    given = sum(result.source == "given" for result in results)
    lines = [
        f"  parse rate      {stats.parse_rate:.1%}",
        f"  fallback rate   {stats.fallback_rate:.1%} ({stats.fallbacks})",
        f"  cache hits      {stats.cache_hits} ({stats.cache_hit_rate:.1%})",
        f"  repaired edges  {stats.repaired_edges}",
        f"  given graphs    {given}",
        f"  by source       {', '.join(f'{k}={v}' for k, v in sorted(stats.by_source.items()))}",
    ]
    inner = getattr(annotator, "inner", annotator)
    llm = getattr(inner, "llm", inner)
    llm_stats = getattr(llm, "stats", None)
    if llm_stats is not None and hasattr(llm_stats, "as_dict"):
        data = llm_stats.as_dict()
        failures = ", ".join(f"{k}={v}" for k, v in data["failures"].items()) or "none"
        lines.append(f"  llm requests    {data['requests']} (retries {data['retries']}, failures: {failures})")
    return lines


def _rule_tools(annotator: Annotator) -> Any:
    """The tool list the rule annotator inside ``annotator`` checks against (None: each record's own)."""
    inner = getattr(annotator, "inner", annotator)
    rules = getattr(inner, "rules", inner)
    return getattr(rules, "tools", None)


def uncertainty_of(trajectory: Any, result: AnnotationResult, tools: Any = None) -> list[str]:
    """The reasons behind ``result.uncertain`` (``[]`` when it is not set): a recorded rules failure
    (``U7``), else the rules' own criteria for this trajectory."""
    if not result.uncertain:
        return []
    from verl_credit.annotate.rules import uncertainty_reasons

    recorded = [p for p in result.validation.problems if p.startswith("U7")]
    if recorded:
        return recorded
    return uncertainty_reasons(trajectory, tools=tools) or ["unspecified: the annotator set the flag"]


def with_uncertainty(record: dict[str, Any], reasons: list[str], uncertain: bool) -> dict[str, Any]:
    record["uncertain"] = bool(uncertain)
    record["uncertain_reasons"] = reasons
    return record


def format_uncertainty(all_reasons: list[list[str]], total: int) -> list[str]:
    """Summary lines: uncertain trajectories, and how many of them each criterion flagged."""
    from verl_credit.annotate.rules import reason_label

    flagged = sum(bool(reasons) for reasons in all_reasons)
    by_reason: Counter[str] = Counter()
    for reasons in all_reasons:
        by_reason.update({reason_label(reason) for reason in reasons})
    share = flagged / total if total else 0.0
    lines = [f"  uncertain       {flagged} ({share:.1%})"]
    for label, count in sorted(by_reason.items()):
        lines.append(f"    {label:<24} {count}")
    return lines


def run(args: argparse.Namespace) -> int:
    total = count_lines(args.input)
    with tqdm(total=total, desc="read", unit="traj", file=sys.stderr, disable=None) as bar:
        trajectories, _, duplicates = read_rollouts(
            args.input, warn=lambda line: bar.write(line, file=sys.stderr), progress=bar.update
        )
    if not trajectories:
        raise ValueError(f"{args.input}: no trajectories")
    annotator = build_cli_annotator(args)
    with tqdm(
        total=len(trajectories), desc=f"annotate:{args.annotator}", unit="traj", file=sys.stderr, disable=None
    ) as bar:
        results, stats = annotate_trajectories(trajectories, annotator, progress=bar.update)
    tools = _rule_tools(annotator)
    reasons = [uncertainty_of(t, result, tools) for t, result in zip(trajectories, results, strict=True)]
    records = (
        with_uncertainty(result.to_record(t.id, args.annotator), why, result.uncertain)
        for t, result, why in zip(trajectories, results, reasons, strict=True)
    )
    write_jsonl(args.out, records)
    print(f"wrote {len(results)} graphs to {args.out} (annotator={args.annotator})")
    for line in format_summary(stats, results, annotator):
        print(line)
    for line in format_uncertainty(reasons, len(results)):
        print(line)
    if duplicates:
        print(f"  duplicate ids   {duplicates}")
    from verl_credit.cli.route import print_graph_problems

    print_graph_problems(trajectories, results)
    return 0
