"""``verl-credit demo`` on a tiny configuration: the files it writes and the numbers in them."""

from __future__ import annotations

import json
import math
import re

import pytest

from verl_credit.cli.main import main
from verl_credit.io import iter_jsonl, load_trajectories

GROUPS, GROUP_SIZE = 3, 4  # seed 0: every group mixes successes and failures (2/4, 3/4, 1/4)


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo")
    code = main(
        [
            "demo",
            "--out",
            str(out),
            "--groups",
            str(GROUPS),
            "--group-size",
            str(GROUP_SIZE),
            "--seed",
            "0",
            "--max-trajectories",
            "4",
        ]
    )
    assert code == 0
    return out


def _lines(path):
    return [record for _, record in iter_jsonl(path)]


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_demo_writes_every_file(demo_dir):
    for name in ("rollouts.jsonl", "credit.jsonl", "credit_grpo.jsonl", "credit_call_credit.jsonl", "report.html"):
        assert (demo_dir / name).stat().st_size > 0, name
    trajectories = [t for _, t in load_trajectories(demo_dir / "rollouts.jsonl")]
    assert len(trajectories) == GROUPS * GROUP_SIZE
    assert len({t.uid for t in trajectories}) == GROUPS
    assert all(t.extra["ground_truth"]["macros"] for t in trajectories)


def test_credit_lines_conserve_mass_and_follow_the_group_advantage(demo_dir):
    rollouts = {t.id: t for _, t in load_trajectories(demo_dir / "rollouts.jsonl")}
    for name, estimator in (
        ("credit.jsonl", "iapo"),
        ("credit_call_credit.jsonl", "call_credit"),
        ("credit_grpo.jsonl", "grpo"),
    ):
        lines = _lines(demo_dir / name)
        assert len(lines) == GROUPS * GROUP_SIZE
        by_group: dict[str, list[float]] = {}
        for line in lines:
            assert line["estimator"] == estimator
            trajectory = rollouts[line["id"]]
            assert [a["length"] for a in line["actions"]] == trajectory.action_lengths
            lengths = [a["length"] for a in line["actions"]]
            weights = [a["weight"] for a in line["actions"]]
            advantage = line["trajectory_advantage"]
            # mass conservation (docs/design.md section 3/4): sum_i L_i w_i = L
            assert sum(n * w for n, w in zip(lengths, weights, strict=True)) == pytest.approx(sum(lengths), rel=1e-5)
            assert all(w > 0 for w in weights)
            for action in line["actions"]:
                assert action["advantage"] == pytest.approx(advantage * action["weight"], rel=1e-5, abs=1e-7)
                if advantage != 0:
                    assert math.copysign(1, action["advantage"]) == math.copysign(1, advantage)
            if estimator == "grpo":
                assert weights == [1.0] * len(weights)
            by_group.setdefault(line["uid"], []).append(advantage)
            assert line["reward"] == trajectory.reward
        for advantages in by_group.values():  # GRPO normalization: zero mean per group, mixed outcomes
            assert sum(advantages) == pytest.approx(0.0, abs=1e-5)
            assert max(advantages) > 0 > min(advantages)


def test_iapo_lines_carry_graphs_and_move_weights(demo_dir):
    lines = _lines(demo_dir / "credit.jsonl")
    assert all(line["graph"]["num_actions"] == len(line["actions"]) for line in lines)
    moved = [a["weight"] for line in lines if line["trajectory_advantage"] > 0 for a in line["actions"]]
    assert moved and any(abs(w - 1) > 0.1 for w in moved)
    calls = _lines(demo_dir / "credit_call_credit.jsonl")
    assert all(line["call_graph"]["roles"] for line in calls)
    assert {a["role"] for line in calls for a in line["actions"]} <= {"IG", "AE", "RV"}


def test_report_embeds_pngs_and_summary(demo_dir):
    text = (demo_dir / "report.html").read_text()
    images = re.findall(r"data:image/png;base64,", text)
    assert len(images) >= 1 + 4  # batch plots + 4 trajectories (+ comparisons)
    assert "credit precision" in text and "iapo" in text


@pytest.mark.slow
def test_demo_prints_a_summary_and_is_deterministic(tmp_path, capsys, demo_dir):
    out = tmp_path / "again"
    assert (
        main(
            [
                "demo",
                "--out",
                str(out),
                "--groups",
                str(GROUPS),
                "--group-size",
                str(GROUP_SIZE),
                "--seed",
                "0",
                "--max-trajectories",
                "4",
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    assert re.search(r"^iapo\s+0\.000\s", printed, re.MULTILINE)  # fallback rate of the rule graphs
    assert "credit precision" in printed and "report" in printed
    assert (out / "credit.jsonl").read_text() == (demo_dir / "credit.jsonl").read_text()
    first = json.loads((out / "rollouts.jsonl").read_text().splitlines()[0])
    assert first["messages"][0]["role"] == "system"


def test_demo_rejects_bad_sizes(tmp_path, capsys):
    assert main(["demo", "--out", str(tmp_path), "--groups", "0"]) == 2
    assert "--groups" in capsys.readouterr().err
