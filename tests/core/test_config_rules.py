"""Every key of the trainer's ``credit`` node is type-checked and range-checked.

One row per key: a value that is accepted (and reaches the setting unchanged), a value of the
wrong type (a number or a boolean given as a string, a float for a count, ...) and a value out of
range (``None`` where a type has no range: a switch is true or false). The table must list
exactly the keys of the settings dataclasses, so a key added without a row fails here; a key
added without a rule fails at once (:func:`verl_credit.config_rules.rule_of`); a key whose rule
lets a wrong value through fails its row. Errors name the key and the allowed range.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import pytest

from verl_credit.annotate.defaults import LLM_ONLY_SETTINGS
from verl_credit.config import CreditConfig
from verl_credit.config_rules import PluginSections, Section, Switch, Weights, check_fields, rule_of, setting
from verl_credit.verl.settings import CreditSettings, load_settings

INF, NAN = math.inf, math.nan

# key -> (accepted, wrong type, out of range or None)
TABLE: dict[str, tuple[Any, Any, Any]] = {
    "credit.estimator": ("grpo", 3, "reinforce"),
    "credit.norm_adv_by_std_in_grpo": (False, "false", None),
    "credit.epsilon": (1e-5, "1e-6", 0),
    "credit.layout": ("per_request", 1, "interleaved"),
    "credit.iapo.beta_plus": (0.3, "0.3", -0.1),
    "credit.iapo.clip_c": (0.5, "0.5", 11.0),
    "credit.iapo.neg_route": ("projected", 1, "sideways"),
    "credit.iapo.beta_minus": (0.2, True, 10.5),
    "credit.iapo.eps": (1e-5, None, 0.0),
    "credit.gigpo.step_advantage_w": (0.5, "1", 2e6),
    "credit.gigpo.gamma": (0.9, "0.9", 0.0),
    "credit.gigpo.mode": ("mean_std_norm", 1, "median"),
    "credit.gigpo.state": ("last_observation", 1, "suffix"),
    "credit.gigpo.eps": (1e-4, "1e-4", -1e-6),
    "credit.turn_reward.lambda_turn": (0.5, "0.5", INF),
    "credit.turn_reward.gamma": (0.9, "1", 1.5),
    "credit.info_gain.weight": (0.2, "0.1", -0.1),
    "credit.info_gain.gate_temperature": (0.1, "0.05", 0.0),
    "credit.info_gain.normalize": (False, "false", None),
    "credit.info_gain.placeholder": ("Nothing.", 3, ""),
    "credit.info_gain.eps": (1e-5, "1e-6", 0.0),
    "credit.call_credit.mode": ("paper", 1, "exact"),
    "credit.call_credit.smoothing": (0.0, "1", -1.0),
    "credit.call_credit.gamma": (0.9, "0.95", 0.0),
    "credit.call_credit.alpha": (0.25, "0", 1.5),
    "credit.call_credit.omega.AE": (2.0, "1.0", 0.0),
    "credit.call_credit.omega.IG": (0.5, None, -0.6),
    "credit.call_credit.omega.RV": (0.3, [0.4], NAN),
    "credit.call_credit.rv_reward": ("literal", False, "on"),
    "credit.call_credit.kappa": (0.2, "0.1", -0.1),
    "credit.call_credit.counterfactual.enabled": (True, "false", None),
    "credit.call_credit.counterfactual.budget": (8, 4.0, -1),
    "credit.call_credit.counterfactual.eta": (0.25, "0.5", -0.5),
    "credit.call_credit.counterfactual.factor_floor": (0.01, "0.001", 0.0),
    "credit.call_credit.counterfactual.proposer": ("remove", 1, ""),
    "credit.call_credit.counterfactual.concurrency": (2, "4", 0),
    "credit.call_credit.counterfactual.timeout": (60.0, "300", INF),
    "credit.call_credit.ig_downweight.enabled": (True, 1, None),
    "credit.call_credit.ig_downweight.budget": (2, "4", -1),
    "credit.call_credit.ig_downweight.theta_ig": (0.25, "0.5", NAN),
    "credit.call_credit.ig_downweight.factor": (0.75, "0.5", 1.5),
    "credit.call_credit.adaptive_omega.enabled": (True, "true", None),
    "credit.call_credit.adaptive_omega.rho": (0.2, "0.1", 1.5),
    "credit.call_credit.adaptive_omega.ema_beta": (0.3, "0.1", 0.0),
    "credit.call_credit.adaptive_omega.omega_min": (0.2, "0.1", 0.0),
    "credit.call_credit.adaptive_omega.omega_max": (1.5, "2", 0.05),  # below omega_min
    "credit.call_credit.dpo_export.path": ("/tmp/pairs.jsonl", 5, ""),
    "credit.call_credit.dpo_export.theta_ae": (0.1, "0", -0.1),
    "credit.annotator.name": ("hybrid", 5, ""),
    "credit.annotator.in_rollout": (False, "false", None),
    "credit.annotator.base_urls": (["http://a:8000/v1"], [5], [""]),
    "credit.annotator.model": ("served", 5, ""),
    "credit.annotator.timeout": (30.0, "30", INF),
    "credit.annotator.concurrency": (4, 4.0, 0),
    "credit.annotator.max_retries": (1, "3", 101),
    "credit.annotator.fallback": ("uniform", 1, "guess"),
    "credit.annotator.cache_path": ("/tmp/graphs.sqlite", 5, ""),
    "credit.annotator.in_validation": (True, "no", None),
    "credit.annotator.deadline": (30.5, "300", 0),
    "credit.annotator.max_model_len": (8192, 8192.0, -1),
    "credit.annotator.max_prompt_tokens": (4096, "4096", 0),
    "credit.annotator.trust_env": (True, 1, None),
    "credit.annotator.max_fallback_rate": (0.5, "0.2", 1.5),
    "credit.annotator.fallback_window": (3, 5.0, 0),
    "credit.annotator.stop_on_fallback": (True, "false", None),
    "credit.session.deadline": (600.0, "1800", 0),
    "credit.session.max_failed_share": (0.5, "0.25", 1.0),
    "credit.session.probe_endpoints": (False, "true", None),
    "credit.session.probe_timeout": (5.0, "10", INF),
    "credit.user.name": ("scripted", 1, "robot"),
    "credit.user.base_url": ("http://u:8001/v1", 5, ""),
    "credit.user.model": ("user-model", 5, ""),
    "credit.user.api_key_env": ("USER_KEY", 5, ""),
    "credit.user.instructions": ("you want a refund", 5, None),  # any text, even empty
    "credit.user.temperature": (0.7, "0.7", -0.1),
    "credit.user.max_tokens": (64, "64", 0),
    "credit.user.timeout": (5.0, "5", 0.0),
    "credit.user.max_retries": (0, 1.5, -1),
    "credit.user.max_turns": (3, "10", -1),
    "credit.user.stop_token": ("DONE", 5, ""),
    "credit.user.script": (["card", "yes"], "card", [""]),
    "credit.user.trust_env": (True, "true", None),
    "credit.env.name": ("service", 5, ""),
    "credit.env.options": ({"variant": "refund"}, "variant=refund", {1: "refund"}),
    "credit.debug.dump_dir": ("/tmp/credit_dumps", 5, ""),
    "credit.viz.every_n_steps": (5, "10", -1),
    "credit.viz.rollouts": (2, 4.0, 0),
    "credit.viz.dir": ("/tmp/credit_viz", 5, ""),
}

# what a row's key needs beside it to be valid at all (cross-key rules)
#: an LLM annotator (what its own settings need: the rules annotator refuses them)
LLM_ANNOTATOR = {
    "credit.annotator.name": "llm",
    "credit.annotator.base_urls": ["http://a:8000/v1"],
    "credit.annotator.model": "m",
}
CONTEXT: dict[str, dict[str, Any]] = {
    "credit.call_credit.dpo_export.path": {"credit.call_credit.counterfactual.enabled": True},
    "credit.annotator.name": {"credit.annotator.base_urls": ["http://a:8000/v1"], "credit.annotator.model": "m"},
    **{f"credit.annotator.{key}": LLM_ANNOTATOR for key in LLM_ONLY_SETTINGS},
}


def _leaf_keys(kind: type, prefix: str) -> set[str]:
    keys: set[str] = set()
    for item in dataclasses.fields(kind):
        rule = rule_of(kind, item.name)  # raises for a field declared without a rule
        key = f"{prefix}.{item.name}"
        if isinstance(rule, Section):
            # CreditSettings.credit holds the math keys at the top level of the node
            keys |= _leaf_keys(rule.kind, prefix if (kind, item.name) == (CreditSettings, "credit") else key)
        elif isinstance(rule, Weights):
            keys |= {f"{key}.{name}" for name in rule.names}
        elif isinstance(rule, PluginSections):
            continue  # plug-in estimators' sections (credit.<section>): none is installed here
        else:
            keys.add(key)
    return keys


def _values(assignments: Mapping[str, Any]) -> dict[str, Any]:
    """``{"credit.a.b": v}`` -> the ``credit`` mapping ``{"a": {"b": v}}``."""
    root: dict[str, Any] = {}
    for key, value in assignments.items():
        *parents, leaf = key.split(".")[1:]
        node = root
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return root


def _load(key: str, value: Any) -> CreditSettings:
    values = _values({**CONTEXT.get(key, {}), key: value})
    if key.startswith("credit.call_credit.omega."):  # omega is one mapping: the other roles stay valid
        values["call_credit"]["omega"] = {"AE": 1.0, "IG": 0.6, "RV": 0.4, **values["call_credit"]["omega"]}
    return load_settings(values)


def _read(settings: CreditSettings, key: str) -> Any:
    parts = key.split(".")[1:]
    runtime = {f.name for f in dataclasses.fields(CreditSettings)} - {"credit"}
    node: Any = settings if parts[0] in runtime else settings.credit
    for part in parts:
        node = node[part] if isinstance(node, Mapping) else getattr(node, part)
    return node


def test_the_table_lists_every_key_of_the_settings() -> None:
    assert _leaf_keys(CreditSettings, "credit") == set(TABLE), "every credit.* key needs a row here"


@pytest.mark.parametrize("key", sorted(TABLE))
def test_the_accepted_value_reaches_the_setting(key: str) -> None:
    accepted = TABLE[key][0]
    value = _read(_load(key, accepted), key)
    expected = tuple(accepted) if isinstance(accepted, list) else accepted
    assert value == expected and type(value) is type(expected), (value, expected)


def _refusal(key: str, value: Any) -> str:
    with pytest.raises(ValueError) as caught:
        _load(key, value)
    return str(caught.value)


@pytest.mark.parametrize("key", sorted(TABLE))
def test_a_value_of_the_wrong_type_is_refused_naming_the_key(key: str) -> None:
    message = _refusal(key, TABLE[key][1])
    assert key in message and "must be" in message and "got" in message, message


@pytest.mark.parametrize("key", sorted(k for k, row in TABLE.items() if row[2] is not None))
def test_a_value_out_of_range_is_refused_naming_the_key_and_the_range(key: str) -> None:
    message = _refusal(key, TABLE[key][2])
    assert key in message and "must be" in message and "got" in message, message


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("credit.epsilon", 0, "credit.epsilon must be a finite number in (0, 1], got 0"),
        ("credit.epsilon", -1.0, "credit.epsilon must be a finite number in (0, 1], got -1.0"),
        ("credit.annotator.timeout", INF, "credit.annotator.timeout must be a finite number in (0, 86400], got inf"),
        ("credit.annotator.deadline", 1e300, "in (0, 86400] or null (no deadline), got 1e+300"),
        ("credit.annotator.max_model_len", -1, "[0, 16777216] (0: no context budget) or null (ask the server's"),
        ("credit.user.timeout", 0.0, "credit.user.timeout must be a finite number in (0, 86400], got 0.0"),
        ("credit.call_credit.counterfactual.budget", 4.0, "budget must be an integer in [0, 4096], got 4.0"),
        ("credit.iapo.clip_c", "0.5", "credit.iapo.clip_c must be a finite number in [0, 10], got '0.5'"),
        ("credit.annotator.in_rollout", "false", "credit.annotator.in_rollout must be true or false, got 'false'"),
        ("credit.call_credit.omega.AE", 0.0, "credit.call_credit.omega.AE must be a finite number in (0, 1000000]"),
    ],
)
def test_messages_state_the_allowed_range(key: str, value: Any, message: str) -> None:
    assert message in _refusal(key, value)


def _rule_of_key(key: str) -> Any:
    parts = key.split(".")[1:]
    kind: type = CreditSettings
    if parts[0] not in {f.name for f in dataclasses.fields(CreditSettings)} - {"credit"}:
        kind = CreditConfig
    for part in parts[:-1]:
        rule = rule_of(kind, part)
        if isinstance(rule, Weights):
            return rule.each
        assert isinstance(rule, Section)
        kind = rule.kind
    return rule_of(kind, parts[-1])


SWITCHES = sorted(k for k in TABLE if isinstance(_rule_of_key(k), Switch))


@pytest.mark.parametrize("value", ["false", "true", "False", 0, 1, None])
@pytest.mark.parametrize("key", SWITCHES)
def test_a_switch_is_a_real_boolean(key: str, value: Any) -> None:
    assert f"{key} must be true or false" in _refusal(key, value)


def test_switches_are_found() -> None:
    assert "credit.norm_adv_by_std_in_grpo" in SWITCHES and "credit.annotator.in_rollout" in SWITCHES


def test_a_field_without_a_rule_is_a_programming_error() -> None:
    @dataclasses.dataclass(frozen=True)
    class Loose:
        checked: int = setting(1, _rule_of_key("credit.viz.rollouts"))
        unchecked: int = 2

    with pytest.raises(TypeError, match=r"Loose\.unchecked declares no rule"):
        check_fields(Loose(), "credit.loose")


@pytest.mark.parametrize("key", LLM_ONLY_SETTINGS)
def test_the_rule_annotator_refuses_a_setting_only_an_llm_reads(key: str) -> None:
    """Set off its default, an LLM-only key with ``credit.annotator.name=rules`` is an error naming
    it (it would be dropped), as ``verl-credit annotate --annotator rules --model m`` is."""
    accepted = TABLE[f"credit.annotator.{key}"][0]
    with pytest.raises(ValueError) as caught:
        load_settings(_values({f"credit.annotator.{key}": accepted}))  # the default annotator: rules
    assert f"credit.annotator.{key} applies to the llm and hybrid annotators, not 'rules'" in str(caught.value)
    with_llm = _read(_load(f"credit.annotator.{key}", accepted), f"credit.annotator.{key}")
    assert with_llm == (tuple(accepted) if isinstance(accepted, list) else accepted)


def test_a_limit_is_switched_off_only_by_its_documented_value() -> None:
    llm = {"name": "llm", "base_urls": ["http://a:8000/v1"], "model": "m"}
    annotator = {**llm, "deadline": None, "max_model_len": 0}
    settings = load_settings({"annotator": annotator, "viz": {"every_n_steps": 0}})
    assert settings.annotator.deadline is None and settings.annotator.max_model_len == 0
    assert settings.viz.every_n_steps == 0
    for key, value in [
        ("credit.annotator.deadline", INF),
        ("credit.annotator.timeout", 0),
        ("credit.annotator.timeout", -1.0),
        ("credit.user.timeout", NAN),
        ("credit.call_credit.counterfactual.timeout", 0.0),
        ("credit.annotator.max_model_len", -1),
        ("credit.annotator.max_retries", 10**9),
        ("credit.annotator.concurrency", 10**6),
        ("credit.user.max_turns", 10**9),
    ]:
        assert key in _refusal(key, value)


def test_credit_epsilon_keeps_the_advantage_sign_and_finite() -> None:
    for bad in (-1.0, 0.0, NAN, "1e-6"):
        with pytest.raises(ValueError, match=r"credit\.epsilon must be"):
            CreditConfig(epsilon=bad)


def test_the_rule_fallback_of_llm_settings_is_a_valid_rule_annotator() -> None:
    """The trainer's fallback for a timed-out LLM annotation builds rule settings from the LLM ones:
    the LLM-only keys go back to their defaults (else the rule annotator would refuse them)."""
    llm = load_settings(
        {"annotator": {"name": "llm", "base_urls": ["http://a:8000/v1"], "model": "m", "timeout": 30.0}}
    ).annotator
    rules = llm.rule_fallback()
    assert rules.name == "rules" and rules.cache_path is None
    assert rules.base_urls == () and rules.model is None and rules.timeout != 30.0
    assert rules.fallback == llm.fallback and rules.deadline == llm.deadline  # what the rules path reads stays
