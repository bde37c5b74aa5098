#!/usr/bin/env python
"""Throughput of the LLM annotator's HTTP client, and the cost of a warm-cache lookup.

The local OpenAI-compatible stub server (tests/openai_stub_server.py) runs in its own process
and answers every request after a fixed latency with a valid graph. At concurrency ``c`` an ideal
client completes ``c / latency`` trajectories per second; the table reports the achieved rate and
its ratio to that ideal (target: >= 90% at c = 64), and the client's CPU time per trajectory
(its ceiling on one free core is 1000 / that many trajectories per second: on a busy machine
the ratio falls once that ceiling nears the ideal). The cache row times the hit path of
``CachedAnnotator`` (key hashing, sqlite read, graph validation) per trajectory on a warm cache.

    python scripts/bench_annotator.py                      # latency 50 ms, c = 1, 8, 64
    python scripts/bench_annotator.py --latency 0.1 --concurrency 1 16 128 --rounds 16
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

from verl_credit.annotate.cache import CachedAnnotator, GraphCache, annotator_identity, cache_key  # noqa: E402
from verl_credit.annotate.llm import LLMAnnotator  # noqa: E402
from verl_credit.trajectory import Trajectory  # noqa: E402


def synthetic_trajectory(index: int, turns: int = 6) -> Trajectory:
    """A tau2-like retail episode: ``turns`` lookups and a final write (``turns + 2`` actions)."""
    messages = [
        {"role": "system", "content": "You are a retail support agent. Follow the policy."},
        {"role": "user", "content": f"Hi, I want to return order #W{index:05d}. My email is u{index}@example.com."},
    ]
    for turn in range(turns):
        call_id = f"c{index}-{turn}"
        arguments = json.dumps({"order_id": f"#W{index:05d}", "item": turn})
        messages.append(
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {"id": call_id, "type": "function", "function": {"name": "get_order_item", "arguments": arguments}}
                ],
            }
        )
        messages.append(
            {
                "role": "tool",
                "tool_call_id": call_id,
                "name": "get_order_item",
                "content": json.dumps(
                    {"order_id": f"#W{index:05d}", "item_id": f"{1000 + turn}", "price": 10.5 * (turn + 1)}
                ),
            }
        )
    messages.append({"role": "assistant", "content": "Shall I return all items to your card?"})
    messages.append({"role": "user", "content": "yes please"})
    messages.append(
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": f"w{index}",
                    "type": "function",
                    "function": {"name": "return_items", "arguments": json.dumps({"order_id": f"#W{index:05d}"})},
                }
            ],
        }
    )
    return Trajectory.from_messages(messages, id=f"t{index}", uid=f"task-{index}", reward=1.0)


def start_stub_server(latency: float) -> tuple[subprocess.Popen[str], str]:
    process = subprocess.Popen(
        [
            sys.executable,
            str(ROOT / "tests" / "openai_stub_server.py"),
            "--latency",
            str(latency),
            "--responder",
            "uniform-graph",
            "--exit-on-stdin-eof",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    line = process.stdout.readline().strip()
    if not line.startswith("READY "):
        process.kill()
        raise RuntimeError(f"stub server did not start: {line!r}")
    return process, line.split(" ", 1)[1]


async def measure_throughput(base_url: str, concurrency: int, trajectories: list[Trajectory]) -> dict[str, float]:
    annotator = LLMAnnotator(
        base_url, model="stub-model", concurrency=concurrency, fallback="uniform", timeout=60.0, max_retries=0
    )
    try:
        await annotator.annotate_batch(trajectories[:concurrency])  # open the connections
        warm = annotator.stats.requests
        started, cpu_started = time.perf_counter(), time.process_time()
        results = await annotator.annotate_batch(trajectories)
        seconds, cpu_seconds = time.perf_counter() - started, time.process_time() - cpu_started
    finally:
        await annotator.aclose()
    failures = sum(annotator.stats.failures.values())
    return {
        "seconds": seconds,
        "throughput": len(trajectories) / seconds,
        "requests": annotator.stats.requests - warm,
        "failures": failures,
        "cpu_ms": cpu_seconds / len(trajectories) * 1e3,
        "fallbacks": sum(r.fallback for r in results),
    }


async def measure_cache(trajectories: list[Trajectory], repeats: int) -> dict[str, float]:
    """Microseconds per trajectory of a warm-cache hit (full path) and of the bare sqlite read."""
    with tempfile.TemporaryDirectory() as directory:
        inner = LLMAnnotator("http://127.0.0.1:9", model="stub-model", fallback="uniform")
        cache = GraphCache(Path(directory) / "bench.sqlite")
        cached = CachedAnnotator(inner, cache)
        identity = annotator_identity(inner)
        keys = []
        for trajectory in trajectories:  # warm the cache with each trajectory's graph
            key = cache_key(trajectory.messages, *identity)
            keys.append(key)
            cache.put(
                key,
                {
                    "num_actions": trajectory.num_actions,
                    "errors": [],
                    "direct_user_inputs": {},
                    "edges": [{"src": 0, "dst": 1, "sign": "+", "type": "input", "unit": "#W"}],
                },
                "llm",
                identity=identity,
            )
        full, bare = [], []
        for _ in range(repeats):
            started = time.perf_counter()
            for trajectory in trajectories:
                result = await cached.annotate_one(trajectory)
                if not result.cached:
                    raise RuntimeError("cache miss on a warm cache")
            full.append((time.perf_counter() - started) / len(trajectories) * 1e6)
            started = time.perf_counter()
            for key in keys:
                cache.get(key)
            bare.append((time.perf_counter() - started) / len(keys) * 1e6)
        cache.close()
    return {"full_us": statistics.median(full), "get_us": statistics.median(bare)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--latency", type=float, default=0.05, help="server latency per request (s)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 64])
    parser.add_argument("--rounds", type=int, default=32, help="trajectories per level = rounds x concurrency")
    parser.add_argument("--cache-trajectories", type=int, default=2000)
    args = parser.parse_args(argv)

    largest = max(args.concurrency) * args.rounds
    trajectories = [synthetic_trajectory(i) for i in range(max(largest, args.cache_trajectories))]
    prompt_chars = len(json.dumps(LLMAnnotator("http://h", fallback="uniform").build_payload(trajectories[0])))
    process, base_url = start_stub_server(args.latency)
    rows = []
    try:
        for concurrency in args.concurrency:
            batch = trajectories[: concurrency * args.rounds]
            measured = asyncio.run(measure_throughput(base_url, concurrency, batch))
            ideal = concurrency / args.latency
            rows.append((concurrency, len(batch), measured, ideal))
    finally:
        process.kill()
        process.wait()
    cache = asyncio.run(measure_cache(trajectories[: args.cache_trajectories], repeats=5))

    print(
        f"LLM annotator vs local stub server: latency {args.latency * 1000:.0f} ms per request, "
        f"{trajectories[0].num_actions} actions and {prompt_chars} request bytes per trajectory\n"
    )
    print(
        "| concurrency | trajectories | seconds | achieved traj/s | ideal traj/s | ratio | client CPU ms/traj "
        "| failures |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for concurrency, count, measured, ideal in rows:
        print(
            f"| {concurrency} | {count} | {measured['seconds']:.2f} | {measured['throughput']:.1f} | {ideal:.1f} "
            f"| {measured['throughput'] / ideal:.1%} | {measured['cpu_ms']:.2f} | {measured['failures']} |"
        )
    print(
        f"\nwarm sqlite cache, {args.cache_trajectories} trajectories: {cache['full_us']:.0f} µs per trajectory "
        f"for a hit through CachedAnnotator (canonical JSON + sha256 + read + validate), "
        f"{cache['get_us']:.0f} µs for the bare read"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
