"""Third-party estimators through the ``verl_credit.estimators`` entry-point group.

A plug-in package is written to a temporary folder with its own ``*.dist-info`` (METADATA and
entry_points.txt, what ``pip install`` leaves in site-packages) and put on the import path, so
``importlib.metadata`` finds it exactly as it finds an installed distribution. Nothing in
verl-credit's files names it: it must show up in ``verl-credit route --help``, route a rollouts file,
run through the offline pipeline and the credit trainer's advantage step; a broken or clashing
plug-in stops at start-up with a message naming it. A plug-in with a setting of its own (its
settings dataclass) gets the trainer's ``credit.<section>.<key>`` and the route command's
``--<section>-<key>`` from it, validated with messages that name the key.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from verl_credit.estimators import registry

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "rollouts.jsonl"
PACKAGE = "credit_plugin_demo"
DISTRIBUTION = "credit-plugin-demo"

# Registers itself on import (entry point names the module).
LAST_ACTION = '''
import torch

from verl_credit.estimators.registry import ActionCredit, Estimator, register_estimator


@register_estimator
class LastActionCredit(Estimator):
    """All of A_tau on the last real action's tokens; sum_i L_i w_i = L."""

    name = "last_action"
    needs = frozenset()

    def action_credit(self, advantage, lengths, valid, inputs, config) -> ActionCredit:
        position = torch.cumsum(valid.to(torch.int64), dim=1)
        last = valid & (position == position[:, -1:])
        total = lengths.sum(dim=1, keepdim=True)
        last_length = (lengths * last).sum(dim=1, keepdim=True)
        weight = torch.where(last, total / last_length.clamp_min(1e-12), torch.zeros_like(lengths))
        return ActionCredit(torch.where(last_length > 0, weight, valid.to(torch.float64)))
'''

# A plain class (entry point names ``module:Class``); the registry registers it.
FIRST_ACTION = '''
import torch

from verl_credit.estimators.registry import ActionCredit, Estimator


class FirstActionCredit(Estimator):
    """All of A_tau on the first action's tokens; sum_i L_i w_i = L."""

    name = "first_action"
    needs = frozenset()

    def action_credit(self, advantage, lengths, valid, inputs, config) -> ActionCredit:
        first = torch.zeros_like(valid)
        first[:, 0] = valid[:, 0]
        total = lengths.sum(dim=1, keepdim=True)
        first_length = lengths[:, :1]
        weight = torch.where(first, total / first_length.clamp_min(1e-12), torch.zeros_like(lengths))
        return ActionCredit(torch.where(first_length > 0, weight, valid.to(torch.float64)))
'''


# An estimator with a setting of its own: its section credit.recency, flag --recency-decay.
RECENCY = '''
from dataclasses import dataclass

import torch

from verl_credit.config_rules import Number, check_fields, setting
from verl_credit.estimators.registry import ActionCredit, Estimator, register_estimator


@dataclass(frozen=True)
class RecencySettings:
    """Later actions get more of A_tau."""

    decay: float = setting(0.9, Number(0.0, 1.0, low_open=True))
    """Weight of an action relative to the next one."""

    def __post_init__(self) -> None:
        check_fields(self, "credit.recency")


@register_estimator
class RecencyCredit(Estimator):
    """w_i proportional to decay^(T - 1 - i), rescaled so that sum_i L_i w_i = L."""

    name = "recency"
    settings = RecencySettings

    def action_credit(self, advantage, lengths, valid, inputs, config) -> ActionCredit:
        decay = self.settings_of(config).decay
        count = valid.sum(dim=1, keepdim=True)
        position = torch.arange(valid.shape[1]).unsqueeze(0)
        raw = torch.where(valid, decay ** (count - 1 - position).to(torch.float64), torch.zeros_like(lengths))
        mass = (lengths * raw).sum(dim=1, keepdim=True)
        weight = raw * lengths.sum(dim=1, keepdim=True) / mass.clamp_min(1e-300)
        return ActionCredit(torch.where(mass > 0, weight, valid.to(torch.float64)))
'''
PLUGIN_NAMES = ("last_action", "first_action", "recency")


def write_plugin(root: Path, modules: dict[str, str], entry_points: dict[str, str]) -> Path:
    """A distribution ``credit-plugin-demo`` under ``root``: the package's modules and a dist-info
    declaring ``entry_points`` in the ``verl_credit.estimators`` group."""
    package = root / PACKAGE
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    for module, source in modules.items():
        (package / f"{module}.py").write_text(source)
    info = root / f"{PACKAGE}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {DISTRIBUTION}\nVersion: 0.1\n")
    lines = [f"[{registry.ENTRY_POINT_GROUP}]", *(f"{name} = {value}" for name, value in entry_points.items())]
    (info / "entry_points.txt").write_text("\n".join(lines) + "\n")
    return root


def demo_plugin(root: Path) -> Path:
    return write_plugin(
        root,
        {"last_action": LAST_ACTION, "first_action": FIRST_ACTION, "recency": RECENCY},
        {
            "last_action": f"{PACKAGE}.last_action",
            "first_action": f"{PACKAGE}.first_action:FirstActionCredit",
            "recency": f"{PACKAGE}.recency",
        },
    )


def run_cli(plugin_root: Path, *arguments: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(plugin_root), os.environ.get("PYTHONPATH", "")])}
    env.pop("VERL_CREDIT_ESTIMATORS", None)
    return subprocess.run(
        [sys.executable, "-m", "verl_credit.cli.main", *arguments],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.fixture
def installed_plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The demo plug-in on this process's import path, with the registry reloaded to find it; the
    plug-in's estimators and modules are gone again afterwards."""
    root = demo_plugin(tmp_path / "site")
    monkeypatch.syspath_prepend(str(root))
    monkeypatch.delenv("VERL_CREDIT_ESTIMATORS", raising=False)
    registry.estimator_names()  # the built-ins are registered before the plug-in is looked up
    monkeypatch.setattr(registry, "_loaded", False)
    yield root
    for name in PLUGIN_NAMES:
        registry._REGISTRY.pop(name, None)
    for module in [m for m in sys.modules if m == PACKAGE or m.startswith(f"{PACKAGE}.")]:
        del sys.modules[module]


def _weights(path: Path) -> list[tuple[list[float], list[int]]]:
    """Weights and lengths of the routed lines (``A_tau != 0``: where ``A = 0`` every weight is 1)."""
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    routed = [line for line in lines if line["trajectory_advantage"] != 0]
    assert routed
    return [([a["weight"] for a in line["actions"]], [a["length"] for a in line["actions"]]) for line in routed]


@pytest.mark.parametrize(("estimator", "place"), [("last_action", -1), ("first_action", 0)])
def test_an_installed_plugin_is_a_route_choice_and_routes_a_file(tmp_path: Path, estimator: str, place: int) -> None:
    root = demo_plugin(tmp_path / "site")
    helped = run_cli(root, "route", "--help")
    assert helped.returncode == 0, helped.stderr
    assert estimator in helped.stdout
    out = tmp_path / "credit.jsonl"
    done = run_cli(root, "route", "--input", str(EXAMPLES), "--out", str(out), "--estimator", estimator)
    assert done.returncode == 0, done.stderr
    for weights, lengths in _weights(out):
        # the whole token mass on one action, the others 0
        assert weights[place] == pytest.approx(sum(lengths) / lengths[place])
        assert all(w == 0 for i, w in enumerate(weights) if i != place % len(weights))


def test_without_the_plugin_the_name_is_refused(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    done = run_cli(tmp_path / "empty", "route", "--input", str(EXAMPLES), "--out", str(tmp_path / "c.jsonl"))
    assert done.returncode == 0, done.stderr  # the default estimator still works
    refused = run_cli(tmp_path / "empty", "route", "--input", str(EXAMPLES), "--estimator", "last_action")
    assert refused.returncode == 2 and "invalid choice: 'last_action'" in refused.stderr


def test_a_plugin_runs_through_the_pipeline_and_the_trainer_advantage_step(installed_plugin: Path) -> None:
    from verl_credit.config import CreditConfig
    from verl_credit.graph import InfluenceGraph
    from verl_credit.io import load_trajectories
    from verl_credit.pipeline import route_trajectories
    from verl_credit.verl.credit_step import compute_credit_advantages
    from verl_credit.verl.settings import load_settings

    assert {"last_action", "first_action"} <= set(registry.estimator_names())

    trajectories = [trajectory for _, trajectory in load_trajectories(EXAMPLES)]
    routed = route_trajectories(trajectories, CreditConfig(estimator="last_action"))
    checked = 0
    for row, trajectory in enumerate(trajectories):
        if routed.credit.trajectory_advantage[row] == 0:
            continue
        weights = routed.credit.weights_of(row)
        assert weights[:-1] == [0.0] * (len(weights) - 1) and weights[-1] > 0, trajectory.id
        checked += 1
    assert checked > 0

    # the trainer's step: two sessions of one group, actions at tokens [0, 2) and [3, 5)
    mask = torch.tensor([[1, 1, 0, 1, 1, 0]] * 2)
    scores = torch.zeros(mask.shape)
    scores[:, 4] = torch.tensor([1.0, 0.0])
    messages = [
        {"role": "user", "content": "refund #W12"},
        {"role": "assistant", "content": "Which refund?"},
        {"role": "user", "content": "card"},
        {"role": "assistant", "content": "Done."},
    ]
    payload = {
        "spans": [[0, 0, 2], [1, 3, 5]],
        "num_actions": 2,
        "messages": messages,
        "graph": InfluenceGraph.uniform(2).to_json(),
    }
    keys = ["g_0_0", "g_1_0"]
    step = compute_credit_advantages(
        keys,
        [{}, {}],
        ["g", "g"],
        [{"credit": payload}, {"credit": payload}],
        mask,
        mask.clone(),
        scores,
        load_settings({"estimator": "last_action"}),
    )
    advantages = step.advantages
    assert torch.count_nonzero(advantages[:, :3]) == 0  # the first action gets nothing
    assert (advantages[0, 3:5] > 0).all() and (advantages[1, 3:5] < 0).all()
    # mass conservation: the token sum equals A_tau times the trained tokens
    assert advantages[0].sum().item() == pytest.approx(-advantages[1].sum().item())


def test_a_broken_plugin_stops_at_start_up_naming_it(tmp_path: Path) -> None:
    root = write_plugin(
        tmp_path / "site",
        {"broken": "import a_module_that_is_not_installed\n"},
        {"broken_credit": f"{PACKAGE}.broken"},
    )
    done = run_cli(root, "route", "--input", str(EXAMPLES))
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert "estimator plug-in broken_credit" in done.stderr and DISTRIBUTION in done.stderr
    assert "a_module_that_is_not_installed" in done.stderr


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (f"{PACKAGE}.clash:IAPOAgain", "'iapo' is already registered"),
        (f"{PACKAGE}.clash:NOT_AN_ESTIMATOR", "not a module or an Estimator subclass"),
    ],
)
def test_a_plugin_that_clashes_or_names_no_estimator_is_refused(tmp_path: Path, value: str, message: str) -> None:
    clash = (
        "from verl_credit.estimators.registry import Estimator\n\n"
        "class IAPOAgain(Estimator):\n    name = 'iapo'\n\n"
        "NOT_AN_ESTIMATOR = 3\n"
    )
    root = write_plugin(tmp_path / "site", {"clash": clash}, {"clash": value})
    done = run_cli(root, "route", "--input", str(EXAMPLES))
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "estimator plug-in clash" in done.stderr and message in done.stderr


def _recency_weights(count: int, lengths: list[int], decay: float) -> list[float]:
    raw = [decay ** (count - 1 - i) for i in range(count)]
    mass = sum(length * r for length, r in zip(lengths, raw, strict=True))
    return [r * sum(lengths) / mass for r in raw]


def test_a_plugin_setting_is_a_route_flag_checked_by_its_rule(tmp_path: Path) -> None:
    root = demo_plugin(tmp_path / "site")
    helped = run_cli(root, "route", "--help")
    assert helped.returncode == 0, helped.stderr
    assert "credit.recency:" in helped.stdout and "--recency-decay" in helped.stdout
    assert "Weight of an action relative to the next one" in helped.stdout  # the field's docstring
    for decay in (0.9, 0.5):  # the default, then the flag
        out = tmp_path / f"credit-{decay}.jsonl"
        flags = [] if decay == 0.9 else ["--recency-decay", str(decay)]
        done = run_cli(root, "route", "--input", str(EXAMPLES), "--out", str(out), "--estimator", "recency", *flags)
        assert done.returncode == 0, done.stderr
        for weights, lengths in _weights(out):
            assert weights == pytest.approx(_recency_weights(len(weights), lengths, decay), rel=1e-9)
    refused = run_cli(root, "route", "--input", str(EXAMPLES), "--out", str(out), "--estimator", "recency",
                      "--recency-decay", "1.5")  # fmt: skip
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert "credit.recency.decay must be a finite number in (0, 1], got 1.5" in refused.stderr


def test_a_plugin_setting_is_a_trainer_key_through_the_pipeline_and_the_advantage_step(
    installed_plugin: Path,
) -> None:
    from verl_credit.config import CreditConfig
    from verl_credit.io import load_trajectories
    from verl_credit.pipeline import route_trajectories
    from verl_credit.verl.credit_step import compute_credit_advantages
    from verl_credit.verl.settings import load_settings

    trajectories = [trajectory for _, trajectory in load_trajectories(EXAMPLES)]
    config = CreditConfig.from_mapping({"estimator": "recency", "recency": {"decay": 0.5}})
    assert config.section("recency").decay == 0.5
    assert CreditConfig.from_mapping(config.to_mapping()) == config  # what a step dump keeps, read back
    assert CreditConfig(estimator="recency").section("recency").decay == 0.9  # not given: the default
    routed = route_trajectories(trajectories, config)
    checked = 0
    for row, trajectory in enumerate(trajectories):
        if routed.credit.trajectory_advantage[row] != 0:
            weights = routed.credit.weights_of(row)
            assert weights == pytest.approx(_recency_weights(len(weights), trajectory.action_lengths, 0.5), rel=1e-9)
            checked += 1
    assert checked > 0

    # the trainer's settings: credit.recency.decay (+credit.recency.decay=0.5 on a Hydra command line)
    settings = load_settings({"estimator": "recency", "recency": {"decay": 0.5}})
    assert settings.credit.section("recency").decay == 0.5
    with pytest.raises(ValueError, match=r"credit\.recency\.decay must be a finite number in \(0, 1\], got 0"):
        load_settings({"estimator": "recency", "recency": {"decay": 0}})
    with pytest.raises(ValueError, match=r"unknown key\(s\) credit\.recency\.half_life"):
        load_settings({"estimator": "recency", "recency": {"half_life": 3}})

    # the trainer's step: one session of two actions at tokens [0, 2) and [3, 6), a group of two
    mask = torch.tensor([[1, 1, 0, 1, 1, 1]] * 2)
    scores = torch.zeros(mask.shape)
    scores[:, 5] = torch.tensor([1.0, 0.0])
    payload = {"spans": [[0, 0, 2], [1, 3, 6]], "num_actions": 2}
    step = compute_credit_advantages(
        ["g_0_0", "g_1_0"],
        [{}, {}],
        ["g", "g"],
        [{"credit": payload}, {"credit": payload}],
        mask,
        mask.clone(),
        scores,
        settings,
    )
    first, second = _recency_weights(2, [2, 3], 0.5)
    advantage = float(step.credit.trajectory_advantage[0])
    assert step.advantages[0, :2].tolist() == pytest.approx([advantage * first] * 2, rel=1e-6)
    assert step.advantages[0, 3:6].tolist() == pytest.approx([advantage * second] * 3, rel=1e-6)
    assert step.advantages[0, 2] == 0


def test_a_plugin_estimator_gets_a_guard_in_verls_registry(installed_plugin: Path) -> None:
    """Selected through verl's stock trainer, a plug-in estimator says what to set (as iapo does)."""
    from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY

    from verl_credit.verl import estimators as guards

    try:
        assert "recency" in guards.register_guards()
        with pytest.raises(ValueError, match=r"algorithm\.adv_estimator=recency needs the verl-credit trainer"):
            ADV_ESTIMATOR_REGISTRY["recency"]()
        assert {"iapo", "call_credit", "gigpo", "turn_reward", "info_gain"} <= set(guards.GUARDS)
        assert "grpo" not in guards.GUARDS  # verl's own
    finally:
        for name in PLUGIN_NAMES:
            guards.GUARDS.pop(name, None)
            ADV_ESTIMATOR_REGISTRY.pop(name, None)
