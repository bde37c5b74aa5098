"""``verl-credit annotate`` end to end against the local OpenAI-compatible stub server."""

from __future__ import annotations

import errno
import json
import os
import select
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from openai_stub_server import OpenAIStubServer, Reply, unused_port

from verl_credit.cli.main import main

pytestmark = pytest.mark.timeout(60)


def rollout(trajectory_id: str, actions: int, graph: dict[str, Any] | None = None) -> dict[str, Any]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": f"task {trajectory_id}"}]
    for i in range(actions):
        messages.append({"role": "assistant", "content": f"step {i} of {trajectory_id}?"})
        messages.append({"role": "user", "content": f"answer {i}"})
    return {"id": trajectory_id, "uid": "g", "reward": 1.0, "messages": messages, "graph": graph}


def chain_responder(request: dict[str, Any]) -> Reply:
    """A graph with the support edge 0 -> 1 for whatever size the request's schema pins."""
    n = request["response_format"]["json_schema"]["schema"]["properties"]["num_actions"]["enum"][0]
    return Reply.json(
        {
            "num_actions": n,
            "errors": [],
            "direct_user_inputs": {},
            "edges": [{"src": 0, "dst": 1, "sign": "+", "type": "input", "unit": "answer 0"}],
        }
    )


GIVEN = {"num_actions": 2, "errors": [], "direct_user_inputs": {"0": 1}, "edges": []}


def write_rollouts(path: Path, records: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def read_lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_annotate_with_the_llm_then_from_the_cache(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rollouts = write_rollouts(tmp_path / "r.jsonl", [rollout("a", 2), rollout("b", 3), rollout("c", 2, GIVEN)])
    out, cache = tmp_path / "graphs.jsonl", tmp_path / "cache.sqlite"
    with OpenAIStubServer(chain_responder) as server:
        argv = [
            "annotate",
            "--input",
            str(rollouts),
            "--out",
            str(out),
            "--annotator",
            "llm",
            "--base-url",
            server.base_url,
            "--model",
            "stub-model",
            "--cache",
            str(cache),
            "--concurrency",
            "4",
            "--timeout",
            "5",
            "--max-retries",
            "1",
            "--fallback",
            "uniform",
        ]
        assert main(argv) == 0
        first = capsys.readouterr().out
        lines = read_lines(out)
        assert [line["id"] for line in lines] == ["a", "b", "c"]
        assert [line["source"] for line in lines] == ["llm", "llm", "given"]
        assert lines[1]["graph"]["num_actions"] == 3
        assert lines[1]["graph"]["edges"] == [{"src": 0, "dst": 1, "sign": "+", "type": "input", "unit": "answer 0"}]
        assert lines[2]["graph"] == GIVEN and all(line["annotator"] == "llm" for line in lines)
        assert len(server.chat_requests) == 2  # the given graph needs no request
        assert server.chat_requests[0].json["temperature"] == 0
        assert "parse rate      100.0%" in first and "fallback rate   0.0%" in first
        assert "cache hits      0 (0.0%)" in first and "llm requests    2" in first

        assert main(argv) == 0  # a second run: both annotated graphs come from the cache
        second = capsys.readouterr().out
        assert "cache hits      2 (66.7%)" in second
        assert len(server.chat_requests) == 2
        assert read_lines(out)[:2] == [dict(line) for line in lines[:2]]


def test_failures_are_counted_in_the_summary(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rollouts = write_rollouts(tmp_path / "r.jsonl", [rollout("a", 2), rollout("b", 2)])
    out = tmp_path / "g.jsonl"
    with OpenAIStubServer(default=Reply.error(503)) as server:
        rc = main(
            [
                "annotate",
                "--input",
                str(rollouts),
                "--out",
                str(out),
                "--annotator",
                "llm",
                "--base-url",
                server.base_url,
                "--max-retries",
                "1",
                "--fallback",
                "uniform",
            ]
        )
    assert rc == 0
    summary = capsys.readouterr().out
    assert "fallback rate   100.0% (2)" in summary and "parse rate      0.0%" in summary
    assert "http_5xx=4" in summary  # 2 trajectories x (1 attempt + 1 retry)
    lines = read_lines(out)
    assert all(line["graph"] is None and "http_5xx" in line["error"] for line in lines)


def test_malformed_input_names_the_file_and_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad_json = tmp_path / "bad.jsonl"
    bad_json.write_text(json.dumps(rollout("a", 1)) + "\n{not json\n", encoding="utf-8")
    assert main(["annotate", "--input", str(bad_json), "--out", str(tmp_path / "o.jsonl")]) == 2
    err = capsys.readouterr().err
    assert f"{bad_json}:2" in err and "bad JSON" in err

    missing = write_rollouts(tmp_path / "missing.jsonl", [rollout("a", 1), {"id": "b", "reward": 1.0}])
    assert main(["annotate", "--input", str(missing), "--out", str(tmp_path / "o.jsonl")]) == 2
    err = capsys.readouterr().err
    assert f"{missing}:2" in err and "messages" in err
    assert not (tmp_path / "o.jsonl").exists()


def test_option_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rollouts = write_rollouts(tmp_path / "r.jsonl", [rollout("a", 2)])
    out = str(tmp_path / "o.jsonl")
    assert main(["annotate", "--input", str(rollouts), "--out", out, "--annotator", "oracle"]) == 2
    assert "unknown annotator 'oracle'" in capsys.readouterr().err
    assert (
        main(["annotate", "--input", str(rollouts), "--out", out, "--annotator", "rules", "--base-url", "http://h:1"])
        == 2
    )
    assert "apply to the llm and hybrid annotators" in capsys.readouterr().err
    assert (
        main(
            [
                "annotate",
                "--input",
                str(rollouts),
                "--out",
                out,
                "--annotator",
                "llm",
                "--base-url",
                "h:1",
                "--fallback",
                "uniform",
            ]
        )
        == 2
    )
    assert "http://" in capsys.readouterr().err


# -- scripts/serve_annotator.sh ------------------------------------------------------------------
SERVE_SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "serve_annotator.sh"
STUB = Path(__file__).resolve().parents[1] / "openai_stub_server.py"


def fake_vllm(tmp_path: Path, exit_status: int | None = None) -> Path:
    """An executable standing in for `vllm`: records its argv, then serves the stub on --port
    (or exits with ``exit_status``)."""
    script = tmp_path / "vllm"
    body = [
        f"#!{sys.executable}",
        "import json, runpy, sys",
        f"open({str(tmp_path / 'argv.json')!r}, 'w').write(json.dumps(sys.argv[1:]))",
    ]
    if exit_status is not None:
        body.append(f"sys.exit({exit_status})")
    body += [
        "port = sys.argv[sys.argv.index('--port') + 1]",
        f"sys.argv = [{str(STUB)!r}, '--port', port]",
        f"runpy.run_path({str(STUB)!r}, run_name='__main__')",
    ]
    script.write_text("\n".join(body) + "\n")
    script.chmod(0o755)
    return script


def test_serve_script_dry_run_prints_the_vllm_command() -> None:
    env = {**os.environ, "MODEL": "Qwen/Qwen3-8B", "TP": "2", "PORT": "9001", "API_KEY": "s3cret"}
    done = subprocess.run(
        ["bash", str(SERVE_SCRIPT), "--dry-run", "--seed", "0"], env=env, capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0, done.stderr
    words = done.stdout.split()
    assert words[:3] == ["vllm", "serve", "Qwen/Qwen3-8B"]
    for flag, value in [
        ("--tensor-parallel-size", "2"),
        ("--port", "9001"),
        ("--max-model-len", "32768"),
        ("--structured-outputs-config.backend", "guidance"),
        ("--structured-outputs-config.disable_any_whitespace", "true"),
        ("--api-key", "s3cret"),
        ("--served-model-name", "Qwen/Qwen3-8B"),
        ("--reasoning-parser", "qwen3"),
    ]:
        assert words[words.index(flag) + 1] == value, flag
    assert "--enable-prefix-caching" in words and words[-2:] == ["--seed", "0"]

    bad = subprocess.run(
        ["bash", str(SERVE_SCRIPT), "--dry-run"],
        env={**os.environ, "TP": "four"},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert bad.returncode == 2 and "TP must be a positive integer, got 'four'" in bad.stderr


def test_serve_script_waits_for_health_and_prints_the_base_url(tmp_path: Path) -> None:
    port = unused_port()
    env = {
        **os.environ,
        "VLLM_BIN": str(fake_vllm(tmp_path)),
        "HOST": "127.0.0.1",
        "PORT": str(port),
        "HEALTH_INTERVAL": "0.2",
        "HEALTH_TIMEOUT": "30",
    }
    process = subprocess.Popen(["bash", str(SERVE_SCRIPT)], env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        lines = []  # the server's own output shares stdout; the script's line comes after it is healthy
        while not lines or not lines[-1].startswith("annotator ready"):
            lines.append(process.stdout.readline().strip())
            assert lines[-1] or process.poll() is None, lines
        assert lines[-1] == f"annotator ready: model=Qwen/Qwen3-32B base_url=http://127.0.0.1:{port}/v1"
        assert httpx.get(f"http://127.0.0.1:{port}/v1/models").status_code == 200
        argv = json.loads((tmp_path / "argv.json").read_text())
        assert argv[:2] == ["serve", "Qwen/Qwen3-32B"] and "--enable-prefix-caching" in argv
    finally:
        process.terminate()
        process.wait(timeout=15)
    with pytest.raises(httpx.ConnectError):  # the script took its server down with it
        httpx.get(f"http://127.0.0.1:{port}/health")


def test_serve_script_reports_a_server_that_dies(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "VLLM_BIN": str(fake_vllm(tmp_path, exit_status=3)),
        "PORT": str(unused_port()),
        "HEALTH_INTERVAL": "0.2",
    }
    done = subprocess.run(["bash", str(SERVE_SCRIPT)], env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 2 and "vllm exited with status 3 before becoming healthy" in done.stderr


ROOT = Path(__file__).resolve().parents[2]


def _open_for_writing(fifo: Path, process: subprocess.Popen, deadline: float) -> int:
    """The FIFO's write end, once the process opened its read end (never blocks forever)."""
    while True:
        try:
            return os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as exc:  # ENXIO: no reader yet
            if exc.errno != errno.ENXIO or process.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"the annotator did not open its input: {exc}") from None
            time.sleep(0.05)


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_annotate_streams_a_pipe(tmp_path: Path) -> None:
    """Input from a FIFO fed a line at a time, output to a pipe: the first graph comes out while
    the second line is still unwritten (it read the whole input before annotating anything)."""
    fifo = tmp_path / "rollouts"
    os.mkfifo(fifo)
    command = [sys.executable, "-m", "verl_credit.cli.main", "annotate", "--input", str(fifo), "--out", "/dev/stdout"]
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        feed = _open_for_writing(fifo, process, time.monotonic() + 60)
        os.set_blocking(feed, True)
        with os.fdopen(feed, "w") as handle:
            handle.write(json.dumps(rollout("a", 2)) + "\n")
            handle.flush()
            assert process.stdout is not None
            ready, _, _ = select.select([process.stdout], [], [], 60)
            assert ready, "no graph written while the input is open"
            first = json.loads(process.stdout.readline())
            assert first["id"] == "a" and first["source"] == "rules"
            handle.write(json.dumps(rollout("b", 1, GIVEN | {"num_actions": 1})) + "\n")
        out, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 0, err.decode()
    lines = out.decode().splitlines()
    assert json.loads(lines[0])["id"] == "b" and json.loads(lines[0])["source"] == "given"
    assert "wrote 2 graphs to /dev/stdout" in lines[1]
