"""Max RSS of ``verl-credit ingest`` against the size of the gateway log it reads.

Writes a log of ``--sessions`` sessions of ``--calls`` OpenAI calls each (every call re-sends the
conversation so far, as clients do), runs ``verl-credit ingest`` on it in a fresh process and on a
one-call log (the interpreter's own RSS), and prints the net peak over the log size::

    python scripts/measure_ingest_memory.py --sessions 1 --calls 2000     # one long session
    python scripts/measure_ingest_memory.py --sessions 10000 --calls 10   # many short ones
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

_RUN = (
    "import resource, sys\n"
    "from verl_credit.cli.main import main\n"
    "code = main(['ingest', '--input', sys.argv[1], '--out', sys.argv[2]])\n"
    "print('RSS', code, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)\n"
)


def write_log(path: Path, sessions: int, calls: int, text: int = 40) -> None:
    with path.open("w") as out:
        for s in range(sessions):
            history = [
                {"role": "system", "content": "You are an agent."},
                {"role": "user", "content": f"task {s} " + "x" * text},
            ]
            for k in range(calls):
                call_id = f"c{s}_{k}"
                arguments = json.dumps({"path": f"f{k}.py"})
                reply = {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {"id": call_id, "type": "function", "function": {"name": "read", "arguments": arguments}}
                    ],
                }
                line = {
                    "session_id": f"s{s}",
                    "request_id": f"r{s}_{k}",
                    "timestamp": 1.0e9 + s * 1e4 + k,
                    "request": {"model": "m", "messages": history},
                    "response": {
                        "id": f"x{s}_{k}",
                        "object": "chat.completion",
                        "choices": [{"index": 0, "message": reply, "finish_reason": "tool_calls"}],
                        "usage": {"prompt_tokens": 10 + 2 * k, "completion_tokens": 5},
                    },
                }
                out.write(json.dumps(line) + "\n")
                tool = {"role": "tool", "tool_call_id": call_id, "content": f"contents of f{k}.py " + "y" * text}
                history = [*history, reply, tool]
            out.write(json.dumps({"session_id": f"s{s}", "reward": 1.0}) + "\n")


def peak_rss(log: Path, out: Path) -> int:
    """Max RSS in bytes of one ``verl-credit ingest`` process."""
    result = subprocess.run(
        [sys.executable, "-c", _RUN, str(log), str(out)], capture_output=True, text=True, timeout=7200, check=False
    )
    lines = [line.split() for line in result.stdout.splitlines() if line.startswith("RSS")]
    if not lines or lines[0][1] != "0":
        raise SystemExit(f"ingest failed:\n{result.stderr[-2000:]}")
    return int(lines[0][2]) * 1024


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=1)
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--keep", type=Path, default=None, help="write the log here and keep it")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as folder:
        log = args.keep or Path(folder) / "gateway.jsonl"
        write_log(log, args.sessions, args.calls)
        tiny = Path(folder) / "tiny.jsonl"
        write_log(tiny, 1, 1)
        base = peak_rss(tiny, Path(folder) / "tiny.out")
        peak = peak_rss(log, Path(folder) / "rollouts.jsonl")
        size = log.stat().st_size
    net = peak - base
    print(
        f"{args.sessions} sessions x {args.calls} calls: log {size / 2**20:.1f} MiB, max RSS {peak / 2**20:.1f} MiB "
        f"(interpreter {base / 2**20:.1f} MiB): net {net / 2**20:.1f} MiB = {net / size:.2f}x the log"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
