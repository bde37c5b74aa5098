"""The ``credit`` Hydra node, its validation, and the start-up checks of both entry points.

* the credit config composes with verl's ``ppo_trainer`` and every ``credit.*`` key is
  overridable on the command line without ``+``;
* bad values are rejected with a ``ValueError`` naming the key, and ``python -m verl_credit.main``
  exits non-zero with the key on stderr before Ray starts;
* a credit estimator selected with a trainer that cannot supply graphs fails at start-up, both
  through ``python -m verl_credit.main`` and through verl's own ``python -m verl.trainer.main_ppo``
  (the plugin puts the check in front of verl's ``validate_config``), and the legacy-registry
  estimators fail with the same message when called;
* the yaml's ``credit`` node states exactly the dataclasses' defaults;
* start-up checks of the cluster setup: an annotation cache on a network filesystem shared by
  several nodes is refused (a fake ``/proc/mounts``), and a ``wandb`` logger without credentials
  exits 2 before Ray starts.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from verl_helpers import compose_credit_config

from verl_credit.verl.settings import load_settings

#: slow: Hydra composes of the full trainer config and entry-point subprocesses
pytestmark = pytest.mark.slow

# A valid non-default value for every leaf of the credit node (the test below fails when a key is
# added to the yaml without being listed here).
OVERRIDES: dict[str, tuple[str, object]] = {
    "credit.estimator": ("call_credit", "call_credit"),
    "credit.norm_adv_by_std_in_grpo": ("false", False),
    "credit.epsilon": ("1e-5", 1e-5),
    "credit.layout": ("per_request", "per_request"),
    "credit.iapo.beta_plus": ("0.3", 0.3),
    "credit.iapo.clip_c": ("0.5", 0.5),
    "credit.iapo.neg_route": ("projected", "projected"),
    "credit.iapo.beta_minus": ("0.2", 0.2),
    "credit.iapo.eps": ("1e-5", 1e-5),
    "credit.gigpo.step_advantage_w": ("0.5", 0.5),
    "credit.gigpo.gamma": ("0.9", 0.9),
    "credit.gigpo.mode": ("mean_std_norm", "mean_std_norm"),
    "credit.gigpo.state": ("last_observation", "last_observation"),
    "credit.gigpo.eps": ("1e-4", 1e-4),
    "credit.turn_reward.lambda_turn": ("0.5", 0.5),
    "credit.turn_reward.gamma": ("0.9", 0.9),
    "credit.info_gain.weight": ("0.3", 0.3),
    "credit.info_gain.gate_temperature": ("0.2", 0.2),
    "credit.info_gain.normalize": ("false", False),
    "credit.info_gain.placeholder": ("'Nothing here.'", "Nothing here."),
    "credit.info_gain.eps": ("1e-4", 1e-4),
    "credit.call_credit.mode": ("paper", "paper"),
    "credit.call_credit.smoothing": ("0.0", 0.0),
    "credit.call_credit.gamma": ("0.9", 0.9),
    "credit.call_credit.alpha": ("0.25", 0.25),
    "credit.call_credit.omega.AE": ("2.0", 2.0),
    "credit.call_credit.omega.IG": ("0.5", 0.5),
    "credit.call_credit.omega.RV": ("0.3", 0.3),
    "credit.call_credit.rv_reward": ("self_correction", "self_correction"),
    "credit.call_credit.kappa": ("0.2", 0.2),
    "credit.call_credit.counterfactual.enabled": ("true", True),
    "credit.call_credit.counterfactual.budget": ("8", 8),
    "credit.call_credit.counterfactual.eta": ("0.25", 0.25),
    "credit.call_credit.counterfactual.factor_floor": ("0.01", 0.01),
    "credit.call_credit.counterfactual.proposer": (
        "verl_credit.counterfactual_replay:RemoveCallProposer",
        "verl_credit.counterfactual_replay:RemoveCallProposer",
    ),
    "credit.call_credit.counterfactual.concurrency": ("2", 2),
    "credit.call_credit.counterfactual.timeout": ("60.0", 60.0),
    "credit.call_credit.ig_downweight.enabled": ("true", True),
    "credit.call_credit.ig_downweight.budget": ("2", 2),
    "credit.call_credit.ig_downweight.theta_ig": ("0.25", 0.25),
    "credit.call_credit.ig_downweight.factor": ("0.75", 0.75),
    "credit.call_credit.adaptive_omega.enabled": ("true", True),
    "credit.call_credit.adaptive_omega.rho": ("0.2", 0.2),
    "credit.call_credit.adaptive_omega.ema_beta": ("0.3", 0.3),
    "credit.call_credit.adaptive_omega.omega_min": ("0.2", 0.2),
    "credit.call_credit.adaptive_omega.omega_max": ("1.5", 1.5),
    "credit.call_credit.dpo_export.path": ("/tmp/dpo_pairs.jsonl", "/tmp/dpo_pairs.jsonl"),
    "credit.call_credit.dpo_export.theta_ae": ("0.1", 0.1),
    "credit.annotator.name": ("hybrid", "hybrid"),
    "credit.annotator.in_rollout": ("false", False),
    "credit.annotator.base_urls": ("[http://a:8000,http://b:8000]", ["http://a:8000", "http://b:8000"]),
    "credit.annotator.model": ("Qwen/Qwen3-32B", "Qwen/Qwen3-32B"),
    "credit.annotator.timeout": ("30.0", 30.0),
    "credit.annotator.concurrency": ("4", 4),
    "credit.annotator.max_retries": ("1", 1),
    "credit.annotator.fallback": ("uniform", "uniform"),
    "credit.annotator.cache_path": ("/tmp/graphs.sqlite", "/tmp/graphs.sqlite"),
    "credit.annotator.in_validation": ("true", True),
    "credit.annotator.deadline": ("30.5", 30.5),
    "credit.user.name": ("llm", "llm"),
    "credit.user.base_url": ("http://u:8001/v1", "http://u:8001/v1"),
    "credit.user.model": ("user-model", "user-model"),
    "credit.user.api_key_env": ("USER_KEY", "USER_KEY"),
    "credit.user.instructions": ("'you want a refund'", "you want a refund"),
    "credit.user.temperature": ("0.7", 0.7),
    "credit.user.max_tokens": ("64", 64),
    "credit.user.timeout": ("5.0", 5.0),
    "credit.user.max_retries": ("0", 0),
    "credit.user.max_turns": ("3", 3),
    "credit.user.stop_token": ("DONE", "DONE"),
    "credit.user.script": ("[card,yes]", ["card", "yes"]),
    "credit.user.trust_env": ("true", True),
    "credit.annotator.max_model_len": ("8192", 8192),
    "credit.annotator.max_prompt_tokens": ("4096", 4096),
    "credit.annotator.trust_env": ("true", True),
    "credit.env.name": ("service", "service"),
    "credit.debug.dump_dir": ("/tmp/credit_dumps", "/tmp/credit_dumps"),
    "credit.annotator.max_fallback_rate": ("0.5", 0.5),
    "credit.annotator.fallback_window": ("3", 3),
    "credit.annotator.stop_on_fallback": ("true", True),
    "credit.session.deadline": ("600.0", 600.0),
    "credit.session.max_failed_share": ("0.5", 0.5),
    "credit.session.probe_endpoints": ("false", False),
    "credit.session.probe_timeout": ("5.0", 5.0),
    "credit.viz.every_n_steps": ("5", 5),
    "credit.viz.rollouts": ("2", 2),
    "credit.viz.dir": ("/tmp/credit_viz", "/tmp/credit_viz"),
}


def _leaves(node, prefix: str = "credit") -> set[str]:
    keys = set()
    for key in node:
        value = node._get_node(key)
        path = f"{prefix}.{key}"
        if OmegaConf.is_dict(value) and len(value) > 0:
            keys |= _leaves(value, path)
        elif not (OmegaConf.is_dict(value) and len(value) == 0):  # credit.env.options: an open mapping
            keys.add(path)
    return keys


def test_credit_config_extends_verls_ppo_trainer():
    config = compose_credit_config()
    # verl's own tree is there, with our selections
    assert config.trainer.v1.trainer_mode == "credit_sync" and config.trainer.use_v1 is True
    assert config.actor_rollout_ref.rollout.agent.default_agent_loop == "credit_agent"
    assert config.algorithm.adv_estimator == "iapo" and "rollout_correction" in config.algorithm
    # credit.estimator / norm follow verl's algorithm keys by interpolation
    config = compose_credit_config(["algorithm.adv_estimator=call_credit", "algorithm.norm_adv_by_std_in_grpo=false"])
    settings = load_settings(config)
    assert settings.estimator == "call_credit" and settings.credit.norm_adv_by_std_in_grpo is False
    # the default settings
    settings = load_settings(compose_credit_config())
    assert (settings.credit.iapo.beta_plus, settings.credit.iapo.clip_c, settings.credit.iapo.neg_route) == (
        0.05,
        0.25,
        "error",
    )
    assert dict(settings.credit.call_credit.omega) == {"AE": 1.0, "IG": 0.6, "RV": 0.4}
    assert settings.layout == "merged" and settings.annotator.name == "rules" and settings.user.name == "env"


def test_every_credit_key_overridable_without_plus():
    config = compose_credit_config()
    assert _leaves(config.credit) == set(OVERRIDES), "OVERRIDES must list every leaf of the credit node"
    overrides = [f"{key}={text}" for key, (text, _) in OVERRIDES.items()]
    overrides.append("algorithm.adv_estimator=call_credit")  # keeps estimator and adv_estimator consistent
    overrides.append("algorithm.norm_adv_by_std_in_grpo=false")  # and the shared normalization key
    config = compose_credit_config(overrides)
    for key, (_, expected) in OVERRIDES.items():
        value = OmegaConf.select(config, key)
        value = OmegaConf.to_container(value) if OmegaConf.is_list(value) else value
        assert value == expected, key
    settings = load_settings(config)  # and the whole set is valid
    assert settings.credit.iapo.clip_c == 0.5 and settings.user.script == ("card", "yes")
    assert settings.credit.gigpo.state == "last_observation" and settings.credit.turn_reward.lambda_turn == 0.5
    assert settings.annotator.base_urls == ("http://a:8000", "http://b:8000") and settings.layout == "per_request"
    call = settings.credit.call_credit
    assert call.counterfactual.budget == 8 and call.adaptive_omega.omega_max == 1.5
    assert call.dpo_export.path == "/tmp/dpo_pairs.jsonl" and call.ig_downweight.factor == 0.75
    assert settings.debug.dump_dir == "/tmp/credit_dumps"
    assert settings.annotator.in_validation is True and settings.annotator.deadline == 30.5
    assert load_settings(compose_credit_config(["credit.annotator.deadline=null"])).annotator.deadline is None
    # an open mapping takes new keys with '+'
    config = compose_credit_config(["+credit.env.options.variant=refund"])
    assert load_settings(config).env.options == {"variant": "refund"}


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("credit.iapo.clip_c=-1", "credit.iapo.clip_c"),
        ("credit.iapo.neg_route=sideways", "credit.iapo.neg_route"),
        ("credit.call_credit.gamma=0", "credit.call_credit.gamma"),
        ("credit.call_credit.omega.AE=0", "credit.call_credit.omega.AE"),
        ("credit.call_credit.counterfactual.budget=-1", "credit.call_credit.counterfactual.budget"),
        ("credit.call_credit.counterfactual.proposer=oracle", "credit.call_credit.counterfactual.proposer"),
        ("credit.call_credit.adaptive_omega.omega_min=0", "credit.call_credit.adaptive_omega.omega_min"),
        ("credit.call_credit.ig_downweight.factor=0", "credit.call_credit.ig_downweight.factor"),
        ("credit.call_credit.dpo_export.path=/tmp/p.jsonl", "credit.call_credit.dpo_export.path"),
        ("credit.layout=interleaved", "credit.layout"),
        ("credit.annotator.fallback=guess", "credit.annotator.fallback"),
        ("credit.annotator.name=llm", "credit.annotator.base_urls"),
        ("credit.annotator.deadline=0", "credit.annotator.deadline"),
        ("credit.annotator.deadline=-5", "credit.annotator.deadline"),
        ("credit.annotator.deadline=soon", "credit.annotator.deadline"),
        ("credit.annotator.max_model_len=-1", "credit.annotator.max_model_len"),
        ("credit.annotator.max_prompt_tokens=0", "credit.annotator.max_prompt_tokens"),
        ("credit.user.trust_env=maybe", "credit.user.trust_env"),
        ("credit.annotator.in_validation=sometimes", "credit.annotator.in_validation"),
        ("credit.user.name=robot", "credit.user.name"),
        ("credit.user.name=llm", "credit.user.base_url"),
        ("credit.estimator=grpo", "algorithm.adv_estimator"),
    ],
)
def test_bad_values_name_the_key(override, key):
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        load_settings(compose_credit_config([override]))


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("credit.annotator.in_rollout='false'", "credit.annotator.in_rollout must be true or false, got 'false'"),
        ("credit.epsilon=-1", "credit.epsilon must be a finite number in (0, 1], got -1"),
        ("credit.epsilon=0", "credit.epsilon must be a finite number in (0, 1], got 0"),
        ("credit.iapo.clip_c='0.5'", "credit.iapo.clip_c must be a finite number in [0, 10], got '0.5'"),
        ("credit.annotator.timeout=inf", "credit.annotator.timeout must be a finite number in (0, 86400], got inf"),
        ("credit.user.timeout=0", "credit.user.timeout must be a finite number in (0, 86400], got 0"),
        ("credit.call_credit.counterfactual.budget=4.0", "budget must be an integer in [0, 4096], got 4.0"),
        ("algorithm.norm_adv_by_std_in_grpo='false'", "algorithm.norm_adv_by_std_in_grpo must be true or false"),
        ("credit.norm_adv_by_std_in_grpo=false", "set algorithm.norm_adv_by_std_in_grpo"),
    ],
)
def test_values_that_would_silently_change_training_are_refused(override, message):
    """Through Hydra: a quoted 'false' stays a (truthy) string, -1 flips the advantage sign, 0
    divides by zero, inf disables a timeout; the credit node and verl's own key must agree."""
    with pytest.raises(ValueError) as caught:
        load_settings(compose_credit_config([override]))
    assert message in str(caught.value)


def test_unknown_key_added_with_plus_is_rejected():
    with pytest.raises(ValueError, match=r"credit\.iapo\.beta"):
        load_settings(compose_credit_config(["+credit.iapo.beta=1"]))
    with pytest.raises(ValueError, match=r"credit\.call_credit\.counterfactual\.budgett"):
        load_settings(compose_credit_config(["+credit.call_credit.counterfactual.budgett=1"]))


def test_stock_config_without_credit_node_is_named():
    from hydra import compose, initialize_config_module

    with initialize_config_module(config_module="verl.trainer.config", version_base=None):
        config = compose(config_name="ppo_trainer")
    with pytest.raises(ValueError, match="config-name=credit_trainer"):
        load_settings(config)


def _run(cwd, *args: str, env: Mapping[str, str] | None = None) -> tuple[subprocess.Popen, float]:
    env = {**(os.environ if env is None else env), "HYDRA_FULL_ERROR": "0"}
    command = [sys.executable, "-m", *args]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=cwd)
    return process, time.perf_counter()


@pytest.mark.timeout(900)  # a hang guard: three verl imports at once take minutes on a loaded 2-core box
def test_entry_points_reject_bad_config_before_ray_starts(tmp_path):
    """Run concurrently: ``python -m verl_credit.main credit.iapo.clip_c=-1``, verl's stock
    ``python -m verl.trainer.main_ppo algorithm.adv_estimator=iapo`` (sync trainer), and
    ``python -m verl_credit.main`` with a wandb logger and no W&B credentials. All exit non-zero
    with the offending key / what to set, and none gets as far as starting Ray."""
    no_wandb = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_") and k not in ("NETRC", "HOME")}
    no_wandb["HOME"] = str(tmp_path)  # no ~/.netrc
    runs = {
        "clip_c": _run(tmp_path, "verl_credit.main", "credit.iapo.clip_c=-1"),
        "stock": _run(tmp_path, "verl.trainer.main_ppo", "algorithm.adv_estimator=iapo"),
        "wandb": _run(tmp_path, "verl_credit.main", "trainer.logger=[console,wandb]", env=no_wandb),
    }
    results = {}
    for name, (process, _) in runs.items():
        out, err = process.communicate(timeout=600)
        results[name] = (process.returncode, out, err)
    for name, (code, out, err) in results.items():
        assert code != 0, (name, (out + err)[-2000:])
        assert "Started a local Ray instance" not in out + err and "ray init kwargs" not in out + err, name
    code, _, err = results["clip_c"]
    assert code == 2 and "verl_credit.main: error: credit.iapo.clip_c must be a finite number in [0, 10], got -1" in err
    _, out, err = results["stock"]
    assert "algorithm.adv_estimator=iapo needs the verl-credit trainer" in out + err
    assert "trainer.v1.trainer_mode=credit_sync" in out + err
    code, _, err = results["wandb"]
    assert code == 2 and "verl_credit.main: error: trainer.logger=['console', 'wandb'] includes wandb" in err
    assert "WANDB_API_KEY" in err and "wandb login" in err


def test_trainer_selection_check():
    from verl_credit.verl.settings import check_trainer_selection

    check_trainer_selection(compose_credit_config())  # credit_sync: fine
    check_trainer_selection(compose_credit_config(["algorithm.adv_estimator=grpo", "trainer.v1.trainer_mode=sync"]))
    for bad in (["trainer.v1.trainer_mode=sync"], ["trainer.use_v1=false"]):
        with pytest.raises(ValueError, match=r"trainer\.v1\.trainer_mode=credit_sync"):
            check_trainer_selection(compose_credit_config(bad))


def test_plugin_wraps_verls_validate_config():
    import verl  # noqa: F401  (loads the plugin)
    import verl.utils.config as verl_config

    with pytest.raises(ValueError, match="needs the verl-credit trainer"):
        verl_config.validate_config(
            compose_credit_config(["trainer.v1.trainer_mode=sync"]), use_reference_policy=False, use_critic=False
        )


@pytest.mark.parametrize("name", ["iapo", "call_credit"])
def test_legacy_registry_estimators_explain_what_to_set(name):
    import verl  # noqa: F401
    from verl.trainer.ppo.core_algos import get_adv_estimator_fn

    estimator = get_adv_estimator_fn(name)
    with pytest.raises(ValueError, match=r"trainer\.v1\.trainer_mode=credit_sync"):
        estimator(token_level_rewards=torch.zeros(2, 3), response_mask=torch.ones(2, 3), config=None, index=["a", "a"])


def test_main_validates_then_hands_the_config_to_verls_run_ppo(monkeypatch):
    """``verl_credit.main`` runs verl's own pipeline (auto_set_device, validate_config, run_ppo with
    verl's V1 TaskRunner); ``run_ppo`` is replaced here because it would start Ray and GPUs."""
    import verl.trainer.main_ppo as main_ppo

    from verl_credit.verl.main import run

    calls = []
    monkeypatch.setattr(
        main_ppo, "run_ppo", lambda config, task_runner_class: calls.append((config, task_runner_class))
    )
    micro = [
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=1",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=1",
    ]
    config = compose_credit_config(micro)
    run(config)
    assert len(calls) == 1 and calls[0][0] is config and calls[0][1] is main_ppo.TaskRunnerV1
    with pytest.raises(ValueError, match=r"credit\.call_credit\.alpha"):
        run(compose_credit_config([*micro, "credit.call_credit.alpha=2"]))
    assert len(calls) == 1


# -- the yaml states the dataclasses' defaults ------------------------------------------------------


def _plain(value):
    if dataclasses.is_dataclass(value):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    return value


def test_yaml_credit_node_equals_the_dataclass_defaults():
    """Every key of the yaml's ``credit`` node (resolved: ``estimator`` and ``norm_adv_by_std_in_grpo``
    follow verl's ``algorithm`` defaults) equals the default of its dataclass field, and the node has
    exactly the dataclasses' keys: ``CreditConfig`` (the math) plus ``CreditSettings``' runtime parts."""
    from verl_credit.config import CreditConfig
    from verl_credit.verl.settings import (
        AnnotatorSettings,
        CreditSettings,
        DebugSettings,
        EnvSettings,
        SessionSettings,
        UserSettings,
        VizSettings,
    )

    runtime = {f.name: f for f in dataclasses.fields(CreditSettings) if f.name != "credit"}
    expected = _plain(CreditConfig().to_mapping())  # the keys of the node (no plug-in section here)
    expected["layout"] = runtime["layout"].default
    sections = {
        "annotator": AnnotatorSettings,
        "user": UserSettings,
        "env": EnvSettings,
        "debug": DebugSettings,
        "session": SessionSettings,
        "viz": VizSettings,
    }
    assert set(runtime) == {"layout", *sections}, "a new CreditSettings section needs a line here"
    for name, kind in sections.items():
        assert runtime[name].default_factory is kind
        expected[name] = _plain(kind())
    actual = OmegaConf.to_container(compose_credit_config().credit, resolve=True)

    def diff(a, b, path="credit"):
        if isinstance(a, dict) and isinstance(b, dict):
            out = [f"{path}.{k}: only in the yaml" for k in sorted(set(a) - set(b))]
            out += [f"{path}.{k}: missing from the yaml" for k in sorted(set(b) - set(a))]
            for k in sorted(set(a) & set(b)):
                out += diff(a[k], b[k], f"{path}.{k}")
            return out
        same = a == b and (isinstance(a, bool) == isinstance(b, bool))  # 1 == True must not pass
        return [] if same else [f"{path}: yaml {a!r} != default {b!r}"]

    assert diff(actual, expected) == []


# -- start-up checks: annotation cache location ------------------------------------------------------


def _mounts(tmp_path: Path, *lines: str) -> Path:
    path = tmp_path / "mounts"
    path.write_text("".join(line + "\n" for line in lines))
    return path


LOCAL_ROOT = "/dev/vda1 / ext4 rw,relatime 0 0"


@pytest.mark.parametrize("fs_type", ["nfs", "nfs4", "lustre", "gpfs", "cifs", "beegfs", "fuse.sshfs", "fuse"])
def test_cache_on_a_shared_network_fs_is_refused_for_several_nodes(tmp_path, fs_type):
    from verl_credit.verl.settings import check_cache_location

    mounts = _mounts(tmp_path, LOCAL_ROOT, f"server:/export /shared {fs_type} rw 0 0")
    config = compose_credit_config(["credit.annotator.cache_path=/shared/ckpt/run/graphs.sqlite", "trainer.nnodes=2"])
    with pytest.raises(ValueError, match=r"^credit\.annotator\.cache_path='/shared/ckpt/run/graphs\.sqlite'") as info:
        check_cache_location(config, mounts_path=mounts)
    message = str(info.value)
    assert f"({fs_type} mounted at /shared)" in message and "trainer.nnodes=2" in message
    assert "{hostname}" in message and "CACHE_DIR" in message
    # the same path on one node: a warning, not a refusal
    single = compose_credit_config(["credit.annotator.cache_path=/shared/ckpt/run/graphs.sqlite"])
    warning = check_cache_location(single, mounts_path=mounts)
    assert warning and warning.startswith("credit.annotator.cache_path=") and fs_type in warning


def test_cache_check_accepts_local_disk_per_node_files_and_no_cache(tmp_path):
    from verl_credit.verl.settings import check_cache_location

    mounts = _mounts(
        tmp_path,
        "server:/export /shared nfs4 rw 0 0",
        LOCAL_ROOT,  # / listed after /shared: the longest match still wins
        "tmpfs /shared/local\\040scratch tmpfs rw 0 0",  # octal escape of a space, as the kernel writes it
        "/dev/sdb1 /shared/fuseblk fuseblk rw 0 0",  # ntfs-3g & co: a local disk
    )
    two = ["trainer.nnodes=2"]
    for path in ("/tmp/verl_credit/run/graphs.sqlite", "'/shared/local scratch/graphs.sqlite'", "/shared/fuseblk/g.db"):
        config = compose_credit_config([f"credit.annotator.cache_path={path}", *two])
        assert check_cache_location(config, mounts_path=mounts) is None, path
    assert check_cache_location(compose_credit_config(two), mounts_path=mounts) is None  # null: no cache
    # one file per node on the shared filesystem: accepted with a warning (WAL over NFS on one host)
    per_node = compose_credit_config(["credit.annotator.cache_path='/shared/cache/{hostname}/graphs.sqlite'", *two])
    warning = check_cache_location(per_node, mounts_path=mounts, hostname="node-7")
    assert warning and "nfs4 mounted at /shared" in warning
    # an unreadable mount table (not Linux): nothing to check
    config = compose_credit_config(["credit.annotator.cache_path=/shared/graphs.sqlite", *two])
    assert check_cache_location(config, mounts_path=tmp_path / "missing") is None


def test_cache_path_symlink_into_a_network_fs_is_seen(tmp_path):
    from verl_credit.verl.settings import check_cache_location, filesystem_of

    shared = tmp_path / "nfs_export"
    shared.mkdir()
    (tmp_path / "link").symlink_to(shared)
    mounts = _mounts(tmp_path, LOCAL_ROOT, f"server:/x {os.path.realpath(shared)} nfs rw 0 0")
    assert filesystem_of(tmp_path / "link" / "not" / "yet" / "graphs.sqlite", mounts) == (
        os.path.realpath(shared),
        "nfs",
    )
    config = compose_credit_config([f"credit.annotator.cache_path={tmp_path}/link/graphs.sqlite", "trainer.nnodes=4"])
    with pytest.raises(ValueError, match=r"credit\.annotator\.cache_path"):
        check_cache_location(config, mounts_path=mounts)


def test_hostname_placeholder_is_filled_in_by_each_process(monkeypatch):
    import socket

    from verl_credit.verl.settings import expand_cache_path

    monkeypatch.setattr(socket, "gethostname", lambda: "gpu-node-3")
    config = compose_credit_config(["credit.annotator.cache_path='/shared/{hostname}/graphs.sqlite'"])
    assert load_settings(config).annotator.cache_path == "/shared/gpu-node-3/graphs.sqlite"
    assert expand_cache_path("~/c/{hostname}.sqlite", hostname="h") == os.path.expanduser("~/c/h.sqlite")


def test_validate_refuses_a_shared_cache_and_warns_for_one_node(tmp_path, caplog):
    from verl_credit.verl.main import validate

    mounts = _mounts(tmp_path, LOCAL_ROOT, "server:/ckpt /ckpt nfs rw 0 0")
    shared = ["credit.annotator.cache_path=/ckpt/run/graphs.sqlite"]
    with pytest.raises(ValueError, match=r"credit\.annotator\.cache_path.*trainer\.nnodes=2"):
        validate(compose_credit_config([*shared, "trainer.nnodes=2"]), environ={}, mounts_path=mounts)
    with caplog.at_level("WARNING", logger="verl_credit.verl.main"):
        validate(compose_credit_config(shared), environ={}, mounts_path=mounts)
    assert "credit.annotator.cache_path='/ckpt/run/graphs.sqlite' is on a network filesystem" in caplog.text


# -- start-up checks: wandb credentials -------------------------------------------------------------


WANDB = ["trainer.logger=[console,wandb]"]


def test_logger_defaults_to_the_console():
    from verl_credit.verl.main import check_logger

    config = compose_credit_config()
    assert list(config.trainer.logger) == ["console"]
    check_logger(config, environ={})  # nothing to check


@pytest.mark.parametrize("logger", ["[console,wandb]", "wandb", "[tracking]"])
def test_wandb_without_credentials_is_refused(tmp_path, logger):
    from verl_credit.verl.main import check_logger

    with pytest.raises(ValueError, match=r"^trainer\.logger=.*includes wandb") as info:
        check_logger(compose_credit_config([f"trainer.logger={logger}"]), environ={"HOME": str(tmp_path)})
    message = str(info.value)
    assert "WANDB_API_KEY" in message and "WANDB_MODE=offline" in message and f"{tmp_path}/.netrc" in message


@pytest.mark.parametrize(
    "environ",
    [
        {"WANDB_API_KEY": "k" * 40},
        {"WANDB_MODE": "offline"},
        {"WANDB_MODE": "disabled"},
        {"WANDB_MODE": "Offline"},
        {"WANDB_DISABLED": "true"},
    ],
)
def test_wandb_with_a_key_or_keyless_mode_passes(tmp_path, environ):
    from verl_credit.verl.main import check_logger

    check_logger(compose_credit_config(WANDB), environ={"HOME": str(tmp_path), **environ})


def test_wandb_netrc_entry_counts_for_its_host_only(tmp_path):
    from verl_credit.verl.main import check_logger

    config = compose_credit_config(WANDB)
    (tmp_path / ".netrc").write_text("machine api.wandb.ai\n  login user\n  password " + "k" * 40 + "\n")
    check_logger(config, environ={"HOME": str(tmp_path)})  # as `wandb login` writes it
    with pytest.raises(ValueError, match=r"no entry for wandb\.example\.org"):  # a self-hosted server: its own host
        check_logger(config, environ={"HOME": str(tmp_path), "WANDB_BASE_URL": "https://wandb.example.org"})
    other = tmp_path / "elsewhere"
    other.write_text("machine wandb.example.org login user password secret\n")
    check_logger(
        config, environ={"HOME": str(tmp_path), "NETRC": str(other), "WANDB_BASE_URL": "https://wandb.example.org"}
    )
    (tmp_path / ".netrc").write_text("machine github.com login me password x\n")
    with pytest.raises(ValueError, match=r"no entry for api\.wandb\.ai"):
        check_logger(config, environ={"HOME": str(tmp_path)})
    (tmp_path / ".netrc").write_text("machine api.wandb.ai login\n")  # unparsable: no credentials
    with pytest.raises(ValueError, match="includes wandb"):
        check_logger(config, environ={"HOME": str(tmp_path), "WANDB_MODE": "online"})


def test_validate_runs_the_wandb_check(tmp_path):
    from verl_credit.verl.main import validate

    with pytest.raises(ValueError, match="includes wandb"):
        validate(compose_credit_config(WANDB), environ={"HOME": str(tmp_path)})
    validate(compose_credit_config(WANDB), environ={"HOME": str(tmp_path), "WANDB_MODE": "offline"})


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        (
            ["credit.env.name=coding", "+credit.env.options.require_read_before_edit='false'"],
            "require_read_before_edit",
        ),
        (["credit.env.name=coding", "+credit.env.options.reward_mode=partial"], "reward_mode"),
        (["credit.env.name=coding", "+credit.env.options.limits.bash_timeout_s=nan"], "bash_timeout_s"),
        (["credit.env.name=coding", "+credit.env.options.limits.bash_timout_s=5"], "bash_timout_s"),
        (["credit.env.name=service", "+credit.env.options.turn_rewards=yes"], "turn_rewards"),
        (["credit.env.name=service", "+credit.env.options.varient=refund"], "varient"),
    ],
)
def test_validate_refuses_environment_options_before_any_worker(overrides, named, tmp_path):
    """``credit.env.options`` reach the environment's constructor: a string where a switch belongs
    (the yaml string "false" would read as true), an unknown key or an out-of-range limit fails at
    start-up, naming the option, instead of in every episode."""
    from verl_credit.verl.main import validate

    with pytest.raises(ValueError, match=named) as caught:
        validate(compose_credit_config(overrides), environ={"HOME": str(tmp_path)})
    assert "credit.env.options" in str(caught.value)


def test_validate_accepts_good_environment_options(tmp_path):
    from verl_credit.verl.main import validate

    good = [
        "credit.env.name=coding",
        "+credit.env.options.require_read_before_edit=false",
        "+credit.env.options.jail=fallback",
        "+credit.env.options.limits.bash_timeout_s=5",
    ]
    settings = validate(compose_credit_config(good), environ={"HOME": str(tmp_path)})
    assert settings.env.options["require_read_before_edit"] is False
