"""``verl-credit route`` on the shipped example and on malformed inputs."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from verl_credit.cli.main import main

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "rollouts.jsonl"


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.parametrize("estimator", ["iapo", "grpo", "call_credit"])
def test_route_example(tmp_path: Path, estimator: str, capsys) -> None:
    out = tmp_path / "credit.jsonl"
    assert main(["route", "--input", str(EXAMPLE), "--out", str(out), "--estimator", estimator]) == 0
    records = read_jsonl(out)
    rollouts = read_jsonl(EXAMPLE)
    assert [r["id"] for r in records] == [r["id"] for r in rollouts]
    for record, rollout in zip(records, rollouts, strict=True):
        assert record["estimator"] == estimator
        lengths = [a["length"] for a in record["actions"]]
        assert lengths == rollout["action_token_lengths"]
        weights = [a["weight"] for a in record["actions"]]
        # mass conservation and A * w per action
        assert sum(length * w for length, w in zip(lengths, weights, strict=True)) == pytest.approx(
            sum(lengths), rel=1e-6
        )
        for action in record["actions"]:
            assert action["advantage"] == pytest.approx(record["trajectory_advantage"] * action["weight"], rel=1e-6)
        if estimator == "grpo":
            assert weights == [1.0] * len(weights)
        if estimator == "call_credit":
            assert all(a["role"] in ("IG", "AE", "RV", None) for a in record["actions"])
    summary = capsys.readouterr().out
    assert f"wrote {len(rollouts)} trajectories" in summary
    assert "w+ std" in summary


def test_route_uses_given_graph(tmp_path: Path) -> None:
    out = tmp_path / "credit.jsonl"
    assert main(["route", "--input", str(EXAMPLE), "--out", str(out)]) == 0
    given = next(r for r in read_jsonl(out) if r["id"] == "t4")
    expected_edges = next(r for r in read_jsonl(EXAMPLE) if r["id"] == "t4")["graph"]["edges"]
    assert [(e["src"], e["dst"]) for e in given["graph"]["edges"]] == [(e["src"], e["dst"]) for e in expected_edges]
    # t4 succeeded in its group: action 2 (most support in/out) gets the largest weight
    weights = [a["weight"] for a in given["actions"]]
    assert given["trajectory_advantage"] > 0
    assert max(weights) == weights[2] and weights[2] > 1.0


def test_route_flags_reach_the_math(tmp_path: Path) -> None:
    narrow, wide = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    assert main(["route", "--input", str(EXAMPLE), "--out", str(narrow), "--clip-c", "0.1"]) == 0
    assert main(["route", "--input", str(EXAMPLE), "--out", str(wide), "--clip-c", "1.0"]) == 0
    spread = [max(a["weight"] for a in r["actions"]) for r in read_jsonl(narrow) if r["id"] == "t4"]
    spread_wide = [max(a["weight"] for a in r["actions"]) for r in read_jsonl(wide) if r["id"] == "t4"]
    assert spread_wide[0] > spread[0]


def write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n")
    return path


GOOD = EXAMPLE.read_text().splitlines()[0]


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        ([GOOD, "{not json"], ":2: bad JSON"),
        (
            [GOOD, json.dumps({k: v for k, v in json.loads(GOOD).items() if k != "reward"})],
            ":2: field 'reward': missing",
        ),
        (
            [json.dumps({**json.loads(GOOD), "action_token_lengths": [1, -3, 2, 2]})],
            ":1: field 'action_token_lengths[1]': negative token length -3",
        ),
        (
            [json.dumps({**json.loads(GOOD), "action_token_lengths": [1, 2]})],
            ":1: field 'action_token_lengths': has 2 entries but the transcript has 4 assistant messages",
        ),
        ([json.dumps({k: v for k, v in json.loads(GOOD).items() if k != "messages"})], ":1: field 'messages': missing"),
    ],
)
def test_malformed_input_one_line_error(tmp_path: Path, capsys, lines: list[str], message: str) -> None:
    path = write_lines(tmp_path / "bad.jsonl", lines)
    assert main(["route", "--input", str(path), "--out", str(tmp_path / "o.jsonl"), "--estimator", "grpo"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert str(path) + message in err


def test_malformed_graph_is_repaired_and_counted_not_raised(tmp_path: Path, capsys) -> None:
    record = json.loads(GOOD)
    record["graph"] = {
        "num_actions": 4,
        "edges": [
            {"src": 3, "dst": 1, "sign": "+", "type": "input"},
            {"src": 0, "dst": 2, "sign": "+", "type": "input"},
        ],
    }
    broken = dict(json.loads(GOOD), id="t-broken", graph="{{{")
    path = write_lines(tmp_path / "g.jsonl", [json.dumps(record), json.dumps(broken)])
    out = tmp_path / "o.jsonl"
    assert main(["route", "--input", str(path), "--out", str(out)]) == 0
    first, second = read_jsonl(out)
    assert first["repaired_edges"] == 1 and not first["fallback"]
    assert second["fallback"] and second["graph"]["edges"] == []
    assert "fallback rate" in capsys.readouterr().out


def test_missing_file(tmp_path: Path, capsys) -> None:
    assert main(["route", "--input", str(tmp_path / "nope.jsonl"), "--out", str(tmp_path / "o.jsonl")]) == 2
    assert "cannot open" in capsys.readouterr().err


def test_route_reuses_the_annotation_cache(tmp_path: Path, capsys) -> None:
    cache = tmp_path / "graphs.sqlite"
    args = ["route", "--input", str(EXAMPLE), "--out", str(tmp_path / "o.jsonl"), "--cache", str(cache)]
    assert main(args) == 0
    # t5's transcript is identical to t2's: it hits the cache within the first run (1 of 6 lines)
    assert re.search(rf"cache hit rate\s+{1 / 6:.4f}", capsys.readouterr().out)
    assert main(args) == 0
    # 5 of the 6 lines are annotated (t4 carries its own graph); the second run hits the cache for all 5
    assert re.search(rf"cache hit rate\s+{5 / 6:.4f}", capsys.readouterr().out)


def _rollout(trajectory_id: str, uid: object, reward: float) -> str:
    return json.dumps({**json.loads(GOOD), "id": trajectory_id, "uid": uid, "reward": reward, "graph": None})


@pytest.mark.parametrize(("a", "b"), [(None, "None"), (1, "1"), (True, "true"), (None, "null")])
def test_uids_of_different_json_types_are_different_groups(tmp_path: Path, a: object, b: object) -> None:
    path = write_lines(tmp_path / "r.jsonl", [_rollout("x", a, 1.0), _rollout("y", b, 0.0)])
    out = tmp_path / "o.jsonl"
    assert main(["route", "--input", str(path), "--out", str(out), "--estimator", "grpo"]) == 0
    # two singleton groups (verl: mean 0, std 1); one merged group would give y a negative advantage
    x, y = read_jsonl(out)
    assert y["trajectory_advantage"] == 0.0 and x["trajectory_advantage"] == pytest.approx(1.0, rel=1e-5)
    assert [r["uid"] for r in read_jsonl(out)] == [str(a), str(b)]  # the written uid is unchanged


def test_duplicate_ids_are_warned_with_their_line(tmp_path: Path, capsys) -> None:
    path = write_lines(tmp_path / "r.jsonl", [GOOD, GOOD])
    assert main(["route", "--input", str(path), "--out", str(tmp_path / "o.jsonl"), "--estimator", "grpo"]) == 0
    captured = capsys.readouterr()
    assert f"{path}:2: warning: duplicate trajectory id" in captured.err
    assert re.search(r"duplicate ids\s+1", captured.out)


def test_out_through_a_symlink_writes_the_target(tmp_path: Path) -> None:
    real, link = tmp_path / "real.jsonl", tmp_path / "link.jsonl"
    real.write_text("old\n")
    real.chmod(0o640)
    link.symlink_to(real)
    assert main(["route", "--input", str(EXAMPLE), "--out", str(link), "--estimator", "grpo"]) == 0
    assert link.is_symlink() and len(read_jsonl(real)) == len(read_jsonl(EXAMPLE))
    assert real.stat().st_mode & 0o777 == 0o640
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.jsonl", "real.jsonl"]  # no temporary left


def test_out_into_a_fifo_writes_in_place(tmp_path: Path) -> None:
    import os
    import stat
    import threading

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    received: list[bytes] = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_bytes()))
    reader.start()
    assert main(["route", "--input", str(EXAMPLE), "--out", str(fifo), "--estimator", "grpo"]) == 0
    reader.join(30)
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    assert len(received[0].splitlines()) == len(read_jsonl(EXAMPLE))


def test_out_into_a_device_keeps_the_device(tmp_path: Path) -> None:
    import os
    import stat

    device = tmp_path / "null"
    try:
        os.mknod(device, 0o666 | stat.S_IFCHR, os.makedev(1, 3))  # a /dev/null of our own
    except PermissionError:
        pytest.skip("mknod needs root")
    assert main(["annotate", "--input", str(EXAMPLE), "--out", str(device)]) == 0
    assert stat.S_ISCHR(os.stat(device).st_mode)


def test_out_a_directory_is_one_line_error(tmp_path: Path, capsys) -> None:
    assert main(["route", "--input", str(EXAMPLE), "--out", str(tmp_path), "--estimator", "grpo"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{tmp_path}: cannot write: is a directory" in err[0]


@pytest.mark.parametrize("reward", [1e39, 3.4e38, -1e300])
@pytest.mark.parametrize("estimator", ["iapo", "grpo", "call_credit"])
def test_route_huge_finite_reward_gives_finite_credit(tmp_path: Path, estimator: str, reward: float) -> None:
    """A finite reward past float32's range (once cast to fp32: inf, then NaN advantages) is
    normalized in float64: every written number is finite."""
    import math

    rollouts = read_jsonl(EXAMPLE)
    rollouts[0]["reward"] = reward
    path = tmp_path / "huge.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rollouts))
    out = tmp_path / "out.jsonl"
    assert main(["route", "--input", str(path), "--out", str(out), "--estimator", estimator]) == 0
    values = [a["advantage"] for record in read_jsonl(out) for a in record["actions"]]
    assert values and all(math.isfinite(v) for v in values)
