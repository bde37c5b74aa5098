#!/usr/bin/env bash
# IAPO, Qwen3-8B on tau2-bench: the IAPO paper's main result (docs/design.md section 7).
#
# Reproduces: verl/FSDP GRPO with IAPO credit (algorithm.adv_estimator=iapo), N=16, max 30 turns, thinking off,
# beta+=0.05, c=0.25, negative branch = error features; frozen annotator Qwen3-32B at temperature 0 (the LLM
# annotator always samples at temperature 0) served by scripts/serve_annotator.sh on its own GPUs.
# Expected (held-out test, 20/40/40 tasks x 4 trials, domain-macro pass^1, recipes/eval/tau2_eval.sh):
#   IAPO 42.18 (airline 29.72, retail 56.88, telecom 39.93)   vs   GRPO 29.61 (recipes/grpo/qwen3_8b_tau2.sh)
# Hardware: 1 node x 8 GPUs (paper: 8xH20) for training + 8 more GPUs for the annotator's and the simulated user's
# servers (docs/cluster.md: the two-node layout that works, the one-node one, Ray, storage, what to watch).
#
#   python scripts/prepare_tau2.py --out ~/data/tau2     # train 153 + val 25 (carved out of train) + test 100 tasks
#   bash scripts/serve_annotator.sh --replicas 2 --tp 2  # Qwen3-32B, the IAPO annotator: :8000, :8001 (GPUs 0-3)
#   PORT=8100 GPUS=4,5,6,7 bash scripts/serve_annotator.sh --replicas 2 --tp 2 --enable-auto-tool-choice --tool-call-parser hermes
#                                                        # Qwen3-32B, tau2's simulated user: :8100, :8101 (GPUs 4-7)
#   ANNOTATOR_BASE_URL=http://<server>:8000/v1,http://<server>:8001/v1 \
#   USER_BASE_URL=http://<server>:8100/v1,http://<server>:8101/v1 bash recipes/iapo/qwen3_8b_tau2.sh [hydra overrides...]
#   DRY_RUN=1 bash recipes/iapo/qwen3_8b_tau2.sh      # print the composed config, stop before Ray
# Dynamic sampling (verl's group filtering) is off, as the paper trains: DYNAMIC_SAMPLING=1 switches it on.
# Knobs: see recipes/common.sh; here MODEL_PATH, ROLLOUT_TP, EXPERIMENT_NAME, BETA_PLUS, CLIP_C, NEG_ROUTE,
# BETA_MINUS (the ablation recipes set these).
set -xeuo pipefail

RECIPES_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
MODEL_PATH=${MODEL_PATH:-Qwen/Qwen3-8B}
ROLLOUT_TP=${ROLLOUT_TP:-2}
EXPERIMENT_NAME=${EXPERIMENT_NAME:-iapo_qwen3_8b_tau2}
BETA_PLUS=${BETA_PLUS:-0.05}
CLIP_C=${CLIP_C:-0.25}
NEG_ROUTE=${NEG_ROUTE:-error}
BETA_MINUS=${BETA_MINUS:-0.05}
case "$NEG_ROUTE" in error | support | projected) ;; *) echo "NEG_ROUTE must be error|support|projected" >&2 && exit 2 ;; esac
source "$RECIPES_DIR/common.sh"
tau2_sections

ALGORITHM=(
    algorithm.adv_estimator=iapo
    algorithm.norm_adv_by_std_in_grpo=True
    algorithm.use_kl_in_reward=False
)
TRAINER+=(trainer.v1.trainer_mode=credit_sync)
CREDIT=(
    credit.iapo.beta_plus="$BETA_PLUS"
    credit.iapo.clip_c="$CLIP_C"
    credit.iapo.neg_route="$NEG_ROUTE"
    credit.iapo.beta_minus="$BETA_MINUS"
    credit.annotator.name=llm
    "credit.annotator.base_urls=$(hydra_list "$ANNOTATOR_BASE_URL")"
    "credit.annotator.model=$ANNOTATOR_MODEL"
    credit.annotator.in_rollout=True
    "$(cache_path_override)" # node-local $CACHE_DIR, not $CKPT_DIR (often NFS; sqlite WAL needs one host)
)

require_endpoint "annotator" "$ANNOTATOR_BASE_URL"
require_endpoint "simulated-user" "$USER_BASE_URL"
launch_credit_trainer "${DATA[@]}" "${MODEL[@]}" "${ACTOR[@]}" "${ROLLOUT[@]}" "${ENVIRONMENT[@]}" \
    "${ALGORITHM[@]}" "${CREDIT[@]}" "${TRAINER[@]}" "$@"
