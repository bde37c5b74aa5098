#!/usr/bin/env bash
# GRPO baseline, Qwen3-8B on tau2-bench (IAPO paper's GRPO row; docs/design.md section 7).
#
# Reproduces: verl/FSDP GRPO, N=16, max 30 turns, thinking off, trained on the 178-task train split.
# Expected (held-out test, 20/40/40 tasks x 4 trials, domain-macro pass^1, recipes/eval/tau2_eval.sh):
#   GRPO 29.61 (airline 22.78, retail 44.31, telecom 21.74)   vs   IAPO 42.18 (recipes/iapo/qwen3_8b_tau2.sh)
# Hardware: 1 node x 8 GPUs (paper: 8xH20) for training + the simulated user's server on other GPUs (docs/cluster.md).
#
#   python scripts/prepare_tau2.py --out ~/data/tau2     # train 153 + val 25 (carved out of train) + test 100 tasks
#   PORT=8100 bash scripts/serve_annotator.sh --replicas 2 --tp 2 --enable-auto-tool-choice --tool-call-parser hermes
#                                                        # Qwen3-32B, tau2's simulated user: :8100, :8101 (GPUs 0-3)
#   USER_BASE_URL=http://<server>:8100/v1,http://<server>:8101/v1 bash recipes/grpo/qwen3_8b_tau2.sh [hydra overrides...]
#   DRY_RUN=1 bash recipes/grpo/qwen3_8b_tau2.sh      # print the composed config, stop before Ray
# Knobs: see recipes/common.sh; MODEL_PATH, ROLLOUT_TP, EXPERIMENT_NAME here.
set -xeuo pipefail

RECIPES_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
MODEL_PATH=${MODEL_PATH:-Qwen/Qwen3-8B}
ROLLOUT_TP=${ROLLOUT_TP:-2}
EXPERIMENT_NAME=${EXPERIMENT_NAME:-grpo_qwen3_8b_tau2}
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
