#!/usr/bin/env bash
# InfoPO baseline (algorithm.adv_estimator=info_gain), Qwen3-4B on tau2-bench (the IAPO paper's Table 1, 4B rows).
#
# Reproduces: the paper's InfoPO comparator at 4B, same setup as recipes/grpo/qwen3_4b_tau2.sh.
# Expected (held-out test, 20/40/40 tasks x 4 trials, domain-macro pass^1, recipes/eval/tau2_eval.sh):
#   InfoPO 37.99   vs   GRPO 34.79, GiGPO 37.22, IAPO 38.40 (the paper's Table 1 at 4B)
# Hardware: 1 node x 8 GPUs (paper: 8xH20) for training + the user-simulator server on its own GPUs.
#
#   USER_BASE_URL=http://<server>:8000/v1 bash recipes/info_gain/qwen3_4b_tau2.sh [hydra overrides...]
#   DRY_RUN=1 bash recipes/info_gain/qwen3_4b_tau2.sh      # print the composed config, stop before Ray
# Everything else is recipes/info_gain/qwen3_8b_tau2.sh (same knobs; "$@" is passed through).
set -xeuo pipefail

export MODEL_PATH=${MODEL_PATH:-Qwen/Qwen3-4B}
export ROLLOUT_TP=${ROLLOUT_TP:-1}
export EXPERIMENT_NAME=${EXPERIMENT_NAME:-info_gain_qwen3_4b_tau2}
exec bash "$(dirname "${BASH_SOURCE[0]}")/qwen3_8b_tau2.sh" "$@"
