"""Recipes compose into valid verl + credit configs with the paper's setup; the eval recipe and pass^k.

Every training recipe is run for real by bash with ``DRY_RUN=1``. ``PYTHON`` points at a shim that
records the arguments the recipe hands to ``python -m verl_credit.main`` (one process per recipe
would import verl each time, ~7 s); the recorded overrides are then composed in-process with Hydra's
compose API against ``verl_credit/config/credit_trainer.yaml`` and validated with
``verl_credit.verl.main.validate``. One recipe also runs end to end with the real interpreter
(``--cfg job --resolve`` prints the config and exits before Ray starts) and must print exactly the
config the in-process composition gives.
"""

from __future__ import annotations

import json
import math
import os
import re
import shlex
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

#: slow: recipe dry runs: Hydra composes and subprocesses
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
RECIPES = ROOT / "recipes"
MAIN_ARGS = ["-m", "verl_credit.main"]
DRY_FLAGS = ["--cfg", "job", "--resolve"]

# docs/design.md section 7 numbers each header must state
EXPECTED_HEADER_NUMBERS = {
    "grpo/qwen3_8b_tau2.sh": ["29.61", "22.78", "44.31", "21.74"],
    "grpo/qwen3_4b_tau2.sh": ["34.79"],
    "iapo/qwen3_8b_tau2.sh": ["42.18", "29.72", "56.88", "39.93"],
    "iapo/qwen3_4b_tau2.sh": ["38.40", "29.74"],
    "ablations/beta_plus_0.sh": ["32.50"],
    "ablations/beta_plus_0p1.sh": ["33.96"],
    "ablations/beta_plus_0p3.sh": ["31.39"],
    "ablations/clip_c_0p125.sh": ["32.92"],
    "ablations/clip_c_0p5.sh": ["42.29", "17.78", "25.67"],
    "ablations/neg_route_support.sh": ["41.88", "41.46"],
    "ablations/neg_route_projected.sh": ["41.88", "41.46"],
    "ablations/annotator_swap.sh": ["40.90"],
    "eval/tau2_eval.sh": ["29.61", "42.18", "34.79", "38.40"],
    "info_gain/qwen3_4b_tau2.sh": ["37.99", "34.79", "37.22", "38.40"],
    "eval/bfcl_eval.sh": ["39.36", "39.04"],
    "paper/run_all.sh": ["29.61", "42.18", "34.79", "38.40", "37.22", "37.99", "39.36", "39.04", "40.90"],
}

# recipe -> (model, estimator, beta_plus, clip_c, neg_route, annotator)
TAU2_RECIPES = {
    "grpo/qwen3_8b_tau2.sh": ("Qwen/Qwen3-8B", "grpo", 0.05, 0.25, "error", "rules"),
    "grpo/qwen3_4b_tau2.sh": ("Qwen/Qwen3-4B", "grpo", 0.05, 0.25, "error", "rules"),
    "iapo/qwen3_8b_tau2.sh": ("Qwen/Qwen3-8B", "iapo", 0.05, 0.25, "error", "llm"),
    "iapo/qwen3_4b_tau2.sh": ("Qwen/Qwen3-4B", "iapo", 0.05, 0.25, "error", "llm"),
    "ablations/beta_plus_0.sh": ("Qwen/Qwen3-8B", "iapo", 0.0, 0.25, "error", "llm"),
    "ablations/beta_plus_0p1.sh": ("Qwen/Qwen3-8B", "iapo", 0.1, 0.25, "error", "llm"),
    "ablations/beta_plus_0p3.sh": ("Qwen/Qwen3-8B", "iapo", 0.3, 0.25, "error", "llm"),
    "ablations/clip_c_0p125.sh": ("Qwen/Qwen3-8B", "iapo", 0.05, 0.125, "error", "llm"),
    "ablations/clip_c_0p5.sh": ("Qwen/Qwen3-8B", "iapo", 0.05, 0.5, "error", "llm"),
    "ablations/neg_route_support.sh": ("Qwen/Qwen3-8B", "iapo", 0.05, 0.25, "support", "llm"),
    "ablations/neg_route_projected.sh": ("Qwen/Qwen3-8B", "iapo", 0.05, 0.25, "projected", "llm"),
    "ablations/annotator_swap.sh": ("Qwen/Qwen3-8B", "iapo", 0.05, 0.25, "error", "llm"),
    "gigpo/qwen3_8b_tau2.sh": ("Qwen/Qwen3-8B", "gigpo", 0.05, 0.25, "error", "rules"),
    "info_gain/qwen3_8b_tau2.sh": ("Qwen/Qwen3-8B", "info_gain", 0.05, 0.25, "error", "rules"),
    "info_gain/qwen3_4b_tau2.sh": ("Qwen/Qwen3-4B", "info_gain", 0.05, 0.25, "error", "rules"),
}
CODING_RECIPES = {
    "call_credit/qwen3_8b_coding.sh": ("call_credit", "mass_conserving"),
    "call_credit/grpo_qwen3_8b_coding.sh": ("grpo", "mass_conserving"),
    "call_credit/qwen3_8b_coding_paper_mode.sh": ("call_credit", "paper"),
}


#: run for real by tests/e2e/test_cpu_training.py
CPU_RECIPES = {"cpu/setup_env.sh", "cpu/train.sh", "cpu/smoke.sh"}
#: evaluation recipes (bfcl ones: dry-run and, slow, for real in tests/e2e/test_bfcl.py)
EVAL_RECIPES = {"eval/tau2_eval.sh", "eval/bfcl_eval.sh", "eval/setup_bfcl.sh"}


def test_every_recipe_file_is_covered() -> None:
    found = {str(p.relative_to(RECIPES)) for p in RECIPES.rglob("*.sh")} - {"common.sh"}
    assert found == set(TAU2_RECIPES) | set(CODING_RECIPES) | EVAL_RECIPES | CPU_RECIPES | {"paper/run_all.sh"}


@pytest.mark.parametrize("recipe", sorted(CPU_RECIPES))
def test_cpu_recipes_parse_and_fail_closed(recipe: str) -> None:
    text = (RECIPES / recipe).read_text()
    assert text.startswith("#!/usr/bin/env bash\n") and "set -euo pipefail" in text
    assert subprocess.run(["bash", "-n", str(RECIPES / recipe)], check=False).returncode == 0


@pytest.mark.parametrize("recipe", sorted(EXPECTED_HEADER_NUMBERS))
def test_header_states_what_it_reproduces(recipe: str) -> None:
    text = (RECIPES / recipe).read_text()
    header = text.split("set -xeuo pipefail")[0]
    assert text.startswith("#!/usr/bin/env bash\n")
    assert "set -xeuo pipefail" in text
    missing = [n for n in EXPECTED_HEADER_NUMBERS[recipe] if n not in header]
    assert not missing, f"{recipe} header lacks {missing}"
    assert "DRY_RUN=1" in header


def test_launch_lines_pass_user_overrides_last() -> None:
    for recipe in [*TAU2_RECIPES, *CODING_RECIPES, "eval/tau2_eval.sh"]:
        text = (RECIPES / recipe).read_text()
        launches = [line for line in text.splitlines() if ('"$@"' in line and not line.lstrip().startswith("#"))]
        assert launches, recipe
        assert all(line.rstrip().endswith('"$@"') for line in launches), (recipe, launches)


# -- running the scripts ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def shim(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A ``PYTHON`` that logs its arguments (JSON lines to $ARGS_LOG); ``PYTHON -`` runs the real one."""
    path = tmp_path_factory.mktemp("shim") / "python"
    path.write_text(
        f"#!{sys.executable}\n"
        "import json, os, sys\n"
        "if sys.argv[1:2] == ['-']:\n"
        f"    os.execv({sys.executable!r}, [{sys.executable!r}, '-'])\n"
        "with open(os.environ['ARGS_LOG'], 'a') as handle:\n"
        "    handle.write(json.dumps(sys.argv[1:]) + '\\n')\n"
    )
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


def run_recipe(recipe: str, tmp_path: Path, python: str, *args: str, **env: str) -> subprocess.CompletedProcess:
    full_env = {
        "PATH": os.environ["PATH"],
        "HOME": str(tmp_path),
        "ARGS_LOG": str(tmp_path / "args.jsonl"),
        "PYTHON": python,
        **env,
    }
    return subprocess.run(
        ["bash", str(RECIPES / recipe), *args],
        env=full_env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )


def recorded_args(tmp_path: Path) -> list[list[str]]:
    log = tmp_path / "args.jsonl"
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def compose(overrides: list[str]) -> Any:
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from verl_credit.verl.main import CONFIG_DIR, CONFIG_NAME

    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        return hydra_compose(config_name=CONFIG_NAME, overrides=overrides)


def dry_run_config(recipe: str, tmp_path: Path, shim: Path, *args: str, **env: str) -> tuple[Any, list[str]]:
    result = run_recipe(recipe, tmp_path, str(shim), *args, DRY_RUN="1", **env)
    assert result.returncode == 0, result.stderr[-2000:]
    (argv,) = recorded_args(tmp_path)
    assert argv[:2] == MAIN_ARGS and argv[-3:] == DRY_FLAGS, argv
    overrides = argv[2:-3]
    return compose(overrides), overrides


def assert_paper_setup(cfg: Any) -> None:
    """The setup of docs/design.md section 7 common to every tau2 recipe."""
    rollout = cfg.actor_rollout_ref.rollout
    assert rollout.n == 16
    assert rollout.name == "vllm" and rollout.mode == "async"
    assert rollout.multi_turn.enable and rollout.multi_turn.max_assistant_turns == 30
    assert rollout.multi_turn.max_user_turns == 30 and cfg.credit.user.max_turns == 30
    assert rollout.multi_turn.max_tool_response_length >= 8192  # verl's default 256 chars would cut tau2 results
    assert rollout.multi_turn.max_parallel_calls == 16  # verl's default 1 runs only a turn's first tool call
    assert list(cfg.trainer.logger) == ["console"]  # wandb is opt-in (LOGGER)
    assert rollout.agent.default_agent_loop == "credit_agent"
    assert cfg.data.apply_chat_template_kwargs.enable_thinking is False
    assert cfg.actor_rollout_ref.actor.strategy == "fsdp" and cfg.actor_rollout_ref.ref.strategy == "fsdp"
    assert cfg.trainer.n_gpus_per_node == 8 and cfg.trainer.nnodes == 1
    assert cfg.trainer.use_v1 and cfg.trainer.v1.trainer_mode == "credit_sync"
    assert cfg.credit.env.name == "tau2" and cfg.credit.user.name == "env"
    assert cfg.data.train_files.endswith("data/tau2/train.parquet")
    # validation on the split carved out of train; the test split is only for recipes/eval/tau2_eval.sh
    assert cfg.data.val_files.endswith("data/tau2/val.parquet")
    # checkpoints of ~100 GB each: two kept; group filtering off (the paper's setting); one node's rollout memory
    assert cfg.trainer.max_actor_ckpt_to_keep == 2 and cfg.trainer.max_critic_ckpt_to_keep == 2
    assert cfg.algorithm.filter_groups.enable is False
    assert rollout.gpu_memory_utilization == 0.7  # sized for 512 live sessions (docs/cluster.md)


#: the longest one step may wait on a hung server (the user client's own 300 s x 5 attempts stalled it ~25 min)
HUNG_SERVER_STALL_S = 15 * 60


def user_client_worst_case_s(user_config: Any) -> float:
    """Seconds a hung tau2 user simulator keeps a session waiting before its client gives up: every
    attempt times out, and every wait between two is the longest the client honours (the retry
    policy ``OpenAIUserSimulator`` builds from the config)."""
    from verl_credit.openai_chat import RetryPolicy

    policy = RetryPolicy(max_retries=user_config.max_retries)
    waits = sum(max(policy.delay(k), policy.retry_after_max_s) for k in range(1, policy.max_retries + 1))
    return (policy.max_retries + 1) * user_config.timeout_s + waits


@pytest.mark.timeout(600)
def test_tau2_recipes_compose_to_the_paper_setup(tmp_path_factory: pytest.TempPathFactory, shim: Path) -> None:
    from verl_credit.config import GiGPOConfig, InfoGainConfig
    from verl_credit.envs.tau2 import Tau2Environment
    from verl_credit.verl.main import validate

    for recipe, (model, estimator, beta_plus, clip_c, neg_route, annotator) in TAU2_RECIPES.items():
        tmp_path = tmp_path_factory.mktemp(recipe.replace("/", "_"))
        cfg, _ = dry_run_config(recipe, tmp_path, shim, ANNOTATOR_BASE_URL="http://annot:8001/v1")
        settings = validate(cfg)  # the credit node and the trainer selection, as verl_credit.main checks them
        assert_paper_setup(cfg)
        assert cfg.actor_rollout_ref.model.path == model, recipe
        assert cfg.algorithm.adv_estimator == estimator and settings.estimator == estimator
        assert settings.credit.iapo.beta_plus == beta_plus and settings.credit.iapo.clip_c == clip_c, recipe
        assert settings.credit.iapo.neg_route == neg_route, recipe
        assert cfg.actor_rollout_ref.rollout.tensor_model_parallel_size == (2 if "8B" in model else 1)
        assert settings.annotator.name == annotator
        env = Tau2Environment(**settings.env.options)  # the options the agent loop passes build the env
        # a hung user fails its session (as a user failure) before the session's deadline cuts it
        assert user_client_worst_case_s(env.user_config) < settings.session.deadline, recipe
        if recipe == "ablations/annotator_swap.sh":
            assert settings.annotator.model == "google/gemma-4-31b-it"
            assert settings.annotator.base_urls == ("http://annot:8001/v1",)
            assert env.user_config.model == "Qwen/Qwen3-32B"  # only the annotator is swapped
            assert env.user_config.base_urls == ("http://127.0.0.1:8100/v1",)
        else:
            # the simulated user has its own server, not the annotator's
            assert env.user_config.model == "Qwen/Qwen3-32B"
            assert env.user_config.base_urls == ("http://127.0.0.1:8100/v1",)
            if annotator == "llm":
                assert settings.annotator.model == "Qwen/Qwen3-32B"
                assert settings.annotator.base_urls == ("http://annot:8001/v1",)
        if annotator == "llm":  # the cache is on node-local disk, not next to the (often NFS) checkpoints
            experiment = cfg.trainer.experiment_name
            assert settings.annotator.cache_path == f"/tmp/verl_credit/verl_credit_tau2/{experiment}/graphs.sqlite"
            assert not settings.annotator.cache_path.startswith(cfg.trainer.default_local_dir)
            assert settings.annotator.in_rollout and not settings.annotator.in_validation
        if neg_route == "projected":
            assert settings.credit.iapo.beta_minus == 0.05
        if estimator == "gigpo":  # verl-agent's defaults (docs/design.md section 4b)
            assert settings.credit.gigpo == GiGPOConfig(step_advantage_w=1.0, gamma=0.95, mode="mean_norm")
        if estimator == "info_gain":  # the authors' tau2 defaults
            assert settings.credit.info_gain == InfoGainConfig()
        seeds = {
            cfg.data.seed,
            cfg.actor_rollout_ref.rollout.seed,
            cfg.actor_rollout_ref.actor.data_loader_seed,
            cfg.actor_rollout_ref.actor.fsdp_config.seed,
            cfg.actor_rollout_ref.ref.fsdp_config.seed,
        }
        assert seeds == {42}, recipe  # SEED's default (verl's own)


def test_the_session_deadline_bounds_a_hung_user(tmp_path: Path, shim: Path) -> None:
    """A hung user simulator or rollout server stalls a step at most HUNG_SERVER_STALL_S: the session
    deadline (the settings' one default, which the recipes keep) is no longer, and the recipes' user
    client gives up (all attempts timed out, the longest waits between them) before that deadline, so
    the session is reported as a user failure. The deadline still leaves 30 s per round (a policy turn
    and a user reply) of a session of MAX_TURNS rounds. USER_TIMEOUT / USER_MAX_RETRIES set the client."""
    from verl_credit.envs.tau2 import Tau2Environment
    from verl_credit.envs.tau2.user_sim import UserSimConfig
    from verl_credit.verl.main import validate
    from verl_credit.verl.settings import SessionSettings

    cfg, _ = dry_run_config("iapo/qwen3_8b_tau2.sh", tmp_path, shim)
    settings = validate(cfg)
    deadline = settings.session.deadline
    assert deadline is not None and deadline == SessionSettings().deadline
    user = Tau2Environment(**settings.env.options).user_config
    assert (user.timeout_s, user.max_retries) == (120.0, 2)
    assert user_client_worst_case_s(user) < deadline <= HUNG_SERVER_STALL_S
    assert deadline / cfg.actor_rollout_ref.rollout.multi_turn.max_assistant_turns >= 30
    # without the recipes (the client's own defaults) the deadline fires first: still bounded
    assert min(user_client_worst_case_s(UserSimConfig()), deadline) <= HUNG_SERVER_STALL_S
    (tmp_path / "args.jsonl").unlink()
    cfg, _ = dry_run_config("grpo/qwen3_8b_tau2.sh", tmp_path, shim, USER_TIMEOUT="30", USER_MAX_RETRIES="0")
    user = Tau2Environment(**validate(cfg).env.options).user_config
    assert (user.timeout_s, user.max_retries) == (30.0, 0)


def test_seed_reaches_every_seeded_part(tmp_path: Path, shim: Path) -> None:
    cfg, _ = dry_run_config("grpo/qwen3_4b_tau2.sh", tmp_path, shim, SEED="7")
    assert cfg.data.seed == 7 and cfg.actor_rollout_ref.rollout.seed == 7
    assert cfg.actor_rollout_ref.actor.data_loader_seed == 7
    assert cfg.actor_rollout_ref.actor.fsdp_config.seed == 7 and cfg.actor_rollout_ref.ref.fsdp_config.seed == 7
    result = run_recipe("grpo/qwen3_4b_tau2.sh", tmp_path, str(shim), DRY_RUN="1", SEED="one")
    assert result.returncode == 2 and "SEED must be a non-negative integer" in result.stderr


@pytest.mark.timeout(600)
def test_paper_run_all_composes_every_run(tmp_path: Path, shim: Path) -> None:
    """DRY_RUN=1: every run of Tables 1 and 3 and the annotator swap is composed -- its training
    config (valid, with its seed, experiment name and checkpoint folder), its tau2 evaluation plan
    (held-out user, the training user named) and, for Table 1, its BFCL plan; nothing is written."""
    from verl_credit.verl.main import validate

    env = {
        "ANNOTATOR_BASE_URL": "http://annot:8001/v1",
        "USER_BASE_URL": "http://user:8101/v1",
        "EVAL_USER_BASE_URL": "http://heldout:8002/v1",
        "EVAL_USER_MODEL": "held/out-user",
    }
    result = run_recipe("paper/run_all.sh", tmp_path, str(shim), DRY_RUN="1", **env)
    assert result.returncode == 0, result.stderr[-3000:]
    calls = recorded_args(tmp_path)
    trainings = [argv for argv in calls if argv[:2] == MAIN_ARGS]
    evaluations = [argv for argv in calls if argv[:2] == ["-m", "verl_credit.envs.tau2.evaluate"]]
    bfcl = [argv for argv in calls if argv[:1] == ["recipes/eval/bfcl_eval.py"]]
    table1 = {
        ("Qwen/Qwen3-8B", "grpo"),
        ("Qwen/Qwen3-8B", "iapo"),
        ("Qwen/Qwen3-4B", "grpo"),
        ("Qwen/Qwen3-4B", "iapo"),
        ("Qwen/Qwen3-4B", "gigpo"),
        ("Qwen/Qwen3-4B", "info_gain"),
    }
    assert len(trainings) == len(evaluations) == 6 * 3 + 8 and len(bfcl) == 6 * 3
    runs = []
    for argv in trainings:
        assert argv[-3:] == DRY_FLAGS and argv[-4] == "trainer.resume_mode=auto"
        cfg = compose(argv[2:-3])
        validate(cfg)
        runs.append((cfg.actor_rollout_ref.model.path, cfg.algorithm.adv_estimator, cfg.data.seed))
        assert cfg.actor_rollout_ref.rollout.seed == cfg.data.seed
        assert cfg.trainer.experiment_name.endswith(f"_tau2_seed{cfg.data.seed}")
        assert cfg.trainer.default_local_dir.startswith(str(tmp_path / "ckpt" / "paper"))
    experiments = [compose(argv[2:-3]).trainer.experiment_name for argv in trainings]
    assert len(set(experiments)) == len(experiments)  # one checkpoint folder per run
    for model, arm in table1:
        size = model.split("-")[-1].lower()  # 8b / 4b
        for seed in (1, 2, 3):
            assert f"{arm}_qwen3_{size}_tau2_seed{seed}" in experiments, (model, arm, seed)
            assert (model, arm, seed) in runs
    ablations = [e for e in experiments if not any(e.startswith(f"{arm}_qwen3_") for _, arm in table1)]
    assert len(ablations) == 8 and all(e.endswith("_qwen3_8b_tau2_seed1") for e in ablations)
    assert sum(1 for model, arm, _ in runs if (model, arm) == ("Qwen/Qwen3-8B", "iapo")) == 3 + 8  # + ablations
    for argv in evaluations:
        flags = dict(zip(argv[::2], argv[1::2], strict=False))
        assert argv[argv.index("--user-base-url") + 1] == "http://heldout:8002/v1"
        assert argv[argv.index("--user-model") + 1] == "held/out-user"
        assert argv[argv.index("--training-user-model") + 1] == "Qwen/Qwen3-32B"
        assert argv[argv.index("--training-user-base-url") + 1] == "http://user:8101/v1"  # the training user
        assert "--same-user" not in argv and "--dry-run" in argv
        assert "global_step_LAST" not in flags.get("--policy-model", "")
    assert "runs: 26, estimated GPU-hours:" in result.stderr
    assert not (tmp_path / "eval").exists() and not (tmp_path / "ckpt").exists()  # a dry run writes nothing
    listed = run_recipe("paper/run_all.sh", tmp_path, str(shim), LIST="1", ONLY="table1/qwen3_4b/info_gain")
    assert listed.returncode == 0 and listed.stdout.count("run table1/qwen3_4b/info_gain/seed") == 3
    assert "estimated 396 GPU-hours" in listed.stdout


def test_paper_run_all_needs_a_held_out_user_before_it_trains(tmp_path: Path, shim: Path) -> None:
    """A real run without EVAL_USER_MODEL, or with the training user's model, is refused before any
    training starts (it would end, days later, in an evaluation the eval recipe refuses); a dry run
    without it plans with a named placeholder; LIST=1 needs none."""
    only = {"ONLY": "table1/qwen3_4b/grpo/seed1", "BFCL": "0"}
    for env, message in (
        ({}, "set EVAL_USER_MODEL to the held-out evaluation user's model"),
        ({"EVAL_USER_MODEL": "Qwen/Qwen3-32B"}, "is the training user's model (TRAIN_USER_MODEL)"),
    ):
        result = run_recipe("paper/run_all.sh", tmp_path, str(shim), **only, **env)
        assert result.returncode == 2 and message in result.stderr, result.stderr[-2000:]
        assert recorded_args(tmp_path) == []  # nothing trained
    result = run_recipe("paper/run_all.sh", tmp_path, str(shim), DRY_RUN="1", **only)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "EVAL_USER_MODEL is not set: the evaluation plans name a placeholder" in result.stderr
    (evaluation,) = [argv for argv in recorded_args(tmp_path) if argv[:2] == ["-m", "verl_credit.envs.tau2.evaluate"]]
    assert evaluation[evaluation.index("--user-model") + 1] == "<held-out user: set EVAL_USER_MODEL>"
    listed = run_recipe("paper/run_all.sh", tmp_path, str(shim), LIST="1", **only)
    assert listed.returncode == 0 and "run table1/qwen3_4b/grpo/seed1" in listed.stdout


def test_annotator_swap_takes_any_model_name(tmp_path: Path, shim: Path) -> None:
    cfg, _ = dry_run_config(
        "ablations/annotator_swap.sh",
        tmp_path,
        shim,
        ANNOTATOR_MODEL="my-org/Some-Annotator-70B",
        ANNOTATOR_BASE_URL="http://a:9000/v1,http://b:9000/v1",
    )
    assert cfg.credit.annotator.model == "my-org/Some-Annotator-70B"
    assert list(cfg.credit.annotator.base_urls) == ["http://a:9000/v1", "http://b:9000/v1"]
    assert cfg.trainer.experiment_name == "iapo_qwen3_8b_tau2_annotator_my-org_Some-Annotator-70B"


def test_user_overrides_win_and_knobs_apply(tmp_path: Path, shim: Path) -> None:
    cfg, _ = dry_run_config(
        "iapo/qwen3_8b_tau2.sh",
        tmp_path,
        shim,
        "actor_rollout_ref.rollout.n=4",
        "credit.iapo.clip_c=0.7",
        "credit.env.options.user.model=other-user-model",
        GPUS_PER_NODE="4",
        NNODES="2",
        CKPT_DIR="/shared/ckpt/run1",
        DATA_DIR="/data/t2",
        USER_BASE_URL="http://u1:1/v1,http://u2:1/v1",
    )
    assert cfg.actor_rollout_ref.rollout.n == 4 and cfg.credit.iapo.clip_c == 0.7
    assert cfg.credit.env.options.user.model == "other-user-model"
    assert list(cfg.credit.env.options.user.base_urls) == ["http://u1:1/v1", "http://u2:1/v1"]
    assert cfg.trainer.n_gpus_per_node == 4 and cfg.trainer.nnodes == 2
    assert cfg.trainer.default_local_dir == "/shared/ckpt/run1"
    assert cfg.actor_rollout_ref.rollout.gpu_memory_utilization == 0.8  # sized for two nodes (docs/cluster.md)
    assert cfg.data.train_files == "/data/t2/train.parquet" and cfg.data.val_files == "/data/t2/val.parquet"


def test_multi_node_needs_a_shared_ckpt_dir(tmp_path: Path, shim: Path) -> None:
    result = run_recipe("grpo/qwen3_8b_tau2.sh", tmp_path, str(shim), DRY_RUN="1", NNODES="2")
    assert result.returncode == 2 and "NNODES=2: set CKPT_DIR to a folder on storage every node mounts" in result.stderr
    assert recorded_args(tmp_path) == []


def test_dynamic_sampling_and_checkpoint_knobs(tmp_path: Path, shim: Path) -> None:
    """DYNAMIC_SAMPLING=1 is verl's group filtering on the environment's reward (a metric the
    credit_agent rows carry: the trainer's start-up check accepts it); MAX_CKPT_TO_KEEP=0 keeps all."""
    from verl_credit.verl.main import validate
    from verl_credit.verl.trainer import check_filter_groups

    cfg, _ = dry_run_config("iapo/qwen3_8b_tau2.sh", tmp_path, shim, DYNAMIC_SAMPLING="1", MAX_CKPT_TO_KEEP="0")
    groups = cfg.algorithm.filter_groups
    assert groups.enable is True and groups.metric == "env_reward" and groups.max_inflight_gen_batches == 2
    check_filter_groups(cfg, validate(cfg))
    assert cfg.trainer.max_actor_ckpt_to_keep is None and cfg.trainer.max_critic_ckpt_to_keep is None


def test_cluster_knobs_cache_dir_logger_parallel_calls(tmp_path: Path, shim: Path) -> None:
    """CACHE_DIR / TMPDIR place the annotation cache, LOGGER opts in to wandb, MAX_PARALLEL_CALLS is
    verl's max_parallel_calls; and validate() (what python -m verl_credit.main runs before Ray) refuses a
    cache on a network filesystem shared by several nodes, but takes one file per node."""
    from verl_credit.verl.main import validate

    cfg, _ = dry_run_config("iapo/qwen3_8b_tau2.sh", tmp_path, shim, TMPDIR="/scratch/job7")
    assert (
        cfg.credit.annotator.cache_path == "/scratch/job7/verl_credit/verl_credit_tau2/iapo_qwen3_8b_tau2/graphs.sqlite"
    )
    (tmp_path / "args.jsonl").unlink()
    cfg, _ = dry_run_config(
        "iapo/qwen3_8b_tau2.sh",
        tmp_path,
        shim,
        CACHE_DIR="/nfs/cache/{hostname}/",
        NNODES="2",
        CKPT_DIR="/nfs/ckpt",
        LOGGER='["console","wandb"]',
        MAX_PARALLEL_CALLS="4",
    )
    assert cfg.credit.annotator.cache_path == "/nfs/cache/{hostname}/graphs.sqlite"
    assert list(cfg.trainer.logger) == ["console", "wandb"]
    assert cfg.actor_rollout_ref.rollout.multi_turn.max_parallel_calls == 4
    mounts = tmp_path / "mounts"
    mounts.write_text("/dev/vda1 / ext4 rw 0 0\nsrv:/export /nfs nfs4 rw 0 0\n")
    settings = validate(cfg, environ={"WANDB_API_KEY": "k"}, mounts_path=mounts)  # one file per node: accepted
    assert "{hostname}" not in settings.annotator.cache_path
    with pytest.raises(ValueError, match="includes wandb"):  # ... but wandb needs credentials
        validate(cfg, environ={"HOME": str(tmp_path)}, mounts_path=mounts)
    (tmp_path / "args.jsonl").unlink()
    cfg, _ = dry_run_config(
        "iapo/qwen3_8b_tau2.sh", tmp_path, shim, CACHE_DIR="/nfs/cache", NNODES="2", CKPT_DIR="/nfs/ckpt"
    )
    with pytest.raises(ValueError, match=r"credit\.annotator\.cache_path='/nfs/cache/graphs\.sqlite' is on a network"):
        validate(cfg, environ={}, mounts_path=mounts)


@pytest.mark.timeout(300)
def test_real_dry_run_prints_the_same_config_and_stops_before_ray(tmp_path: Path, shim: Path) -> None:
    _, overrides = dry_run_config("iapo/qwen3_8b_tau2.sh", tmp_path, shim)
    expected = compose(overrides)
    from omegaconf import OmegaConf

    result = run_recipe("iapo/qwen3_8b_tau2.sh", tmp_path, sys.executable, DRY_RUN="1")
    assert result.returncode == 0, result.stderr[-3000:]
    printed = yaml.safe_load(result.stdout)
    assert printed == OmegaConf.to_container(expected, resolve=True)
    assert "ray.init" not in result.stderr and "Started a local Ray instance" not in result.stderr


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"DRY_RUN": "2"}, "DRY_RUN must be 0 or 1"),
        ({"DRY_RUN": "1", "NEG_ROUTE": "bogus"}, "NEG_ROUTE must be error|support|projected"),
        ({"DRY_RUN": "1", "ROLLOUT_N": "sixteen"}, "ROLLOUT_N must be a positive integer"),
        ({"DRY_RUN": "1", "MAX_TURNS": "0"}, "MAX_TURNS must be a positive integer"),
        ({"DRY_RUN": "1", "MAX_PARALLEL_CALLS": "0"}, "MAX_PARALLEL_CALLS must be a positive integer"),
        ({"DRY_RUN": "1", "ENDPOINT_USE_PROXY": "yes"}, "ENDPOINT_USE_PROXY must be 0 or 1"),
        ({"DRY_RUN": "1", "DYNAMIC_SAMPLING": "on"}, "DYNAMIC_SAMPLING must be 0 or 1"),
        ({"DRY_RUN": "1", "MAX_CKPT_TO_KEEP": "-1"}, "MAX_CKPT_TO_KEEP must be a non-negative integer"),
        ({"DRY_RUN": "1", "USER_TIMEOUT": "0"}, "USER_TIMEOUT must be a positive integer"),
        ({"DRY_RUN": "1", "USER_MAX_RETRIES": "-1"}, "USER_MAX_RETRIES must be a non-negative integer"),
        # verl would refuse it only once its workers start
        ({"DRY_RUN": "1", "TRAIN_BATCH_SIZE": "8"}, "PPO_MINI_BATCH_SIZE=16 is more than TRAIN_BATCH_SIZE=8"),
    ],
)
def test_bad_knobs_are_rejected(tmp_path: Path, shim: Path, env: dict[str, str], message: str) -> None:
    result = run_recipe("iapo/qwen3_8b_tau2.sh", tmp_path, str(shim), **env)
    assert result.returncode == 2 and message in result.stderr
    assert recorded_args(tmp_path) == []


def test_real_run_checks_data_and_endpoints_before_launching(tmp_path: Path, shim: Path) -> None:
    from openai_stub_server import OpenAIStubServer, unused_port

    data = tmp_path / "data"
    result = run_recipe("iapo/qwen3_8b_tau2.sh", tmp_path, str(shim), DATA_DIR=str(data))
    assert result.returncode == 2 and f"missing {data}/train.parquet" in result.stderr
    data.mkdir()
    (data / "train.parquet").write_bytes(b"")
    result = run_recipe("iapo/qwen3_8b_tau2.sh", tmp_path, str(shim), DATA_DIR=str(data))
    assert result.returncode == 2 and f"missing {data}/val.parquet" in result.stderr  # the validation split
    (data / "val.parquet").write_bytes(b"")
    dead = f"http://127.0.0.1:{unused_port()}/v1"
    result = run_recipe("iapo/qwen3_8b_tau2.sh", tmp_path, str(shim), DATA_DIR=str(data), ANNOTATOR_BASE_URL=dead)
    assert result.returncode == 2 and f"annotator endpoint {dead} does not answer" in result.stderr
    assert recorded_args(tmp_path) == []
    # a proxy that answers nothing: the checks go direct unless ENDPOINT_USE_PROXY=1
    proxies = {name: f"http://127.0.0.1:{unused_port()}" for name in ("http_proxy", "https_proxy", "HTTPS_PROXY")}
    with OpenAIStubServer() as server:
        result = run_recipe(
            "iapo/qwen3_8b_tau2.sh",
            tmp_path,
            str(shim),
            DATA_DIR=str(data),
            ANNOTATOR_BASE_URL=server.base_url,
            USER_BASE_URL=server.base_url,
            ENDPOINT_USE_PROXY="1",
            **proxies,
        )
        assert result.returncode == 2 and f"annotator endpoint {server.base_url} does not answer" in result.stderr
        assert server.requests == [] and recorded_args(tmp_path) == []
        result = run_recipe(
            "iapo/qwen3_8b_tau2.sh",
            tmp_path,
            str(shim),
            DATA_DIR=str(data),
            ANNOTATOR_BASE_URL=server.base_url,
            USER_BASE_URL=server.base_url,
            **proxies,
        )
        assert result.returncode == 0, result.stderr[-2000:]
        assert [r.path for r in server.requests] == ["/v1/models", "/v1/models"]  # annotator, then user
    (argv,) = recorded_args(tmp_path)
    assert argv[:2] == MAIN_ARGS and "--cfg" not in argv  # a real launch: no print-config flags


@pytest.mark.timeout(300)
def test_call_credit_recipes_compose_and_prepare_coding_data(
    tmp_path_factory: pytest.TempPathFactory, shim: Path
) -> None:
    from verl_credit.verl.main import validate

    for recipe, (estimator, mode) in CODING_RECIPES.items():
        tmp_path = tmp_path_factory.mktemp(recipe.replace("/", "_"))
        cfg, _ = dry_run_config(recipe, tmp_path, shim)
        settings = validate(cfg)
        assert cfg.algorithm.adv_estimator == estimator and settings.credit.call_credit.mode == mode
        assert cfg.credit.env.name == "coding" and cfg.credit.annotator.name == "rules"
        rollout = cfg.actor_rollout_ref.rollout
        assert rollout.n == 16 and rollout.name == "vllm" and rollout.multi_turn.max_assistant_turns == 30
        assert cfg.actor_rollout_ref.actor.strategy == "fsdp" and cfg.trainer.n_gpus_per_node == 8
        assert cfg.data.apply_chat_template_kwargs.enable_thinking is False
        assert settings.env.options["jail"] == "namespace"  # fails closed: never auto's silent fallback
        assert rollout.multi_turn.max_parallel_calls == 16
    # a real run probes the namespace jail before launching, and writes the data once (one row per
    # shipped coding task), then launches
    import pandas as pd

    from verl_credit.envs.coding import list_tasks
    from verl_credit.envs.coding.jail import namespace_jail_available

    tmp_path = tmp_path_factory.mktemp("coding_real")
    result = run_recipe("call_credit/qwen3_8b_coding.sh", tmp_path, str(shim), DATA_DIR=str(tmp_path / "coding"))
    if not namespace_jail_available():  # this machine has no user namespaces: the recipe stops before Ray
        assert result.returncode == 2 and "namespace jail" in result.stderr and "seccomp=unconfined" in result.stderr
        assert recorded_args(tmp_path) == []
        result = run_recipe(
            "call_credit/qwen3_8b_coding.sh", tmp_path, str(shim), DATA_DIR=str(tmp_path / "coding"), JAIL="fallback"
        )
    assert result.returncode == 0, result.stderr[-2000:]
    frame = pd.read_parquet(tmp_path / "coding" / "train.parquet")
    assert [info["task"] for info in frame["extra_info"]] == list_tasks()
    assert set(info["env"] for info in frame["extra_info"]) == {"coding"}
    (argv,) = recorded_args(tmp_path)
    assert f"data.train_files={tmp_path}/coding/train.parquet" in argv


@pytest.mark.parametrize(("jail", "message"), [("auto", "JAIL=auto may silently run"), ("chroot", "JAIL must be")])
def test_coding_recipe_refuses_a_jail_that_can_fail_open(tmp_path: Path, shim: Path, jail: str, message: str) -> None:
    result = run_recipe("call_credit/qwen3_8b_coding.sh", tmp_path, str(shim), DRY_RUN="1", JAIL=jail)
    assert result.returncode == 2 and message in result.stderr
    assert recorded_args(tmp_path) == []


def test_coding_recipe_header_names_the_docker_flags_of_the_namespace_jail() -> None:
    header = (RECIPES / "call_credit/qwen3_8b_coding.sh").read_text().split("set -xeuo pipefail")[0]
    for flag in (
        "--security-opt seccomp=unconfined",
        "--security-opt apparmor=unconfined",
        "--security-opt systempaths=unconfined",
        "--privileged",
        "kernel.unprivileged_userns_clone=1",
        "user.max_user_namespaces",
        "namespace_jail_available",
    ):
        assert flag in header, flag


# -- evaluation: recipe, runner CLI, pass^k ---------------------------------------------------------


@pytest.mark.timeout(300)
def test_eval_recipe_dry_run_plans_the_test_split_with_4_trials(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt" / "global_step_7" / "actor"
    ckpt.mkdir(parents=True)
    (ckpt / "model_world_size_8_rank_0.pt").write_bytes(b"")
    held_out = {"USER_MODEL": "held/out-user"}
    result = run_recipe("eval/tau2_eval.sh", tmp_path, sys.executable, DRY_RUN="1", CKPT=str(ckpt), **held_out)
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.strip().splitlines()
    out_dir = tmp_path / "eval" / "tau2" / "global_step_7_actor"
    assert lines[0] == (
        f"would run: {sys.executable} -m verl.model_merger merge --backend fsdp --local_dir {ckpt} "
        f"--target_dir {out_dir}/hf_model"
    )
    assert "--enable-auto-tool-choice --tool-call-parser hermes" in lines[1] and f"{out_dir}/hf_model" in lines[1]
    plan = json.loads(lines[-1])
    assert plan["tasks_per_domain"] == {"airline": 20, "retail": 40, "telecom": 40}
    assert plan["trials"] == 4 and plan["episodes"] == 400 and plan["max_turns"] == 30
    assert plan["policy"]["temperature"] == 0.0 and plan["user"]["model"] == "held/out-user"
    assert plan["max_parallel_calls"] == 16  # as the training recipes (verl's default 1 drops parallel calls)
    assert not out_dir.exists()  # a dry run writes nothing
    result = run_recipe(
        "eval/tau2_eval.sh", tmp_path, sys.executable, DRY_RUN="1", CKPT=str(ckpt), MAX_PARALLEL_CALLS="3", **held_out
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads(result.stdout.strip().splitlines()[-1])["max_parallel_calls"] == 3
    assert "--trust-env" not in result.stderr  # set -x trace: proxies are ignored unless ENDPOINT_USE_PROXY=1
    result = run_recipe(
        "eval/tau2_eval.sh", tmp_path, sys.executable, DRY_RUN="1", CKPT=str(ckpt), ENDPOINT_USE_PROXY="1", **held_out
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "--trust-env" in result.stderr


@pytest.mark.timeout(300)
def test_eval_recipe_refuses_the_training_user_unless_same_user(tmp_path: Path) -> None:
    """The evaluation user's model has no default: unset, or the training user's model however
    spelled, it is refused (DRY_RUN too) unless SAME_USER=1; the default evaluation URL (port 8002) is
    not the training recipes' (port 8100) and the plan records both users. The training user's URL,
    however spelled, is refused; SAME_USER=1 allows it."""
    plan_only = {"DRY_RUN": "1", "CKPT": "Qwen/Qwen3-8B"}
    result = run_recipe("eval/tau2_eval.sh", tmp_path, sys.executable, **plan_only)
    assert result.returncode == 2 and "set USER_MODEL to the held-out evaluation user's model" in result.stderr
    assert "would run" not in result.stdout  # refused before anything is planned
    result = run_recipe("eval/tau2_eval.sh", tmp_path, sys.executable, **plan_only, USER_MODEL="qwen/QWEN3-32b")
    assert result.returncode == 2 and "is the training user's model (TRAIN_USER_MODEL)" in result.stderr
    result = run_recipe("eval/tau2_eval.sh", tmp_path, sys.executable, **plan_only, USER_MODEL="held/out-user")
    assert result.returncode == 0, result.stderr[-2000:]
    plan = json.loads(result.stdout.strip().splitlines()[-1])
    assert plan["user"] == {"base_urls": ["http://127.0.0.1:8002/v1"], "model": "held/out-user"}
    assert plan["training_user"] == {"base_urls": ["http://127.0.0.1:8100/v1"], "model": "Qwen/Qwen3-32B"}
    assert plan["same_user"] is False and "serves the training user's model" not in result.stderr
    # on purpose: the training user's model (SAME_USER=1 makes it the default) behind another URL
    result = run_recipe("eval/tau2_eval.sh", tmp_path, sys.executable, **plan_only, SAME_USER="1")
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads(result.stdout.strip().splitlines()[-1])["user"]["model"] == "Qwen/Qwen3-32B"
    same = {**plan_only, "USER_BASE_URL": "http://LOCALHOST:8100/v1/", "USER_MODEL": "held/out-user"}
    result = run_recipe("eval/tau2_eval.sh", tmp_path, sys.executable, **same)
    assert result.returncode == 2 and "is the training user" in result.stderr and "--same-user" in result.stderr
    result = run_recipe("eval/tau2_eval.sh", tmp_path, sys.executable, **same, SAME_USER="1")
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads(result.stdout.strip().splitlines()[-1])["same_user"] is True
    result = run_recipe("eval/tau2_eval.sh", tmp_path, sys.executable, **same, SAME_USER="yes")
    assert result.returncode == 2 and "SAME_USER must be 0 or 1" in result.stderr


def test_evaluate_refuses_a_resume_with_another_user(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from verl_credit.envs.tau2.evaluate import main, normalize_url

    assert normalize_url("HTTP://Localhost:80/v1/") == normalize_url("http://127.0.0.1/v1")
    assert normalize_url("http://host:8000/v1") != normalize_url("http://host:8001/v1")
    out = tmp_path / "r.jsonl"
    other = {"base_urls": ["http://other:9/v1"], "model": "m2"}
    out.write_text(json.dumps({"domain": "airline", "task_id": "2", "trial": 0, "reward": 1.0, "user": other}) + "\n")
    argv = ["run", "--policy-base-url", "http://p/v1", "--policy-model", "p", "--user-base-url", "http://u:1/v1"]
    argv += ["--user-model", "u", "--domains", "airline", "--out", str(out), "--dry-run"]
    assert main(argv) == 2
    assert f"{out}:1: user: the trials were played against" in capsys.readouterr().err


def test_eval_recipe_needs_a_checkpoint(tmp_path: Path) -> None:
    result = run_recipe("eval/tau2_eval.sh", tmp_path, sys.executable, DRY_RUN="1")
    assert result.returncode != 0 and "set CKPT" in result.stderr
    for knob, value, message in (
        ("MAX_PARALLEL_CALLS", "0", "MAX_PARALLEL_CALLS must be a positive integer"),
        ("ENDPOINT_USE_PROXY", "2", "ENDPOINT_USE_PROXY must be 0 or 1"),
    ):
        result = run_recipe(
            "eval/tau2_eval.sh", tmp_path, sys.executable, DRY_RUN="1", CKPT="Qwen/Qwen3-8B", **{knob: value}
        )
        assert result.returncode == 2 and message in result.stderr


def test_pass_hat_k_hand_computed() -> None:
    from verl_credit.envs.tau2.evaluate import pass_hat_k

    # 4 trials, 2 successes: pass^1 = 2/4; pass^2 = C(2,2)/C(4,2) = 1/6; pass^3 = C(2,3)/C(4,3) = 0
    assert pass_hat_k(4, 2, 1) == 0.5
    assert pass_hat_k(4, 2, 2) == pytest.approx(1 / 6)
    assert pass_hat_k(4, 2, 3) == 0.0 and pass_hat_k(4, 4, 4) == 1.0
    with pytest.raises(ValueError, match="k must be in"):
        pass_hat_k(4, 2, 5)
    with pytest.raises(ValueError, match="successes must be in"):
        pass_hat_k(4, 5, 1)


def test_pass_hat_k_matches_tau2s_own_definition() -> None:
    import tau2.metrics.agent_metrics as tau2_metrics

    from verl_credit.envs.tau2.evaluate import pass_hat_k

    for n in range(1, 7):
        for c in range(n + 1):
            for k in range(1, n + 1):
                assert pass_hat_k(n, c, k) == tau2_metrics.pass_hat_k(n, c, k)


def _records(spec: dict[tuple[str, str], list[float]]) -> list[dict[str, Any]]:
    return [
        {"domain": d, "task_id": t, "trial": i, "reward": r}
        for (d, t), rewards in spec.items()
        for i, r in enumerate(rewards)
    ]


def test_domain_macro_pass_hat_k_hand_computed() -> None:
    from verl_credit.envs.tau2.evaluate import compute_pass_hat_k

    records = _records(
        {
            ("airline", "A"): [1.0, 1.0, 1.0, 0.9999999],  # 4/4 (within 1e-6 of 1 counts)
            ("airline", "B"): [1.0, 0.0, 0.0, 0.5],  # 1/4 (0.5 is not a success)
            ("retail", "C"): [1.0, 0.0, 1.0, 0.0],  # 2/4
        }
    )
    result = compute_pass_hat_k(records)
    assert result.max_k == 4
    # airline: pass^1 = (1 + 1/4) / 2 = 0.625; pass^2 = (1 + 0) / 2 = 0.5
    assert result.per_domain["airline"][1] == 0.625 and result.per_domain["airline"][2] == 0.5
    # retail: pass^1 = 0.5; pass^2 = 1/6
    assert result.per_domain["retail"][2] == pytest.approx(1 / 6)
    # macro pass^1 = (0.625 + 0.5) / 2 = 0.5625; micro = (1 + 0.25 + 0.5) / 3
    assert result.macro[1] == 0.5625 and result.micro[1] == pytest.approx(1.75 / 3)
    assert result.macro[4] == pytest.approx((0.5 + 0.0) / 2)  # only task A passes all 4
    assert result.tasks_per_domain == {"airline": 2, "retail": 1}
    assert math.isclose(result.avg_reward, (3.9999999 + 1.5 + 2.0) / 12)


def test_pass_hat_k_uses_the_fewest_trials() -> None:
    from verl_credit.envs.tau2.evaluate import compute_pass_hat_k

    records = _records({("airline", "A"): [1.0, 1.0, 1.0], ("airline", "B"): [1.0, 0.0]})
    assert compute_pass_hat_k(records).max_k == 2
    with pytest.raises(ValueError, match=r"max_k must be in \[1, 2\]"):
        compute_pass_hat_k(records, max_k=3)
    with pytest.raises(ValueError, match="has no 'reward'"):
        compute_pass_hat_k([{"domain": "airline", "task_id": "A"}])


def test_score_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from verl_credit.envs.tau2.evaluate import main

    results = tmp_path / "results.jsonl"
    results.write_text(
        "\n".join(json.dumps(r) for r in _records({("airline", "A"): [1.0, 0.0], ("retail", "B"): [1.0, 1.0]}))
    )
    assert main(["score", str(results), "--json", str(tmp_path / "m.json")]) == 0
    metrics = json.loads((tmp_path / "m.json").read_text())
    assert metrics["macro"] == {"pass^1": 0.75, "pass^2": 0.5}  # airline 0.5/0, retail 1/1
    assert metrics["per_domain"]["airline"] == {"pass^1": 0.5, "pass^2": 0.0}
    table = capsys.readouterr().out
    assert "macro" in table and "75.00" in table
    results.write_text('{"domain": "airline"\n')
    assert main(["score", str(results)]) == 2
    assert f"{results}:1: not JSON" in capsys.readouterr().err


@pytest.mark.timeout(180)
def test_run_cli_plays_scores_and_resumes(tmp_path: Path) -> None:
    import pandas as pd
    from openai_stub_server import OpenAIStubServer, Reply

    from verl_credit.envs.tau2.evaluate import main

    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        from prepare_tau2 import build_rows
    finally:
        sys.path.pop(0)
    rows = [r for r in build_rows("test", ("airline",)) if r["extra_info"]["task_id"] in {"2", "6"}]
    data = tmp_path / "two.parquet"
    pd.DataFrame(rows).to_parquet(data)

    def user(request: dict[str, Any]) -> Reply:
        last = request["messages"][-1]["content"]
        return Reply.completion("I need help with a reservation." if last.startswith("Hi! How") else "Bye ###STOP###")

    with OpenAIStubServer(user) as user_server, OpenAIStubServer(default=Reply.completion("Anything else?")) as policy:
        argv = [
            "run",
            "--policy-base-url",
            policy.base_url,
            "--policy-model",
            "p",
            "--user-base-url",
            user_server.base_url,
            "--user-model",
            "u",
            "--training-user-base-url",
            "http://127.0.0.1:8000/v1",
            "--training-user-model",
            "train-user",
            "--data",
            str(data),
            "--trials",
            "2",
            "--out",
            str(tmp_path / "r.jsonl"),
            "--concurrency",
            "3",
        ]
        assert main(argv) == 0
        records = [json.loads(line) for line in (tmp_path / "r.jsonl").read_text().splitlines()]
        assert sorted((r["task_id"], r["trial"]) for r in records) == [("2", 0), ("2", 1), ("6", 0), ("6", 1)]
        assert all(r["termination"] == "user_stop" and r["assistant_turns"] == 1 for r in records)
        # the policy never acts. Task 2 needs a certificate sent (DB write): 0. Task 6's gold actions only
        # read, so the untouched DB is the gold DB and there is nothing to communicate: tau2 gives 1.
        assert {(r["task_id"], r["reward"]) for r in records} == {("2", 0.0), ("6", 1.0)}
        metrics = json.loads((tmp_path / "r.metrics.json").read_text())
        assert metrics["macro"] == {"pass^1": 0.5, "pass^2": 0.5}
        users = {
            "user": {"base_urls": [user_server.base_url], "model": "u"},
            "training_user": {"base_urls": ["http://127.0.0.1:8000/v1"], "model": "train-user"},
            "same_user": False,
        }
        assert all({k: r[k] for k in users} == users for r in records)  # both users in every result line
        assert metrics["users"] == users
        policy_calls = len(policy.chat_requests)
        assert main(argv) == 0  # resume: every trial is done, no new request
        assert len(policy.chat_requests) == policy_calls == 4


# -- the servers each recipe's header starts (scripts/serve_annotator.sh) ---------------------------

SERVE_SCRIPT = ROOT / "scripts" / "serve_annotator.sh"


def header_serve_commands(recipe: str) -> list[tuple[dict[str, str], list[str]]]:
    """``(env, args)`` of every ``bash scripts/serve_annotator.sh`` line of a recipe's header (a recipe
    that only runs another one: that one's), the continuation lines joined, comments dropped."""
    text = (RECIPES / recipe).read_text()
    header = text.split("set -xeuo pipefail")[0]
    commands = []
    for line in header.splitlines():
        body = line.lstrip("#").strip()
        if "bash scripts/serve_annotator.sh" not in body:  # a command, not a mention
            continue
        words = shlex.split(body.split("  #")[0])
        start = words.index("bash")
        env = dict(word.split("=", 1) for word in words[:start])
        commands.append((env, words[words.index("scripts/serve_annotator.sh") + 1 :]))
    if not commands:
        target = re.search(r'exec bash "\$\(dirname "\$\{BASH_SOURCE\[0\]\}"\)/([^"]+)"', text)
        assert target, f"{recipe}: no serve command and no recipe it runs"
        return header_serve_commands(
            str((RECIPES / recipe).parent.joinpath(target.group(1)).resolve().relative_to(RECIPES))
        )
    return commands


def serve_dry_run(env: dict[str, str], args: list[str]) -> list[list[str]]:
    """The vllm command line of each replica, as ``--dry-run`` prints it (``CUDA_VISIBLE_DEVICES=..`` first)."""
    clean = {k: v for k, v in os.environ.items() if k not in ("CUDA_VISIBLE_DEVICES", "GPUS", "MODEL", "PORT")}
    done = subprocess.run(
        ["bash", str(SERVE_SCRIPT), *args, "--dry-run"],
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    return [shlex.split(line) for line in done.stdout.strip().splitlines()]


def _flag(words: list[str], flag: str) -> str | None:
    return words[words.index(flag) + 1] if flag in words else None


def header_url_ports(recipe: str, knob: str) -> set[int]:
    """Ports of the ``KNOB=http://...`` URLs a recipe's header tells the user to pass (or the recipe it runs)."""
    text = (RECIPES / recipe).read_text()
    header = text.split("set -xeuo pipefail")[0]
    ports = {int(port) for urls in re.findall(rf"{knob}=(\S+)", header) for port in re.findall(r":(\d+)/v1", urls)}
    target = re.search(r'exec bash "\$\(dirname "\$\{BASH_SOURCE\[0\]\}"\)/([^"]+)"', text)
    if not ports and target:
        return header_url_ports(
            str((RECIPES / recipe).parent.joinpath(target.group(1)).resolve().relative_to(RECIPES)), knob
        )
    return ports


@pytest.mark.parametrize("recipe", sorted(TAU2_RECIPES))
def test_each_recipes_servers_start_as_its_header_says(recipe: str) -> None:
    """The header's serve lines, dry-run: the annotator's model with the reasoning parser its vocabulary
    supports (none for Gemma: vLLM's qwen3 parser aborts at start-up without Qwen's think tokens), the
    simulated user with tool calling, on a server of its own, no GPU given to two servers, and every port
    the header's URLs name served by the server of that role."""
    annotator = TAU2_RECIPES[recipe][-1]
    servers = [serve_dry_run(env, args) for env, args in header_serve_commands(recipe)]
    replicas = [words for server in servers for words in server]
    gpus = [g for words in replicas if words[0].startswith("CUDA_VISIBLE_DEVICES=") for g in words[0][21:].split(",")]
    assert len(gpus) == len(set(gpus)), (recipe, gpus)
    users = [s for s in servers if "--tool-call-parser" in s[0]]
    annotators = [s for s in servers if "--tool-call-parser" not in s[0]]
    assert len(users) == 1, recipe
    for words in users[0]:
        assert (
            _flag(words, "--served-model-name") == "Qwen/Qwen3-32B" and _flag(words, "--tool-call-parser") == "hermes"
        )
        assert _flag(words, "--reasoning-parser") == "qwen3"
    user_ports = {int(_flag(w, "--port")) for w in users[0]}
    assert header_url_ports(recipe, "USER_BASE_URL") <= user_ports and header_url_ports(recipe, "USER_BASE_URL")
    if annotator != "llm":
        assert annotators == []  # grpo / gigpo / info_gain: only the user is served
        return
    (server,) = annotators
    annotator_ports = {int(_flag(w, "--port")) for w in server}
    assert header_url_ports(recipe, "ANNOTATOR_BASE_URL") <= annotator_ports and not annotator_ports & user_ports
    expected = "google/gemma-4-31b-it" if recipe == "ablations/annotator_swap.sh" else "Qwen/Qwen3-32B"
    for words in server:
        assert words[1:3] == ["vllm", "serve"] and words[3] == expected
        assert _flag(words, "--reasoning-parser") == (None if "gemma" in expected else "qwen3")


def test_serve_script_picks_the_reasoning_parser_from_the_model() -> None:
    for model, parser in (
        ("Qwen/Qwen3-32B", "qwen3"),
        ("Qwen/QwQ-32B", "qwen3"),
        ("deepseek-ai/DeepSeek-R1-Distill-Qwen-32B", "deepseek_r1"),
        ("google/gemma-4-31b-it", None),
        ("meta-llama/Llama-3.3-70B-Instruct", None),
    ):
        (words,) = serve_dry_run({"MODEL": model}, [])
        assert _flag(words, "--reasoning-parser") == parser, model
    (words,) = serve_dry_run({"MODEL": "google/gemma-4-31b-it", "REASONING_PARSER": "qwen3"}, [])
    assert _flag(words, "--reasoning-parser") == "qwen3"  # an explicit choice wins
    (words,) = serve_dry_run({"MODEL": "Qwen/Qwen3-32B", "REASONING_PARSER": ""}, [])
    assert "--reasoning-parser" not in words


def test_serve_script_splits_gpus_among_replicas() -> None:
    lines = serve_dry_run({"PORT": "9000"}, ["--replicas", "2", "--tp", "2"])
    assert [words[0] for words in lines] == ["CUDA_VISIBLE_DEVICES=0,1", "CUDA_VISIBLE_DEVICES=2,3"]
    assert [_flag(w, "--port") for w in lines] == ["9000", "9001"] and all(
        _flag(w, "--tensor-parallel-size") == "2" for w in lines
    )
    lines = serve_dry_run({"CUDA_VISIBLE_DEVICES": "4,5,6,7"}, ["--replicas=4", "--tp=1"])
    assert [words[0] for words in lines] == [f"CUDA_VISIBLE_DEVICES={g}" for g in (4, 5, 6, 7)]
    (words,) = serve_dry_run({"CUDA_VISIBLE_DEVICES": "3"}, [])  # one replica: the caller's devices, untouched
    assert words[0] == "vllm"
    clean = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    for args, message in (
        (["--replicas", "3", "--tp", "4"], "3 replicas x TP 4 need 12 GPUs, GPUS has 8"),
        (["--replicas", "0"], "REPLICAS must be a positive integer"),
        (["--tp"], "TP must be a positive integer, got '--dry-run'"),  # --tp took the next word
    ):
        done = subprocess.run(
            ["bash", str(SERVE_SCRIPT), *args, "--dry-run"],
            env={**clean, "GPUS": "0,1,2,3,4,5,6,7"},
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert done.returncode == 2 and message in done.stderr, (args, done.stderr)


def _fake_vllm(folder: Path) -> Path:
    """Stands in for ``vllm``: records its argv and CUDA_VISIBLE_DEVICES, serves the stub on ``--port``."""
    stub = ROOT / "tests" / "openai_stub_server.py"
    script = folder / "vllm"
    script.write_text(
        f"#!{sys.executable}\n"
        "import json, os, runpy, sys\n"
        "port = sys.argv[sys.argv.index('--port') + 1]\n"
        f"open({str(folder)!r} + f'/argv_{{port}}.json', 'w').write(\n"
        "    json.dumps([os.environ.get('CUDA_VISIBLE_DEVICES'), *sys.argv[1:]]))\n"
        f"sys.argv = [{str(stub)!r}, '--port', port]\n"
        f"runpy.run_path({str(stub)!r}, run_name='__main__')\n"
    )
    script.chmod(0o755)
    return script


@pytest.mark.timeout(120)
def test_serve_script_starts_replicas_and_stops_them_all(tmp_path: Path) -> None:
    from openai_stub_server import unused_port

    port = unused_port()
    while unused_port() == port + 1:  # the next port must be free too (rarely not)
        port = unused_port()
    env = {
        **{k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"},
        "VLLM_BIN": str(_fake_vllm(tmp_path)),
        "HOST": "127.0.0.1",
        "PORT": str(port),
        "GPUS": "6,7",
        "HEALTH_INTERVAL": "0.2",
        "HEALTH_TIMEOUT": "60",
    }
    process = subprocess.Popen(
        ["bash", str(SERVE_SCRIPT), "--replicas", "2", "--tp", "1"], env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        assert process.stdout is not None
        lines: list[str] = []
        while not lines or "base_urls=" not in lines[-1]:
            lines.append(process.stdout.readline().strip())
            assert lines[-1] or process.poll() is None, lines
        urls = [f"http://127.0.0.1:{port}/v1", f"http://127.0.0.1:{port + 1}/v1"]
        ready = [line for line in lines if line.startswith("annotator ready")]
        assert ready == [
            f"annotator ready: model=Qwen/Qwen3-32B base_url={urls[0]}",
            f"annotator ready: model=Qwen/Qwen3-32B base_url={urls[1]}",
            f"annotator ready: model=Qwen/Qwen3-32B base_urls={urls[0]},{urls[1]}",
        ]
        for offset, gpu in ((0, "6"), (1, "7")):
            recorded = json.loads((tmp_path / f"argv_{port + offset}.json").read_text())
            assert recorded[0] == gpu and recorded[1:3] == ["serve", "Qwen/Qwen3-32B"]
    finally:
        process.terminate()
        process.wait(timeout=20)
    import httpx

    for url in urls:  # the script took both servers down with it
        with pytest.raises(httpx.ConnectError):
            httpx.get(url + "/models")


# -- docs/cluster.md ------------------------------------------------------------------------------


def test_cluster_doc_is_linked_and_matches_the_code() -> None:
    """docs/cluster.md exists, the README points to it, its rollout-memory defaults are the recipes',
    and every credit/* metric it tells a user to watch is one the code logs."""
    doc = (ROOT / "docs" / "cluster.md").read_text()
    assert "](docs/cluster.md)" in (ROOT / "README.md").read_text()
    common = (RECIPES / "common.sh").read_text()
    for value in ("0.7", "0.8"):
        assert f"ROLLOUT_GPU_MEM={value}" in doc and f"ROLLOUT_GPU_MEM={value}" in common
    source = "\n".join(path.read_text() for path in (ROOT / "verl_credit").rglob("*.py"))
    watched = set(re.findall(r"`(credit/[a-z_]+)`", doc))
    assert len(watched) >= 10
    missing = sorted(name for name in watched if name not in source and name.rsplit("_", 1)[0] not in source)
    assert not missing, missing
    for section in ("two-node layout", "one-node layout", "ray start", "Shared storage", "first 10 steps", "Resuming"):
        assert section.lower() in doc.lower(), section


def _shell_lines(markdown: str) -> list[str]:
    """The command lines of a markdown text's ```bash blocks, continuation lines joined, comments dropped."""
    lines: list[str] = []
    for block in re.findall(r"```bash\n(.*?)```", markdown, flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            body = line.split("  #")[0].strip()
            if body and not body.startswith("#"):
                lines.append(body)
    return lines


def _env_and_args(line: str, script: str) -> tuple[dict[str, str], list[str]]:
    words = shlex.split(line)
    start = words.index("bash")
    return dict(word.split("=", 1) for word in words[:start]), words[words.index(script) + 1 :]


def test_cluster_doc_commands_compose_and_quote_the_defaults(tmp_path: Path, shim: Path) -> None:
    """Every recipe command of docs/cluster.md composes (placeholder values ``...`` left out) into a
    config verl accepts: PPO_MINI_BATCH_SIZE (the recipes' 16 unless given) at most TRAIN_BATCH_SIZE;
    the session deadline the doc and the recipes' header quote is the settings' default."""
    from verl_credit.verl.main import validate
    from verl_credit.verl.settings import SessionSettings

    doc = (ROOT / "docs" / "cluster.md").read_text()
    default = SessionSettings().deadline
    assert re.findall(r"`credit\.session\.deadline`, (\d+) s by default", doc) == [f"{default:g}"]
    assert f"credit.session.deadline ({default:g} s)" in (RECIPES / "common.sh").read_text()
    commands = [line for line in _shell_lines(doc) if re.search(r"bash recipes/\S+\.sh", line)]
    assert len(commands) >= 3
    for number, line in enumerate(commands):
        recipe = re.search(r"bash recipes/(\S+\.sh)", line).group(1)
        env, _ = _env_and_args(line, f"recipes/{recipe}")
        env = {key: value for key, value in env.items() if value != "..."}
        folder = tmp_path / str(number)
        folder.mkdir()
        cfg, _ = dry_run_config(recipe, folder, shim, **env)
        validate(cfg)
        assert cfg.data.train_batch_size >= cfg.actor_rollout_ref.actor.ppo_mini_batch_size, line
        if "TRAIN_BATCH_SIZE" in env:
            assert cfg.data.train_batch_size == int(env["TRAIN_BATCH_SIZE"])


@pytest.mark.parametrize("path", ["README.md", "docs/cluster.md"])
def test_documented_servers_get_gpus_of_their_own(path: str) -> None:
    """The scripts/serve_annotator.sh lines of the README's GPU quickstart and of docs/cluster.md's
    layouts, dry-run per layout (a ```bash block): every replica is given its GPUs
    (CUDA_VISIBLE_DEVICES set), and no GPU goes to two servers."""
    text = (ROOT / path).read_text()
    if path == "README.md":
        text = text.split("## Reproducing the IAPO paper on tau2-bench (GPU)")[1].split("\n## ")[0]
    blocks = [block for block in re.findall(r"```bash\n.*?```", text, flags=re.S) if "serve_annotator.sh" in block]
    assert blocks
    for block in blocks:
        lines = [line for line in _shell_lines(block) if "bash scripts/serve_annotator.sh" in line]
        devices: list[str | None] = []
        for line in lines:
            env, args = _env_and_args(line, "scripts/serve_annotator.sh")
            for words in serve_dry_run(env, args):
                # the script sets each replica's devices, or (one replica, no GPUS) keeps the caller's
                given = words[0] if words[0].startswith("CUDA_VISIBLE_DEVICES=") else None
                devices.append(given.split("=", 1)[1] if given else env.get("CUDA_VISIBLE_DEVICES"))
        assert len(devices) >= 2 and None not in devices, (path, lines)
        gpus = [gpu for found in devices for gpu in str(found).split(",")]
        assert len(gpus) == len(set(gpus)), (path, gpus)
