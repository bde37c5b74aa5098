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
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
RECIPES = ROOT / "recipes"
MAIN_ARGS = ["-m", "verl_credit.main"]
DRY_FLAGS = ["--cfg", "job", "--resolve"]

# DESIGN.md section 7 numbers each header must state
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
}
CODING_RECIPES = {
    "call_credit/qwen3_8b_coding.sh": ("call_credit", "mass_conserving"),
    "call_credit/grpo_qwen3_8b_coding.sh": ("grpo", "mass_conserving"),
    "call_credit/qwen3_8b_coding_paper_mode.sh": ("call_credit", "paper"),
}


#: run for real by tests/e2e/test_cpu_training.py
CPU_RECIPES = {"cpu/setup_env.sh", "cpu/train.sh", "cpu/smoke.sh"}


def test_every_recipe_file_is_covered() -> None:
    found = {str(p.relative_to(RECIPES)) for p in RECIPES.rglob("*.sh")} - {"common.sh"}
    assert found == set(TAU2_RECIPES) | set(CODING_RECIPES) | {"eval/tau2_eval.sh"} | CPU_RECIPES


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
    """The setup of DESIGN.md section 7 common to every tau2 recipe."""
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
    assert cfg.data.val_files.endswith("data/tau2/test.parquet")


@pytest.mark.timeout(600)
def test_tau2_recipes_compose_to_the_paper_setup(tmp_path_factory: pytest.TempPathFactory, shim: Path) -> None:
    from verl_credit.config import GiGPOConfig
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
        if recipe == "ablations/annotator_swap.sh":
            assert settings.annotator.model == "google/gemma-4-31b-it"
            assert settings.annotator.base_urls == ("http://annot:8001/v1",)
            assert env.user_config.model == "Qwen/Qwen3-32B"  # only the annotator is swapped
            assert env.user_config.base_urls == ("http://127.0.0.1:8000/v1",)
        else:
            assert env.user_config.model == "Qwen/Qwen3-32B"
            assert env.user_config.base_urls == ("http://annot:8001/v1",)
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
        if estimator == "gigpo":  # verl-agent's defaults (DESIGN.md section 4b)
            assert settings.credit.gigpo == GiGPOConfig(step_advantage_w=1.0, gamma=0.95, mode="mean_norm")


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
        DATA_DIR="/data/t2",
        USER_BASE_URL="http://u1:1/v1,http://u2:1/v1",
    )
    assert cfg.actor_rollout_ref.rollout.n == 4 and cfg.credit.iapo.clip_c == 0.7
    assert cfg.credit.env.options.user.model == "other-user-model"
    assert list(cfg.credit.env.options.user.base_urls) == ["http://u1:1/v1", "http://u2:1/v1"]
    assert cfg.trainer.n_gpus_per_node == 4 and cfg.trainer.nnodes == 2
    assert cfg.data.train_files == "/data/t2/train.parquet"


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
    cfg, _ = dry_run_config("iapo/qwen3_8b_tau2.sh", tmp_path, shim, CACHE_DIR="/nfs/cache", NNODES="2")
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
    for split in ("train", "test"):
        (data / f"{split}.parquet").write_bytes(b"")
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
    result = run_recipe("eval/tau2_eval.sh", tmp_path, sys.executable, DRY_RUN="1", CKPT=str(ckpt))
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
    assert plan["policy"]["temperature"] == 0.0 and plan["user"]["model"] == "Qwen/Qwen3-32B"
    assert plan["max_parallel_calls"] == 16  # as the training recipes (verl's default 1 drops parallel calls)
    assert not out_dir.exists()  # a dry run writes nothing
    result = run_recipe(
        "eval/tau2_eval.sh", tmp_path, sys.executable, DRY_RUN="1", CKPT=str(ckpt), MAX_PARALLEL_CALLS="3"
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads(result.stdout.strip().splitlines()[-1])["max_parallel_calls"] == 3
    assert "--trust-env" not in result.stderr  # set -x trace: proxies are ignored unless ENDPOINT_USE_PROXY=1
    result = run_recipe(
        "eval/tau2_eval.sh", tmp_path, sys.executable, DRY_RUN="1", CKPT=str(ckpt), ENDPOINT_USE_PROXY="1"
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "--trust-env" in result.stderr


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
        policy_calls = len(policy.chat_requests)
        assert main(argv) == 0  # resume: every trial is done, no new request
        assert len(policy.chat_requests) == policy_calls == 4
