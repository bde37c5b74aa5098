"""Inputs that used to hurt the CLI: endless lines, an output that is its own input, misplaced
errors, limits switched off by a flag.

* every line is capped (``verl_credit.io.MAX_LINE_CHARS``): ``--input /dev/zero`` and a file of
  one endless line end with ``file:line`` in the error, not with memory growing without bound;
* an output, ``--stats``, ``--json`` or ``--cache`` that is the same file as an input (another
  spelling, a symlink, a hard link) or as another output is refused before anything is read or
  written; ``--cache`` on a FIFO or a device is a clear error with no journal file beside it;
* malformed or overflowing ``turn_rewards`` are refused with ``file:line`` before any work;
* ``--timeout`` / ``--deadline`` of ``inf``, ``nan``, ``0`` or less are refused (a slow server
  would otherwise keep the run waiting forever).

Every run is in-process (``verl_credit.cli.main.main``); exit 2 with one stderr line is the
expected failure.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import stat
import time
from pathlib import Path
from typing import Any

import pytest
from openai_stub_server import OpenAIStubServer, Reply

from verl_credit import io as rollout_io
from verl_credit.cli.main import main
from verl_credit.estimators.needs import TURN_REWARD_LIMIT
from verl_credit.io import count_lines

pytestmark = pytest.mark.timeout(120)

EXAMPLES = Path(__file__).parents[2] / "examples" / "rollouts.jsonl"


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    return code, capsys.readouterr().err


def _error_line(err: str) -> str:
    lines = [line for line in err.splitlines() if "error:" in line]
    assert len(lines) == 1, err
    return lines[0]


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}


@pytest.fixture
def rollouts(tmp_path: Path) -> Path:
    path = tmp_path / "rollouts.jsonl"
    shutil.copy(EXAMPLES, path)
    return path


# -- endless and over-long lines ------------------------------------------------------------


@pytest.fixture
def small_line_limit(monkeypatch: pytest.MonkeyPatch) -> int:
    """A 1 MiB line limit, so that reading past it costs a moment, not 256 MiB."""
    monkeypatch.setattr(rollout_io, "MAX_LINE_CHARS", 2**20)
    return 2**20


@pytest.mark.parametrize("command", ["annotate", "ingest", "route"])
def test_dev_zero_as_input_is_refused_at_the_line_limit(
    command: str, small_line_limit: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    started = time.monotonic()
    code, err = _run(capsys, command, "--input", "/dev/zero", "--out", str(tmp_path / "out.jsonl"))
    assert code == 2
    assert "/dev/zero:1: line longer than 1,048,576 characters" in _error_line(err)
    assert time.monotonic() - started < 30
    assert not (tmp_path / "out.jsonl").exists()


def test_an_over_long_line_of_a_regular_file_names_its_line(
    rollouts: Path, small_line_limit: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with rollouts.open("a") as handle:
        handle.write('{"id": "' + "x" * (small_line_limit + 10) + '"}\n')
    lines = len(EXAMPLES.read_text().splitlines())
    code, err = _run(capsys, "annotate", "--input", str(rollouts), "--out", str(tmp_path / "g.jsonl"))
    assert code == 2 and f"{rollouts}:{lines + 1}: line longer than" in _error_line(err)


def test_a_line_of_exactly_the_limit_is_read(small_line_limit: int, tmp_path: Path) -> None:
    path = tmp_path / "edge.jsonl"
    value = "y" * (small_line_limit - len('{"k": ""}'))
    path.write_text(json.dumps({"k": value}, separators=(", ", ": ")) + "\n")
    assert [record["k"] for _, record in rollout_io.iter_jsonl(path)] == [value]


def test_count_lines_holds_one_block_of_an_endless_line(tmp_path: Path) -> None:
    import tracemalloc

    path = tmp_path / "one_line.jsonl"
    with path.open("wb") as handle:
        handle.write(b"{}\n  \n")
        for _ in range(16):
            handle.write(b"z" * 2**20)  # 16 MiB without a newline
    tracemalloc.start()
    try:
        assert count_lines(path) == 2  # "{}" and the endless one; the blank line does not count
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 * 2**20


# -- the same file twice ------------------------------------------------------------------------


def _same_file(kind: str, target: Path, name: str) -> Path:
    """Another path to ``target``: a symlink, a hard link or the same path spelled differently."""
    other = target.parent / name
    if kind == "symlink":
        other.symlink_to(target)
    elif kind == "hardlink":
        os.link(target, other)
    else:
        return target.parent / "." / target.name
    return other


@pytest.mark.parametrize("kind", ["spelling", "symlink", "hardlink"])
def test_annotate_cache_naming_the_input_is_refused(
    kind: str, rollouts: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cache = _same_file(kind, rollouts, "cache.sqlite")
    before = _snapshot(tmp_path)
    code, err = _run(
        capsys, "annotate", "--input", str(rollouts), "--out", str(tmp_path / "g.jsonl"), "--cache", str(cache)
    )
    assert code == 2
    assert "--cache is the same file as --input" in _error_line(err)
    assert _snapshot(tmp_path) == before  # nothing renamed aside, no database, no journal


@pytest.mark.parametrize("kind", ["spelling", "symlink", "hardlink"])
def test_route_out_naming_the_input_is_refused(
    kind: str, rollouts: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = _same_file(kind, rollouts, "credit.jsonl")
    before = _snapshot(tmp_path)
    code, err = _run(capsys, "route", "--input", str(rollouts), "--out", str(out))
    assert code == 2 and "--out is the same file as --input" in _error_line(err)
    assert _snapshot(tmp_path) == before


def test_annotate_out_and_cache_cannot_share_a_new_file(
    rollouts: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    new = tmp_path / "new.out"
    code, err = _run(capsys, "annotate", "--input", str(rollouts), "--out", str(new), "--cache", str(new))
    assert code == 2 and "--cache is the same file as --out" in _error_line(err)
    assert not new.exists()


@pytest.fixture
def credit(rollouts: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    path = tmp_path / "credit.jsonl"
    assert main(["route", "--input", str(rollouts), "--out", str(path)]) == 0
    capsys.readouterr()
    return path


@pytest.mark.parametrize("which", ["--input", "--rollouts", "--compare"])
def test_report_out_naming_one_of_its_inputs_is_refused(
    which: str, rollouts: Path, credit: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = rollouts if which == "--rollouts" else credit
    out = _same_file("symlink", target, "report.html")
    argv = ["report", "--input", str(credit), "--out", str(out), "--rollouts", str(rollouts)]
    if which == "--compare":
        other = tmp_path / "other.jsonl"
        shutil.copy(credit, other)
        target, out = other, _same_file("hardlink", other, "report2.html")
        argv = ["report", "--input", str(credit), "--compare", str(other), "--out", str(out)]
    before = target.read_bytes()
    code, err = _run(capsys, *argv)
    assert code == 2 and f"--out is the same file as {which}" in _error_line(err)
    assert target.read_bytes() == before


def _gateway_log(path: Path) -> Path:
    call = {
        "session_id": "s1",
        "request": {"model": "m", "messages": [{"role": "user", "content": "hi"}]},
        "response": {"choices": [{"message": {"role": "assistant", "content": "hello"}, "finish_reason": "stop"}]},
    }
    path.write_text(json.dumps(call) + "\n" + json.dumps({"session_id": "s1", "reward": 1.0}) + "\n")
    return path


def test_ingest_stats_or_out_naming_the_log_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = _gateway_log(tmp_path / "gateway.jsonl")
    before = log.read_bytes()
    for flag, extra in (("--stats", ["--out", str(tmp_path / "r.jsonl")]), ("--out", [])):
        argv = ["ingest", "--input", str(log), *extra]
        argv += [flag, str(_same_file("hardlink", log, f"link{flag}.jsonl"))]
        if flag == "--out":
            argv += ["--stats", str(tmp_path / "stats.json")]
        code, err = _run(capsys, *argv)
        assert code == 2 and f"{flag} is the same file as --input" in _error_line(err)
    assert log.read_bytes() == before and not (tmp_path / "r.jsonl").exists()
    # two outputs on one file: refused too; the same device twice is fine
    both = tmp_path / "both.json"
    code, err = _run(capsys, "ingest", "--input", str(log), "--out", str(both), "--stats", str(both))
    assert code == 2 and "--stats is the same file as --out" in _error_line(err)
    assert main(["ingest", "--input", str(log), "--out", os.devnull, "--stats", os.devnull]) == 0


def test_audit_json_naming_a_graph_file_is_refused(
    rollouts: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    graphs = tmp_path / "graphs.jsonl"
    assert main(["annotate", "--input", str(rollouts), "--out", str(graphs)]) == 0
    capsys.readouterr()
    before = graphs.read_bytes()
    code, err = _run(capsys, "audit", str(graphs), str(graphs), "--json", str(_same_file("symlink", graphs, "a.json")))
    assert code == 2 and "--json is the same file as reference" in _error_line(err)
    assert graphs.read_bytes() == before


def test_weakness_json_naming_the_input_is_refused(
    rollouts: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = rollouts.read_bytes()
    code, err = _run(capsys, "weakness", "--input", str(rollouts), "--json", str(rollouts))
    assert code == 2 and "--json is the same file as --input" in _error_line(err)
    assert rollouts.read_bytes() == before


@pytest.mark.parametrize("command", ["annotate", "route"])
def test_cache_on_a_fifo_is_a_clear_error_with_no_journal(
    command: str, rollouts: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fifo = tmp_path / "cache.fifo"
    os.mkfifo(fifo)
    before = sorted(p.name for p in tmp_path.iterdir())
    code, err = _run(
        capsys, command, "--input", str(rollouts), "--out", str(tmp_path / "o.jsonl"), "--cache", str(fifo)
    )
    assert code == 2 and "is not a regular file" in _error_line(err)
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no -journal, -wal or .corrupt file
    assert stat.S_ISFIFO(fifo.stat().st_mode)


def test_cache_on_a_device_is_a_clear_error(rollouts: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = _run(
        capsys, "annotate", "--input", str(rollouts), "--out", str(tmp_path / "o.jsonl"), "--cache", os.devnull
    )
    assert code == 2 and f"'{os.devnull}' is not a regular file" in _error_line(err)
    assert not os.path.exists(os.devnull + "-wal") and not os.path.exists(os.devnull + "-journal")


# -- turn rewards: the place, and no overflow ------------------------------------------------


def _turn_reward_file(tmp_path: Path, second: Any) -> Path:
    """Two trajectories of one group (4 actions each); the second line's turn_rewards is ``second``."""
    lines = []
    for number, turn_rewards in enumerate(([0.5, 0.0, 1.0, 0.0], second)):
        record = json.loads(EXAMPLES.read_text().splitlines()[0])
        record.update(id=f"t{number}", uid="g", reward=float(number), turn_rewards=turn_rewards)
        lines.append(json.dumps(record))
    path = tmp_path / "turns.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def _actions(path: Path) -> int:
    return sum(m["role"] == "assistant" for m in json.loads(path.read_text().splitlines()[0])["messages"])


@pytest.mark.parametrize(
    ("second", "message"),
    [
        ("high", "turn_rewards must be a list of numbers"),
        ([1.0], "turn_rewards has 1 entries for 4 actions"),
        ([1.0, "2", 0.0, 0.0], "turn_rewards[1] must be a number"),
        ([1.0, 0.0, 1e308, 0.0], "turn_rewards[2] is 1e+308: a turn reward must lie within +-1e+18"),
        ([-2e18, 0.0, 0.0, 0.0], "turn_rewards[0] is -2e+18"),
    ],
)
@pytest.mark.parametrize("command", ["route", "annotate"])
def test_malformed_turn_rewards_name_file_and_line_before_any_work(
    command: str, second: Any, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _turn_reward_file(tmp_path, second)
    assert _actions(path) == 4
    argv = [command, "--input", str(path), "--out", str(tmp_path / "out.jsonl")]
    code, err = _run(capsys, *argv, *(["--estimator", "turn_reward"] if command == "route" else []))
    assert code == 2
    assert f"{path}:2: {message}" in _error_line(err)
    assert not (tmp_path / "out.jsonl").exists()


@pytest.mark.parametrize("estimator", ["turn_reward", "gigpo"])
def test_turn_rewards_at_the_limit_give_finite_credit(
    estimator: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _turn_reward_file(tmp_path, [TURN_REWARD_LIMIT, -TURN_REWARD_LIMIT, TURN_REWARD_LIMIT, 0.0])
    out = tmp_path / "credit.jsonl"
    weight = ["--turn-lambda", "1e6"] if estimator == "turn_reward" else ["--gigpo-w", "1e6"]
    assert main(["route", "--input", str(path), "--out", str(out), "--estimator", estimator, *weight]) == 0
    advantages = [a["advantage"] for line in out.read_text().splitlines() for a in json.loads(line)["actions"]]
    assert advantages and all(math.isfinite(a) for a in advantages)
    assert max(abs(a) for a in advantages) > 1e20  # the turn term is there, not dropped


# -- timeouts that would never fire ----------------------------------------------------------


@pytest.mark.parametrize("value", ["inf", "nan", "0", "-1", "1e300"])
@pytest.mark.parametrize("flag", ["--timeout", "--deadline"])
@pytest.mark.parametrize("command", ["annotate", "route"])
def test_a_timeout_that_disables_the_limit_is_refused_before_a_slow_server_is_asked(
    command: str, flag: str, value: str, rollouts: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with OpenAIStubServer(default=Reply.completion("{}", delay=60.0)) as slow:  # never answers in time
        started = time.monotonic()
        argv = [command, "--input", str(rollouts), "--out", str(tmp_path / "o.jsonl"), "--annotator", "llm"]
        argv += ["--base-url", slow.base_url, "--model", "stub-model", "--max-model-len", "8192", flag, value]
        code, err = _run(capsys, *argv)
        assert code == 2
        assert f"{flag} must be a finite number in (0, 86400], got" in _error_line(err)
        assert time.monotonic() - started < 20 and not slow.chat_requests


@pytest.mark.parametrize(
    ("flag", "value", "expected"),
    [
        ("--max-retries", "-1", "--max-retries must be an integer in [0, 100], got -1"),
        ("--concurrency", "0", "--concurrency must be an integer in [1, 4096], got 0"),
        ("--max-model-len", "-5", "--max-model-len must be an integer in [0, 16777216] (0: no context budget)"),
        ("--max-prompt-tokens", "0", "--max-prompt-tokens must be an integer in [1, 16777216], got 0"),
    ],
)
def test_other_annotator_numbers_are_range_checked(
    flag: str, value: str, expected: str, rollouts: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["annotate", "--input", str(rollouts), "--out", str(tmp_path / "o.jsonl"), "--annotator", "llm"]
    code, err = _run(capsys, *argv, "--base-url", "http://127.0.0.1:9/v1", "--model", "m", flag, value)
    assert code == 2 and expected in _error_line(err)
