#!/usr/bin/env python
"""Rule annotator on real tau2-bench transcripts: speed, edge/error statistics and hand-check scoring.

Reads tau2-bench simulation result files (``{"info": ..., "simulations": [{"messages": ...}]}``,
the JSON that ``tau2 run`` writes) from paths given on the command line, converts every simulation
to this project's rollout format in memory (nothing is written unless asked) and runs the rule
annotator on it.

    # statistics and median ms per trajectory on one core
    taskset -c 0 python scripts/bench_rules_fidelity.py SIM.json [SIM.json ...]
    # scaling with the number of actions (trajectories concatenated to ~750 .. 3000 actions)
    taskset -c 0 python scripts/bench_rules_fidelity.py SIM.json --scaling
    # print a seeded sample of transcripts with the rules' graph, for hand checking
    python scripts/bench_rules_fidelity.py SIM.json --dump 12 --seed 0
    # score the rules against a hand-checked gold file (see --gold)
    python scripts/bench_rules_fidelity.py SIM.json --gold GOLD.json

Conversion (tau2 message -> chat message): the domain policy becomes the system message; an
assistant message keeps its text and its ``tool_calls`` (``{"id", "name", "arguments"}`` ->
OpenAI function calls with JSON-string arguments); a tool result of the agent's own call becomes a
``tool`` message (``tool_call_id``, ``is_error`` from tau2's ``error``); the simulated user's own
tool calls and their results (telecom: the user runs checks on the phone) are not seen by the
agent and are dropped, the user's text is kept. The agent's tool schemas of the domain come from
the installed ``tau2`` package when it is there (``--no-tools`` leaves them out).

Gold file (``--gold``): ``{"<trajectory id>": {"edges": [[src, dst, "+"|"-"], ...],
"errors": [[action, "user_rejection"|...], ...]}, ...}`` -- what a human reader judged the edges
and errors to be. Edge precision/recall are micro-averaged over ``(src, dst, sign)``;
error-flag precision is over the flagged ``(action)`` of kind ``user_rejection`` (``--error-kinds``
to change).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from verl_credit.annotate.rules import annotate_rules, trace_rules  # noqa: E402
from verl_credit.trajectory import Trajectory  # noqa: E402

_TOOLS_CACHE: dict[str, list[dict[str, Any]] | None] = {}


def domain_tools(domain: str) -> list[dict[str, Any]] | None:
    """The agent's tool schemas of a tau2 domain (None when tau2 is not installed)."""
    base = domain.split("-")[0].split("_")[0]
    if base not in _TOOLS_CACHE:
        try:
            from verl_credit.envs.tau2.domains import agent_tool_schemas

            _TOOLS_CACHE[base] = agent_tool_schemas(base)
        except Exception:  # tau2 missing or the domain unknown: no schemas
            _TOOLS_CACHE[base] = None
    return _TOOLS_CACHE[base]


def _text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return json.dumps(value, default=str)


def convert_simulation(
    sim: dict[str, Any], policy: str, tools: list[dict[str, Any]] | None, tag: str
) -> dict[str, Any]:
    """One tau2 simulation -> a rollouts-JSONL record (docs/design.md section 8)."""
    messages: list[dict[str, Any]] = []
    if policy:
        messages.append({"role": "system", "content": policy})
    for message in sim.get("messages") or []:
        role = message.get("role")
        if role == "assistant":
            out: dict[str, Any] = {"role": "assistant", "content": _text(message.get("content"))}
            calls = []
            for call in message.get("tool_calls") or []:
                arguments = call.get("arguments")
                raw = (
                    arguments if isinstance(arguments, str) else json.dumps(arguments if arguments is not None else {})
                )
                calls.append(
                    {"id": call.get("id"), "type": "function", "function": {"name": call.get("name"), "arguments": raw}}
                )
            if calls:
                out["tool_calls"] = calls
            messages.append(out)
        elif role == "tool":
            if message.get("requestor", "assistant") != "assistant":
                continue  # the user's own tool (a phone check): the agent never sees it
            out = {"role": "tool", "tool_call_id": message.get("id"), "content": _text(message.get("content"))}
            if message.get("error"):
                out["is_error"] = True
            messages.append(out)
        elif role == "user":
            content = _text(message.get("content"))
            if content.strip():
                messages.append({"role": "user", "content": content})
    reward = (sim.get("reward_info") or {}).get("reward")
    record: dict[str, Any] = {
        "id": f"{tag}/{sim.get('task_id')}/{sim.get('trial', 0)}/{str(sim.get('id', ''))[:8]}",
        "uid": f"{tag}/{sim.get('task_id')}",
        "reward": float(reward) if isinstance(reward, int | float) else 0.0,
        "messages": messages,
    }
    if tools:
        record["tools"] = tools
    return record


def load_records(paths: list[str], with_tools: bool) -> list[dict[str, Any]]:
    records = []
    for path in paths:
        data = json.loads(Path(path).read_text())
        env = (data.get("info") or {}).get("environment_info") or {}
        domain = env.get("domain_name") or "?"
        tools = env.get("tool_defs") or (domain_tools(domain) if with_tools else None)
        tag = Path(path).stem
        for sim in data.get("simulations") or []:
            records.append(convert_simulation(sim, env.get("policy") or "", tools if with_tools else None, tag))
    return records


def time_annotation(trajectories: list[Trajectory], repeats: int) -> tuple[list[float], list[float]]:
    """Per-trajectory milliseconds of ``annotate_rules`` -- wall clock and this process's CPU time
    (the figure a loaded, shared machine disturbs least) -- best of ``repeats``, after a warm-up."""
    for trajectory in trajectories[:20]:
        annotate_rules(trajectory)
    wall = [float("inf")] * len(trajectories)
    cpu = [float("inf")] * len(trajectories)
    for _ in range(repeats):
        for index, trajectory in enumerate(trajectories):
            started, started_cpu = time.perf_counter(), time.process_time()
            annotate_rules(trajectory)
            wall[index] = min(wall[index], (time.perf_counter() - started) * 1000)
            cpu[index] = min(cpu[index], (time.process_time() - started_cpu) * 1000)
    return wall, cpu


def concatenated(records: list[dict[str, Any]], target_actions: int) -> Trajectory:
    """One long trajectory: the non-system messages of many records, until ``target_actions``."""
    messages: list[dict[str, Any]] = []
    actions = 0
    suffix = 0
    while actions < target_actions:
        for record in records:
            for message in record["messages"]:
                if message["role"] == "system":
                    continue
                message = dict(message)
                if message["role"] == "assistant" and message.get("tool_calls"):
                    message["tool_calls"] = [{**c, "id": f"{c.get('id')}-{suffix}"} for c in message["tool_calls"]]
                if message["role"] == "tool":
                    message["tool_call_id"] = f"{message.get('tool_call_id')}-{suffix}"
                actions += message["role"] == "assistant"
                messages.append(message)
            if actions >= target_actions:
                break
        suffix += 1
    return Trajectory.from_messages(messages)


def print_stats(trajectories: list[Trajectory], repeats: int) -> None:
    edges = Counter()
    errors = Counter()
    reasons = Counter()
    uncertain = 0
    free_text_edges = 0
    for trajectory in trajectories:
        graph, _, flag = annotate_rules(trajectory)
        trace = trace_rules(trajectory)
        uncertain += flag
        for code in {reason.split()[0] for reason in trace.uncertain_reasons}:
            reasons[code] += 1
        for edge in graph.edges:
            edges[edge.sign] += 1
            if any(
                part.split("=")[0].split(".")[-1] in ("summary", "reason", "note", "thought")
                for part in edge.unit.split("; ")
            ):
                free_text_edges += 1
        for mark in graph.errors:
            errors[mark.kind] += 1
    n = len(trajectories)
    actions = sum(t.num_actions for t in trajectories)
    print(f"trajectories {n}, actions {actions}, messages {sum(len(t.messages) for t in trajectories)}")
    print(f"edges + {edges['+']}  - {edges['-']}  (units from summary/reason/note/thought args: {free_text_edges})")
    print(f"errors {dict(sorted(errors.items()))}")
    print(f"uncertain {uncertain}/{n} = {uncertain / n:.1%}; trajectories by reason {dict(sorted(reasons.items()))}")
    wall, cpu = time_annotation(trajectories, repeats)
    for name, times in (("wall", wall), ("cpu", cpu)):
        ordered = sorted(times)
        print(
            f"ms/trajectory ({name}): median {statistics.median(times):.2f}, mean {statistics.fmean(times):.2f}, "
            f"p90 {ordered[int(0.9 * (len(ordered) - 1))]:.2f}, max {ordered[-1]:.2f} (best of {repeats})"
        )


def print_scaling(records: list[dict[str, Any]]) -> None:
    import math

    previous = None
    for target in (750, 1500, 3000):
        trajectory = concatenated(records, target)
        seconds = float("inf")
        for _ in range(2):
            started = time.process_time()
            annotate_rules(trajectory)
            seconds = min(seconds, time.process_time() - started)
        slope = ""
        if previous is not None:
            exponent = math.log(seconds / previous[1]) / math.log(trajectory.num_actions / previous[0])
            slope = f"  exponent vs previous {exponent:.2f}"
        print(
            f"{trajectory.num_actions} actions, {len(trajectory.messages)} messages: "
            f"{seconds * 1000:.0f} ms CPU (best of 2){slope}"
        )
        previous = (trajectory.num_actions, seconds)


def dump(trajectory: Trajectory, width: int, edges_only: bool = False) -> None:
    graph, _, uncertain = annotate_rules(trajectory)
    trace = trace_rules(trajectory)
    print("=" * 100)
    print(f"{trajectory.id}  reward={trajectory.reward}  actions={trajectory.num_actions}  uncertain={uncertain}")
    action_at = {a.message_index: a.index for a in trajectory.actions}
    for position, message in enumerate([] if edges_only else trajectory.messages):
        role = message["role"]
        if role == "system":
            continue
        text = " ".join(str(message.get("content") or "").split())
        if position in action_at:
            head = f"[a{action_at[position]}]"
            calls = "; ".join(
                f"{c['function']['name']}({c['function']['arguments']})" for c in message.get("tool_calls") or []
            )
            text = (text + " " + calls).strip()
        else:
            head = f"  {role[:4]}"
        print(f"{position:3d} {head:6s} {text[:width]}")
    for edge in graph.edges:
        print(f"  EDGE {edge.src}->{edge.dst} {edge.sign} {edge.type} {edge.unit[:90]}")
    for mark in graph.errors:
        print(f"  ERROR a{mark.action} {mark.kind}: {mark.evidence[:90]}")
    for reason in trace.uncertain_reasons:
        print(f"  UNCERTAIN {reason[:120]}")


def score(trajectories: list[Trajectory], gold: dict[str, Any], kinds: set[str]) -> None:
    tp = fp = fn = 0
    flagged = correct_flags = 0
    checked = 0
    for trajectory in trajectories:
        if trajectory.id not in gold:
            continue
        checked += 1
        graph, _, _ = annotate_rules(trajectory)
        predicted = {(e.src, e.dst, e.sign) for e in graph.edges}
        truth = {tuple(edge) for edge in gold[trajectory.id].get("edges", [])}
        tp += len(predicted & truth)
        fp += len(predicted - truth)
        fn += len(truth - predicted)
        true_errors = {action for action, kind in gold[trajectory.id].get("errors", []) if kind in kinds}
        for mark in graph.errors:
            if mark.kind in kinds:
                flagged += 1
                correct_flags += mark.action in true_errors
    precision = tp / (tp + fp) if tp + fp else float("nan")
    recall = tp / (tp + fn) if tp + fn else float("nan")
    print(f"hand-checked trajectories {checked}: edges predicted {tp + fp}, gold {tp + fn}, correct {tp}")
    print(f"edge precision {precision:.3f}  recall {recall:.3f}")
    print(f"{'/'.join(sorted(kinds))} flags {flagged}, correct {correct_flags}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("paths", nargs="+", help="tau2-bench simulation result JSON files")
    parser.add_argument("--no-tools", action="store_true", help="do not attach the domain's tool schemas")
    parser.add_argument("--repeats", type=int, default=3, help="timing repeats per trajectory (best is kept)")
    parser.add_argument("--scaling", action="store_true", help="time concatenated 750/1500/3000-action trajectories")
    parser.add_argument("--dump", type=int, default=0, help="print this many sampled transcripts with their graph")
    parser.add_argument("--ids", nargs="*", default=None, help="print these trajectory ids (with --dump)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-actions", type=int, default=0, help="sample only trajectories this short (0: any)")
    parser.add_argument("--edges-only", action="store_true", help="with --dump: print only the graphs")
    parser.add_argument("--width", type=int, default=400, help="characters of each message printed by --dump")
    parser.add_argument("--gold", default=None, help="hand-checked gold JSON to score against")
    parser.add_argument("--error-kinds", default="user_rejection", help="comma-separated error kinds to score")
    parser.add_argument("--write-rollouts", default=None, help="also write the converted rollouts JSONL here")
    args = parser.parse_args(argv)

    records = load_records(args.paths, with_tools=not args.no_tools)
    trajectories = [Trajectory.from_record(record) for record in records]
    if args.write_rollouts:
        with open(args.write_rollouts, "w", encoding="utf-8") as handle:
            for record in records:
                handle.write(json.dumps(record) + "\n")
    if args.dump or args.ids:
        chosen = [t for t in trajectories if t.id in set(args.ids)] if args.ids else []
        if args.dump:
            pool = [t for t in trajectories if not args.max_actions or t.num_actions <= args.max_actions]
            chosen += random.Random(args.seed).sample(pool, min(args.dump, len(pool)))
        for trajectory in chosen:
            dump(trajectory, args.width, args.edges_only)
        return 0
    if args.gold:
        score(trajectories, json.loads(Path(args.gold).read_text()), set(args.error_kinds.split(",")))
        return 0
    print_stats(trajectories, args.repeats)
    if args.scaling:
        print_scaling(records)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
