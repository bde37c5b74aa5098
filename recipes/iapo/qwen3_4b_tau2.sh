#!/usr/bin/env bash
# IAPO, Qwen3-4B on tau2-bench (IAPO paper, Qwen3-4B row; docs/design.md section 7).
#
# Reproduces: verl/FSDP GRPO with IAPO credit (algorithm.adv_estimator=iapo), N=16, max 30 turns, thinking off,
# beta+=0.05, c=0.25, negative branch = error features; frozen annotator Qwen3-32B at temperature 0 (the LLM
# annotator always samples at temperature 0) served by scripts/serve_annotator.sh on its own GPUs.
# Expected (held-out test, 20/40/40 tasks x 4 trials, domain-macro pass^1, recipes/eval/tau2_eval.sh):
#   IAPO 38.40   vs   GRPO 34.79 (recipes/grpo/qwen3_4b_tau2.sh); per-domain numbers are not in docs/design.md;
#   tool-call redundancy (credit/tool_call_redundancy) GRPO 46.00 -> IAPO 29.74 at 4B
# Hardware: 1 node x 8 GPUs (paper: 8xH20) for training + 8 more GPUs for the annotator's and the simulated user's
# servers (docs/cluster.md).
#
#   python scripts/prepare_tau2.py --out ~/data/tau2     # train 153 + val 25 (carved out of train) + test 100 tasks
#   bash scripts/serve_annotator.sh --replicas 2 --tp 2  # Qwen3-32B, the IAPO annotator: :8000, :8001 (GPUs 0-3)
#   PORT=8100 GPUS=4,5,6,7 bash scripts/serve_annotator.sh --replicas 2 --tp 2 --enable-auto-tool-choice --tool-call-parser hermes
#                                                        # Qwen3-32B, tau2's simulated user: :8100, :8101 (GPUs 4-7)
#   ANNOTATOR_BASE_URL=http://<server>:8000/v1,http://<server>:8001/v1 \
#   USER_BASE_URL=http://<server>:8100/v1,http://<server>:8101/v1 bash recipes/iapo/qwen3_4b_tau2.sh [hydra overrides...]
#   DRY_RUN=1 bash recipes/iapo/qwen3_4b_tau2.sh      # print the composed config, stop before Ray
# Knobs: as recipes/iapo/qwen3_8b_tau2.sh (this script only changes the model defaults and runs it).
set -xeuo pipefail

export MODEL_PATH=${MODEL_PATH:-Qwen/Qwen3-4B}
export ROLLOUT_TP=${ROLLOUT_TP:-1}
export EXPERIMENT_NAME=${EXPERIMENT_NAME:-iapo_qwen3_4b_tau2}
exec bash "$(dirname "${BASH_SOURCE[0]}")/qwen3_8b_tau2.sh" "$@"
