"""``verl-credit annotate``: rollouts JSONL -> graphs JSONL (docs/design.md section 8).

A record that carries its own ``graph`` keeps it (validated, ``source = "given"``); every other
trajectory goes to the chosen annotator, behind the sqlite cache when ``--cache`` is given.

Each line of the graphs JSONL also says whether the trajectory is ``uncertain`` (the rule
annotator's flag, docs/design.md section 5: the hybrid annotator escalates these) and, when it is, the
``uncertain_reasons`` (the rules' criteria ``U1`` .. ``U7`` with what triggered them); the summary
counts uncertain trajectories by criterion.

Streaming: the input is read a line at a time (a pipe or FIFO too: it is read once) and each
graph is written as soon as it and the ones before it are done, in input order; at most
``--concurrency`` trajectories are held at once, so memory does not grow with the file. A regular
``--out`` file is replaced at the end (an input error leaves it as it was); a device or FIFO gets
each line as it is written.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import queue
import stat
import sys
import threading
from collections import Counter, deque
from collections.abc import Callable, Iterator
from typing import Any

from tqdm import tqdm

from verl_credit.annotate import defaults as annotator_defaults
from verl_credit.annotate.base import AnnotationResult, AnnotationStats, Annotator, graph_from_record
from verl_credit.annotate.factory import build_annotator
from verl_credit.cli.graph_problems import GraphProblems
from verl_credit.config_rules import MAX_COUNT, MAX_RETRIES, MAX_SECONDS, MAX_TOKENS, Number
from verl_credit.io import RolloutReader, check_distinct_files, count_lines, write_jsonl
from verl_credit.pipeline import close_loop
from verl_credit.trajectory import Trajectory

_LLM_NUMBERS = ("timeout", "max_retries", "deadline", "max_model_len", "max_prompt_tokens")
#: what each numeric annotator flag accepts (the ranges of the trainer's ``credit.annotator.*``):
#: a timeout or deadline of inf, nan, 0 or less would disable the limit or fail every request
_FLAG_RULES: dict[str, Number] = {
    "concurrency": Number(1, MAX_COUNT, integer=True),
    "timeout": Number(0.0, MAX_SECONDS, low_open=True),
    "max_retries": Number(0, MAX_RETRIES, integer=True),
    "deadline": Number(0.0, MAX_SECONDS, low_open=True),
    "max_model_len": Number(0, MAX_TOKENS, integer=True, zero="no context budget"),
    "max_prompt_tokens": Number(1, MAX_TOKENS, integer=True),
}


def _any_set(args: argparse.Namespace, names: tuple[str, ...]) -> bool:
    return any(getattr(args, name) is not None for name in names)


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "annotate",
        help="annotate rollouts with influence graphs (rules, llm or hybrid)",
        description="Read a rollouts JSONL and write one influence graph per trajectory.",
    )
    parser.add_argument("--input", required=True, help="rollouts JSONL (docs/design.md section 8)")
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
    parser.add_argument(
        "--concurrency",
        type=int,
        default=None,
        help=f"trajectories / requests in flight (default {annotator_defaults.CONCURRENCY})",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=None,
        help=f"seconds per LLM request (default {annotator_defaults.TIMEOUT_S:g})",
    )
    parser.add_argument(
        "--max-retries",
        type=int,
        default=None,
        help=f"retries per LLM request (default {annotator_defaults.MAX_RETRIES})",
    )
    parser.add_argument(
        "--deadline",
        type=float,
        default=None,
        help="seconds for one trajectory's whole LLM annotation, every attempt and wait "
        "(default: timeout x (max retries + 1)); past it the trajectory falls back, counted",
    )
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


def check_annotator_flags(args: argparse.Namespace) -> None:
    """Refuse a numeric annotator flag outside its range (``--timeout inf`` would never time out)."""
    for name, rule in _FLAG_RULES.items():
        value = getattr(args, name)
        if value is not None and rule.problem(value):
            raise ValueError(f"--{name.replace('_', '-')} must be {rule.describe()}, got {value}")


def build_cli_annotator(args: argparse.Namespace) -> Annotator:
    """The annotator the flags describe, wrapped in the cache when ``--cache`` is given."""
    check_annotator_flags(args)
    options: dict[str, Any] = {}
    if args.annotator in annotator_defaults.LLM_ANNOTATORS:
        flags = {
            "base_urls": args.base_url,
            "model": args.model,
            "concurrency": args.concurrency,
            "timeout": args.timeout,
            "max_retries": args.max_retries,
            "deadline": args.deadline,
            "fallback": args.fallback,
            "max_model_len": args.max_model_len,
            "max_prompt_tokens": args.max_prompt_tokens,
            "trust_env": args.trust_env,
        }
        options = {key: value for key, value in flags.items() if value is not None}
    elif args.base_url or args.model or args.fallback or args.trust_env or _any_set(args, _LLM_NUMBERS):
        raise ValueError(
            f"--base-url/--model/--timeout/--max-retries/--deadline/--fallback/--max-model-len/--max-prompt-tokens/"
            f"--trust-env apply to the llm and hybrid annotators, not {args.annotator!r}"
        )
    annotator = build_annotator(args.annotator, cache_path=args.cache or None, **options)
    if args.concurrency is not None:
        annotator.concurrency = args.concurrency
    return annotator


def format_summary(stats: AnnotationStats, annotator: Annotator) -> list[str]:
    """The closing summary: parse rate, fallback rate, cache hits (and the LLM's request counts)."""
    given = stats.by_source.get("given", 0)
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


class UncertaintyCounts:
    """Uncertain trajectories seen so far, and how many of them each criterion flagged."""

    def __init__(self) -> None:
        self.flagged = 0
        self.by_reason: Counter[str] = Counter()

    def add(self, reasons: list[str]) -> None:
        from verl_credit.annotate.rules import reason_label

        self.flagged += bool(reasons)
        self.by_reason.update({reason_label(reason) for reason in reasons})


def format_uncertainty(counts: UncertaintyCounts, total: int) -> list[str]:
    """Summary lines: uncertain trajectories, and how many of them each criterion flagged."""
    share = counts.flagged / total if total else 0.0
    lines = [f"  uncertain       {counts.flagged} ({share:.1%})"]
    for label, count in sorted(counts.by_reason.items()):
        lines.append(f"    {label:<24} {count}")
    return lines


class _Reader:
    """Reads the next trajectory on a thread of its own (daemon: a pipe that never ends cannot keep
    the process alive), so that the event loop -- the annotations, the writing -- goes on while a
    pipe waits for its next line. One read at a time, on request: nothing is read ahead."""

    def __init__(self, trajectories: Iterator[Trajectory], loop: asyncio.AbstractEventLoop) -> None:
        self.trajectories, self.loop = trajectories, loop
        self.requests: queue.SimpleQueue[asyncio.Future[Any] | None] = queue.SimpleQueue()
        threading.Thread(target=self._serve, name="annotate-read", daemon=True).start()

    def read(self) -> asyncio.Future[Any]:
        """A future of the next trajectory (``None`` at the end; an input error raises)."""
        future = self.loop.create_future()
        self.requests.put(future)
        return future

    def close(self) -> None:
        self.requests.put(None)

    def _serve(self) -> None:
        try:
            while (future := self.requests.get()) is not None:
                try:
                    value, error = next(self.trajectories, None), None
                except BaseException as exc:  # an input error: raised where the future is awaited
                    value, error = None, exc
                try:
                    self.loop.call_soon_threadsafe(_settle, future, value, error)
                except RuntimeError:  # the loop is closed: nobody waits any more
                    return
                if value is None:
                    return
        finally:
            close = getattr(self.trajectories, "close", None)
            if close is not None:
                close()  # the input file (the generator ran on this thread only)


def _settle(future: asyncio.Future[Any], value: Any, error: BaseException | None) -> None:
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(value)


def annotate_stream(
    trajectories: Iterator[Trajectory],
    annotator: Annotator,
    loop: asyncio.AbstractEventLoop,
    progress: Callable[[int], Any] | None = None,
) -> Iterator[tuple[Trajectory, AnnotationResult]]:
    """``(trajectory, result)`` in input order, each as soon as it and every one before it are done.

    A record's own ``graph`` is validated (``source = "given"``), every other trajectory goes to
    ``annotator`` on ``loop``; at most ``annotator.concurrency`` trajectories are held (read, not
    yet yielded) plus the one being read, so memory does not grow with the input.
    """
    # at most ``window`` trajectories are pending, so at most ``window`` annotations run at once
    window = max(1, annotator.concurrency)

    async def annotate(trajectory: Trajectory) -> AnnotationResult:
        return (await annotator.annotate_batch([trajectory]))[0]  # annotate_batch times the result

    async def first(*futures: asyncio.Future[Any]) -> None:
        await asyncio.wait(futures, return_when=asyncio.FIRST_COMPLETED)

    reader = _Reader(trajectories, loop)
    pending: deque[tuple[Trajectory, AnnotationResult | asyncio.Future[AnnotationResult]]] = deque()
    read: asyncio.Future[Any] | None = reader.read()
    try:
        while read is not None or pending:
            head = pending[0][1] if pending else None
            if head is not None and (not isinstance(head, asyncio.Future) or head.done()):
                trajectory, result = pending.popleft()
                if isinstance(result, asyncio.Future):
                    result = result.result()
                if progress is not None:
                    progress(1)
                yield trajectory, result
                continue
            if read is not None and len(pending) < window:
                loop.run_until_complete(first(read, *([head] if isinstance(head, asyncio.Future) else [])))
                if read.done():
                    trajectory = read.result()
                    if trajectory is None:
                        read = None
                        continue
                    given = graph_from_record(trajectory)
                    pending.append((trajectory, given if given is not None else loop.create_task(annotate(trajectory))))
                    read = reader.read()
            else:
                assert isinstance(head, asyncio.Future)
                loop.run_until_complete(first(head))
    finally:
        reader.close()
        if read is not None and not read.done():
            read.cancel()


def _is_regular_file(path: str) -> bool:
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return False  # the reader names the problem ("cannot open: ...")


def run(args: argparse.Namespace) -> int:
    check_distinct_files([("--input", args.input)], [("--out", args.out), ("--cache", args.cache)])
    annotator = build_cli_annotator(args)
    tools = _rule_tools(annotator)
    total = count_lines(args.input) if _is_regular_file(args.input) else None  # a pipe is read once
    stats, uncertain, problems = AnnotationStats(), UncertaintyCounts(), GraphProblems()
    loop = asyncio.new_event_loop()
    try:
        with tqdm(total=total, desc=f"annotate:{args.annotator}", unit="traj", file=sys.stderr, disable=None) as bar:
            reader = RolloutReader(args.input, warn=lambda line: bar.write(line, file=sys.stderr))

            def records() -> Iterator[dict[str, Any]]:
                stream = annotate_stream((t for _, _, t in reader), annotator, loop, bar.update)
                for trajectory, result in stream:
                    reasons = uncertainty_of(trajectory, result, tools)
                    stats.add(result)
                    uncertain.add(reasons)
                    problems.add(trajectory, result)
                    yield with_uncertainty(result.to_record(trajectory.id, args.annotator), reasons, result.uncertain)
                if not stats.total:  # raised before the output is replaced (a regular file keeps its content)
                    raise ValueError(f"{args.input}: no trajectories")

            count = write_jsonl(args.out, records())
    finally:
        close_loop(loop, annotator)
    print(f"wrote {count} graphs to {args.out} (annotator={args.annotator})")
    for line in format_summary(stats, annotator):
        print(line)
    for line in format_uncertainty(uncertain, stats.total):
        print(line)
    if reader.duplicates:
        print(f"  duplicate ids   {reader.duplicates}")
    problems.print()
    return 0
