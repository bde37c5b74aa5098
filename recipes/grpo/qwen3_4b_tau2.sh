#!/usr/bin/env bash
# GRPO baseline, Qwen3-4B on tau2-bench (IAPO paper, Qwen3-4B GRPO row; DESIGN.md section 7).
#
# Reproduces: verl/FSDP GRPO, N=16, max 30 turns, thinking off, trained on the 178-task train split.
# Expected (held-out test, 20/40/40 tasks x 4 trials, domain-macro pass^1, recipes/eval/tau2_eval.sh):
#   GRPO 34.79   vs   IAPO 38.40 (recipes/iapo/qwen3_4b_tau2.sh); per-domain numbers are not in DESIGN.md
# Hardware: 1 node x 8 GPUs (paper: 8xH20) for training + the user-simulator server on its own GPUs.
#
#   python scripts/prepare_tau2.py --out ~/data/tau2
#   bash scripts/serve_annotator.sh --enable-auto-tool-choice --tool-call-parser hermes   # Qwen3-32B user, other GPUs
#   USER_BASE_URL=http://<server>:8000/v1 bash recipes/grpo/qwen3_4b_tau2.sh [hydra overrides...]
#   DRY_RUN=1 bash recipes/grpo/qwen3_4b_tau2.sh      # print the composed config, stop before Ray
# Knobs: see recipes/common.sh; MODEL_PATH, ROLLOUT_TP, EXPERIMENT_NAME here.
set -xeuo pipefail

RECIPES_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
MODEL_PATH=${MODEL_PATH:-Qwen/Qwen3-4B}
ROLLOUT_TP=${ROLLOUT_TP:-1}
EXPERIMENT_NAME=${EXPERIMENT_NAME:-grpo_qwen3_4b_tau2}
source "$RECIPES_DIR/common.sh"
tau2_sections

ALGORITHM=(
    algorithm.adv_estimator=grpo
    algorithm.norm_adv_by_std_in_grpo=True
    algorithm.use_kl_in_reward=False
)
CREDIT=(
    credit.annotator.name=rules
)

require_endpoint "simulated-user" "$USER_BASE_URL"
launch_credit_trainer "${DATA[@]}" "${MODEL[@]}" "${ACTOR[@]}" "${ROLLOUT[@]}" "${ENVIRONMENT[@]}" \
    "${ALGORITHM[@]}" "${CREDIT[@]}" "${TRAINER[@]}" "$@"
