#!/usr/bin/env python
"""Scale of ``verl-credit route`` and ``annotate``: time in actions, memory of
one huge message, memory of ``route`` in lines (streaming vs in memory).

Every row runs the CLI in a fresh process under ``/usr/bin/time -v`` (wall and CPU seconds, max RSS);
"net" subtracts the same command on a one-line file (interpreter, torch and imports: about
2.5 s and 240 MB). Section A also times the phases in-process, to show which part grows.

    python scripts/bench_scale.py                       # all sections
    python scripts/bench_scale.py --sections A --actions 750 1500 3000
    python scripts/bench_scale.py --sections B --message-mb 50 --roles assistant tool
    python scripts/bench_scale.py --sections C --lines 10000 40000
"""

from __future__ import annotations

import argparse
import json
import random
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-m", "verl_credit.cli.main"]


def transcript(num_actions: int, seed: int = 0) -> list[dict]:
    """A service transcript: questions, lookups (half failing), proposals and confirmations."""
    messages = [
        {"role": "system", "content": "You are a retail support agent. Follow the refund policy."},
        {"role": "user", "content": "Hi, I want to return order #W00012. My email is ann@example.com."},
    ]
    for k in range(num_actions):
        kind = (k + seed) % 4
        if kind == 0:
            messages.append({"role": "assistant", "content": f"Could you confirm the item number for order #W{k:05d}?"})
            messages.append({"role": "user", "content": f"item {1000 + k}"})
        elif kind in (1, 2):
            arguments = json.dumps({"order_id": f"#W{k - kind:05d}", "item": 1000 + k - kind})
            call = {"id": f"c{k}", "type": "function", "function": {"name": "get_order_item", "arguments": arguments}}
            messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
            result = (
                {"order_id": f"#W{k:05d}", "item_id": f"{2000 + k}", "price": 10.5 * (k + 1)}
                if kind == 1
                else {"error": f"item {1000 + k - kind} not found"}
            )
            messages.append(
                {"role": "tool", "tool_call_id": f"c{k}", "name": "get_order_item", "content": json.dumps(result)}
            )
        else:
            messages.append({"role": "assistant", "content": f"Item {2000 + k - 2} costs $10.50. Shall I return it?"})
            messages.append({"role": "user", "content": "yes please"})
    return messages


def chain_graph(num_actions: int) -> dict:
    edges = [{"src": i - 1, "dst": i, "sign": "+", "type": "input", "unit": "x"} for i in range(1, num_actions)]
    edges += [{"src": i - 5, "dst": i, "sign": "-", "type": "failed_utilization"} for i in range(5, num_actions, 4)]
    return {"num_actions": num_actions, "errors": [], "direct_user_inputs": {"0": 1}, "edges": edges}


def write(path: Path, records: list[dict]) -> Path:
    with open(path, "w") as handle:
        for record in records:
            handle.write(json.dumps(record) + "\n")
    return path


def run_cli(args: list[str]) -> tuple[float, float, float]:
    """``(wall seconds, CPU seconds (user + system), max RSS MiB)`` of one CLI run in a fresh
    process. CPU seconds are the figure to compare on a shared machine (wall time waits for it)."""
    done = subprocess.run(["/usr/bin/time", "-v", *CLI, *args], cwd=ROOT, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"failed: {' '.join(args)}\n{done.stderr[-2000:]}")
    rss = float(re.search(r"Maximum resident set size \(kbytes\): (\d+)", done.stderr).group(1)) / 1024
    wall = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): (\S+)", done.stderr).group(1)
    seconds = sum(float(part) * 60**i for i, part in enumerate(reversed(wall.split(":"))))
    cpu = sum(float(re.search(rf"{kind} time \(seconds\): (\S+)", done.stderr).group(1)) for kind in ("User", "System"))
    return seconds, cpu, rss


def commands(path: Path, out: Path) -> dict[str, list[str]]:
    return {
        "route iapo": ["route", "--input", str(path), "--out", str(out), "--estimator", "iapo"],
        "annotate": ["annotate", "--input", str(path), "--out", str(out)],
        "route grpo": ["route", "--input", str(path), "--out", str(out), "--estimator", "grpo"],
    }


def baselines(tmp: Path) -> dict[str, tuple[float, float, float]]:
    tiny = write(tmp / "tiny.jsonl", [{"id": "t", "uid": "u", "reward": 1.0, "messages": transcript(1)}])
    return {name: run_cli(args) for name, args in commands(tiny, tmp / "o.jsonl").items()}


def phases(path: Path) -> dict[str, float]:
    """In-process CPU seconds of each step on a one-trajectory file."""
    sys.path.insert(0, str(ROOT))
    from verl_credit.annotate.rules import trace_rules
    from verl_credit.config import CreditConfig
    from verl_credit.graph import validate_graph
    from verl_credit.io import read_rollouts, write_jsonl
    from verl_credit.pipeline import route_trajectories

    times: dict[str, float] = {}

    def timed(name, function):
        start = time.process_time()
        value = function()
        times[name] = time.process_time() - start
        return value

    trajectories, _, _ = timed("read+parse", lambda: read_rollouts(path))
    trace = timed("rules (annotate/rules*.py)", lambda: trace_rules(trajectories[0]))
    timed("validate graph", lambda: validate_graph(trace.raw_graph, trajectories[0].num_actions))
    given = [type(t)(**{**t.__dict__, "graph": chain_graph(t.num_actions)}) for t in trajectories]
    routed = timed("route (given graph)", lambda: route_trajectories(given, CreditConfig(estimator="iapo")))
    from verl_credit.credit_output import credit_records

    records = timed("records", lambda: credit_records(given, routed.credit, routed.annotations))
    timed("write", lambda: write_jsonl(path.with_suffix(".out"), records))
    return times


def section_a(tmp: Path, sizes: list[int], base: dict[str, tuple[float, float, float]]) -> None:
    print("\n## A. one trajectory of n actions (rule annotator)\n")
    print("| actions | command | wall s | CPU s | net CPU s | max RSS MiB |")
    print("|---:|---|---:|---:|---:|---:|")
    for n in sizes:
        path = write(tmp / f"a{n}.jsonl", [{"id": "t", "uid": "u", "reward": 1.0, "messages": transcript(n)}])
        for name, args in commands(path, tmp / "o.jsonl").items():
            if name == "route grpo":
                continue
            seconds, cpu, rss = run_cli(args)
            print(f"| {n} | {name} | {seconds:.2f} | {cpu:.2f} | {cpu - base[name][1]:.2f} | {rss:.0f} |")
    print("\nin-process phases (CPU seconds):\n")
    rows = {
        n: phases(write(tmp / f"p{n}.jsonl", [{"id": "t", "reward": 1.0, "messages": transcript(n)}])) for n in sizes
    }
    names = list(next(iter(rows.values())))
    print("| phase | " + " | ".join(f"n={n}" for n in sizes) + " | ratio last/first |")
    print("|---|" + "---:|" * (len(sizes) + 1))
    for name in names:
        values = [rows[n][name] for n in sizes]
        ratio = values[-1] / values[0] if values[0] else float("nan")
        print(f"| {name} | " + " | ".join(f"{v:.3f}" for v in values) + f" | {ratio:.1f} |")


def big_message(role: str, size: int) -> dict:
    words = "alpha beta #W00012 item 1000 price 10.50 gamma delta ann@example.com order\n"
    big = (words * (size // len(words) + 1))[:size]
    messages = [
        {"role": "system", "content": "You are a retail support agent."},
        {"role": "user", "content": big if role == "user" else "refund order #W00012 please"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "get_order", "arguments": '{"order_id": "#W00012"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": big if role == "tool" else '{"status": "delivered"}'},
        {"role": "assistant", "content": big if role == "assistant" else "Done."},
    ]
    return {"id": "t1", "uid": "task-1", "reward": 1.0, "messages": messages}


def section_b(tmp: Path, megabytes: float, roles: list[str], names: list[str], base: dict) -> None:
    size = int(megabytes * 1_000_000)
    print(f"\n## B. one message of {megabytes:g} MB\n")
    print("| message role | command | wall s | CPU s | max RSS MiB | net MiB | net / message |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for role in roles:
        path = write(tmp / f"b_{role}.jsonl", [big_message(role, size)])
        for name in names:
            seconds, cpu, rss = run_cli(commands(path, tmp / "o.jsonl")[name])
            net = rss - base[name][2]  # MiB, like the message size below
            ratio = net / (size / 2**20)
            print(f"| {role} | {name} | {seconds:.1f} | {cpu:.1f} | {rss:.0f} | {net:.0f} | {ratio:.1f}x |")


def section_c(tmp: Path, counts: list[int], group: int, base: dict) -> None:
    print(f"\n## C. route --estimator grpo over many lines (groups of {group}, 6-30 actions)\n")
    print("| lines | file MB | input | wall s | CPU s | max RSS MiB | net MiB |")
    print("|---:|---:|---|---:|---:|---:|---:|")
    rng = random.Random(0)
    for count in counts:
        records = [
            {
                "id": f"t{i}",
                "uid": f"task-{i // group}",
                "reward": float(rng.random() < 0.5),
                "messages": transcript(rng.randint(6, 30), i),
            }
            for i in range(count)
        ]
        grouped = write(tmp / f"c{count}.jsonl", records)
        rng.shuffle(records)
        shuffled = write(tmp / f"c{count}s.jsonl", records)
        del records
        megabytes = grouped.stat().st_size / 1e6
        for label, path in (("grouped (streamed)", grouped), ("shuffled (in memory)", shuffled)):
            seconds, cpu, rss = run_cli(commands(path, tmp / "o.jsonl")["route grpo"])
            net = rss - base["route grpo"][2]
            print(f"| {count} | {megabytes:.0f} | {label} | {seconds:.1f} | {cpu:.1f} | {rss:.0f} | {net:.0f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sections", default="ABC")
    parser.add_argument("--actions", type=int, nargs="+", default=[750, 1500, 3000])
    parser.add_argument("--message-mb", type=float, default=50.0)
    parser.add_argument("--roles", nargs="+", default=["assistant", "tool", "user"])
    parser.add_argument("--message-commands", nargs="+", default=["route grpo", "route iapo", "annotate"])
    parser.add_argument("--lines", type=int, nargs="+", default=[10000, 40000])
    parser.add_argument("--group", type=int, default=8)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        tmp = Path(directory)
        base = baselines(tmp)
        print(
            "baseline (one-line file): "
            + ", ".join(f"{k} {s:.2f} s ({c:.2f} CPU s) {r:.0f} MiB" for k, (s, c, r) in base.items())
        )
        if "A" in args.sections:
            section_a(tmp, args.actions, base)
        if "B" in args.sections:
            section_b(tmp, args.message_mb, args.roles, args.message_commands, base)
        if "C" in args.sections:
            section_c(tmp, args.lines, args.group, base)


if __name__ == "__main__":
    main()
