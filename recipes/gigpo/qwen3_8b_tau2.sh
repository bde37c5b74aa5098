#!/usr/bin/env bash
# GiGPO baseline, Qwen3-8B on tau2-bench (the IAPO paper's Table 1 comparator; docs/design.md section 4b).
#
# Same setup as recipes/grpo/qwen3_8b_tau2.sh and recipes/iapo/qwen3_8b_tau2.sh (verl/FSDP, N=16,
# max 30 turns, thinking off, 178-task train split); only the advantage differs: the episode
# advantage plus GiGPO's step advantage over anchor-state groups (verl-agent defaults: weight 1,
# gamma 0.95, mean_norm, exact-prefix states). Watch credit/anchor_match_rate: the paper's argument
# is that free-form dialogue rarely repeats a state beyond the first turn. The paper reports no
# GiGPO number for tau2 here (docs/design.md section 7): this recipe has none to reproduce.
# Hardware: 1 node x 8 GPUs for training + the simulated user's server on other GPUs (docs/cluster.md).
#
#   python scripts/prepare_tau2.py --out ~/data/tau2     # train 153 + val 25 (carved out of train) + test 100 tasks
#   PORT=8100 bash scripts/serve_annotator.sh --replicas 2 --tp 2 --enable-auto-tool-choice --tool-call-parser hermes
#                                                        # Qwen3-32B, tau2's simulated user: :8100, :8101 (GPUs 0-3)
#   USER_BASE_URL=http://<server>:8100/v1,http://<server>:8101/v1 bash recipes/gigpo/qwen3_8b_tau2.sh [hydra overrides...]
#   DRY_RUN=1 bash recipes/gigpo/qwen3_8b_tau2.sh      # print the composed config, stop before Ray
# Knobs: see recipes/common.sh; MODEL_PATH, ROLLOUT_TP, EXPERIMENT_NAME, GIGPO_STATE here.
set -xeuo pipefail

RECIPES_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
MODEL_PATH=${MODEL_PATH:-Qwen/Qwen3-8B}
ROLLOUT_TP=${ROLLOUT_TP:-2}
EXPERIMENT_NAME=${EXPERIMENT_NAME:-gigpo_qwen3_8b_tau2}
GIGPO_STATE=${GIGPO_STATE:-prefix}
source "$RECIPES_DIR/common.sh"
tau2_sections

ALGORITHM=(
    algorithm.adv_estimator=gigpo
    algorithm.norm_adv_by_std_in_grpo=True
    algorithm.use_kl_in_reward=False
)
CREDIT=(
    credit.annotator.name=rules
    credit.gigpo.step_advantage_w=1.0
    credit.gigpo.gamma=0.95
    credit.gigpo.mode=mean_norm
    credit.gigpo.state="$GIGPO_STATE"
)

require_endpoint "simulated-user" "$USER_BASE_URL"
launch_credit_trainer "${DATA[@]}" "${MODEL[@]}" "${ACTOR[@]}" "${ROLLOUT[@]}" "${ENVIRONMENT[@]}" \
    "${ALGORITHM[@]}" "${CREDIT[@]}" "${TRAINER[@]}" "$@"
