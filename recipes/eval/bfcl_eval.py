"""BFCL-v4 multi-turn through the ``bfcl-eval`` package: its commands, and its scores as one summary.

Standard library only: it runs in the interpreter that has ``bfcl-eval`` (which pins its own numpy,
so the recipe gives it a venv of its own: ``recipes/eval/setup_bfcl.sh``) as well as in the project's.

``commands`` prints, as JSON, what ``recipes/eval/bfcl_eval.sh`` runs: the environment and the
argument lists of ``bfcl generate`` (the package's handler for ``--registry-model``, talking to an
already served OpenAI-compatible endpoint: ``--skip-server-setup``; the tokenizer read from
``--model-path`` when it is a folder, which must then also be the served model name: the handler
sends it as ``model``) and ``bfcl evaluate`` (the package's own scorer). ``--cases N`` limits every category to
its first N entries (``test_case_ids_to_generate.json`` + ``--run-ids``, and ``--partial-eval``).

``run`` does both (ids file, ``generate``, ``evaluate``, each under a timeout) and then ``summarize``.

``summarize`` reads the scorer's ``BFCL_v4_<category>_score.json`` files (first line: accuracy,
correct_count, total_count) and writes ``summary.json``: per category, and ``accuracy`` = the
unweighted mean over the categories, as the BFCL leaderboard averages its multi-turn column (the
number ``scripts/paper_table.py`` puts beside the paper's 39.04 / 39.36).

    python recipes/eval/bfcl_eval.py commands --model-path DIR --base-url http://127.0.0.1:8200/v1 \\
        --project-root OUT/bfcl_root [--cases 3]
    python recipes/eval/bfcl_eval.py summarize --project-root OUT/bfcl_root --out OUT/summary.json
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

#: BFCL-v4's multi-turn categories (``multi_turn`` in the package is these four)
MULTI_TURN_CATEGORIES = ("multi_turn_base", "multi_turn_miss_func", "multi_turn_miss_param", "multi_turn_long_context")
#: the package's handler of a Qwen3 model served by vLLM, function-calling mode (hermes tool calls)
DEFAULT_REGISTRY_MODEL = "Qwen/Qwen3-8B-FC"
IDS_FILE = "test_case_ids_to_generate.json"
SCORE_PREFIX = "BFCL_v4_"


def categories_of(text: str) -> list[str]:
    """``multi_turn`` (or a comma list of multi-turn categories) -> the categories; others refused."""
    found: list[str] = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        names = MULTI_TURN_CATEGORIES if item == "multi_turn" else (item,)
        for name in names:
            if name not in MULTI_TURN_CATEGORIES:
                raise ValueError(f"--categories: {name!r} is not a BFCL-v4 multi-turn category {MULTI_TURN_CATEGORIES}")
            if name not in found:
                found.append(name)
    if not found:
        raise ValueError("--categories: no category")
    return found


def test_ids(categories: Sequence[str], cases: int) -> dict[str, list[str]]:
    """The ids file of the first ``cases`` entries of each category (ids are ``<category>_<n>``)."""
    return {category: [f"{category}_{n}" for n in range(cases)] for category in categories}


def build_commands(
    *,
    bfcl: Sequence[str],
    registry_model: str,
    model_path: str,
    base_url: str,
    project_root: str,
    categories: Sequence[str],
    cases: int = 0,
    temperature: float = 0.001,
    threads: int = 8,
) -> dict[str, Any]:
    """The environment and the two command lines (``generate``, ``evaluate``) of one evaluation."""
    parts = urlsplit(base_url)
    if not parts.scheme or not parts.hostname or parts.port is None:
        raise ValueError(f"--base-url must be http://HOST:PORT/v1, got {base_url!r}")
    joined = ",".join(categories)
    env = {
        "BFCL_PROJECT_ROOT": project_root,
        "LOCAL_SERVER_ENDPOINT": parts.hostname,
        "LOCAL_SERVER_PORT": str(parts.port),
        "REMOTE_OPENAI_BASE_URL": base_url.rstrip("/"),
    }
    generate = [*bfcl, "generate", "--model", registry_model, "--test-category", joined, "--backend", "vllm"]
    generate += ["--skip-server-setup"]
    if os.path.isdir(model_path):  # a hub id: the handler loads the tokenizer from the hub itself
        generate += ["--local-model-path", model_path]
    generate += ["--temperature", str(temperature)]
    generate += ["--num-threads", str(threads)]
    evaluate = [*bfcl, "evaluate", "--model", registry_model, "--test-category", joined]
    if cases:
        generate += ["--run-ids", "--allow-overwrite"]
        evaluate += ["--partial-eval"]
    return {
        "env": env,
        "generate": generate,
        "evaluate": evaluate,
        "ids_file": str(Path(project_root) / IDS_FILE) if cases else None,
        "ids": test_ids(categories, cases) if cases else None,
    }


def read_score_header(path: Path) -> dict[str, Any]:
    """The first line of a scorer file: ``{"accuracy", "correct_count", "total_count"}``."""
    with path.open() as handle:
        first = handle.readline()
    try:
        header = json.loads(first)
    except json.JSONDecodeError as error:
        raise ValueError(f"{path}:1: not JSON ({error.msg})") from None
    for key in ("accuracy", "correct_count", "total_count"):
        value = header.get(key) if isinstance(header, dict) else None
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise ValueError(f"{path}:1: {key} must be a number, got {value!r}")
    return header


def summarize(project_root: Path, categories: Sequence[str] | None = None) -> dict[str, Any]:
    """Per-category accuracy and the unweighted mean from the scorer's files under ``score/``."""
    wanted = list(categories or MULTI_TURN_CATEGORIES)
    found: dict[str, dict[str, Any]] = {}
    models: set[str] = set()
    for name in sorted(
        glob.glob(str(project_root / "score" / "**" / f"{SCORE_PREFIX}multi_turn_*_score.json"), recursive=True)
    ):
        path = Path(name)
        category = path.name[len(SCORE_PREFIX) : -len("_score.json")]
        if category not in wanted:
            continue
        if category in found:
            raise ValueError(f"{path}: a second score file of {category} (one model per project root)")
        header = read_score_header(path)
        found[category] = {
            "accuracy": float(header["accuracy"]),
            "correct": int(header["correct_count"]),
            "total": int(header["total_count"]),
            "file": str(path),
        }
        models.add(path.relative_to(project_root / "score").parts[0])
    if not found:
        raise ValueError(f"{project_root / 'score'}: no {SCORE_PREFIX}multi_turn_*_score.json (did bfcl evaluate run?)")
    missing = [c for c in wanted if c not in found]
    return {
        "benchmark": "BFCL-v4 multi-turn",
        "model_dir": sorted(models)[0] if len(models) == 1 else sorted(models),
        "categories": found,
        "missing_categories": missing,
        "accuracy": sum(item["accuracy"] for item in found.values()) / len(found),
        "cases": sum(item["total"] for item in found.values()),
    }


def run_plan(plan: dict[str, Any], timeout_s: float, log: Path | None = None) -> None:
    """Write the ids file, then run ``generate`` and ``evaluate`` with the plan's environment (each
    in its own session, killed on timeout); ``RuntimeError`` naming the step that failed."""
    if plan["ids_file"]:
        Path(plan["ids_file"]).parent.mkdir(parents=True, exist_ok=True)
        Path(plan["ids_file"]).write_text(json.dumps(plan["ids"], indent=2) + "\n")
    env = {**os.environ, **plan["env"]}
    Path(plan["env"]["BFCL_PROJECT_ROOT"]).mkdir(parents=True, exist_ok=True)
    for step in ("generate", "evaluate"):
        with open(log or os.devnull, "a") as handle:
            try:
                done = subprocess.run(
                    plan[step], env=env, stdout=handle, stderr=subprocess.STDOUT, timeout=timeout_s, check=False
                )
            except subprocess.TimeoutExpired:
                raise RuntimeError(f"bfcl {step} did not finish in {timeout_s:g} s") from None
        if done.returncode != 0:
            raise RuntimeError(f"bfcl {step} exited {done.returncode}" + (f" (log: {log})" if log else ""))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    commands = sub.add_parser("commands", help="print the environment and the bfcl command lines as JSON")
    commands.add_argument("--bfcl", default=f"{sys.executable} -m bfcl_eval", help="how to start bfcl")
    commands.add_argument("--registry-model", default=DEFAULT_REGISTRY_MODEL, help="bfcl-eval's handler name")
    commands.add_argument("--model-path", required=True, help="the served model's folder (also its served name)")
    commands.add_argument("--base-url", required=True, help="the OpenAI-compatible endpoint (…/v1)")
    commands.add_argument("--project-root", required=True, help="BFCL_PROJECT_ROOT: results, scores, ids file")
    commands.add_argument("--categories", default="multi_turn")
    commands.add_argument("--cases", type=int, default=0, help="first N entries per category (0: all)")
    commands.add_argument("--temperature", type=float, default=0.001, help="bfcl's default")
    commands.add_argument("--threads", type=int, default=8)
    commands.add_argument("--write-ids", action="store_true", help="also write the ids file (with --cases)")
    runner = sub.add_parser("run", help="generate + evaluate (bfcl-eval) + summarize", parents=[], add_help=True)
    for action in commands._actions[1:]:  # the same options as `commands`
        if action.dest != "write_ids":
            runner._add_action(action)
    runner.add_argument("--out", required=True, type=Path, help="summary.json to write")
    runner.add_argument("--timeout", type=float, default=6 * 3600.0, help="seconds per bfcl step")
    runner.add_argument("--log", type=Path, default=None, help="bfcl's output goes here")
    summary = sub.add_parser("summarize", help="the scorer's files -> summary.json")
    summary.add_argument("--project-root", required=True, type=Path)
    summary.add_argument("--categories", default="multi_turn")
    summary.add_argument("--out", required=True, type=Path)
    args = parser.parse_args(argv)
    try:
        if args.command in ("commands", "run"):
            if args.cases < 0 or args.threads < 1:
                raise ValueError("--cases must be >= 0 and --threads >= 1")
            plan = build_commands(
                bfcl=args.bfcl.split(),
                registry_model=args.registry_model,
                model_path=args.model_path,
                base_url=args.base_url,
                project_root=args.project_root,
                categories=categories_of(args.categories),
                cases=args.cases,
                temperature=args.temperature,
                threads=args.threads,
            )
            print(json.dumps(plan), flush=True)
            if args.command == "commands":
                if args.write_ids and plan["ids_file"]:
                    os.makedirs(args.project_root, exist_ok=True)
                    Path(plan["ids_file"]).write_text(json.dumps(plan["ids"], indent=2) + "\n")
                return 0
            run_plan(plan, args.timeout, args.log)
            result = summarize(Path(args.project_root), categories_of(args.categories))
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(result, indent=2) + "\n")
            print(json.dumps({"accuracy": result["accuracy"], "cases": result["cases"], "out": str(args.out)}))
        else:
            result = summarize(args.project_root, categories_of(args.categories))
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(result, indent=2) + "\n")
            print(json.dumps({"accuracy": result["accuracy"], "cases": result["cases"], "out": str(args.out)}))
    except (ValueError, OSError, RuntimeError) as error:
        print(f"bfcl_eval: error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
