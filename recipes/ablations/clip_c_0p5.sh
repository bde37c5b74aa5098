#!/usr/bin/env bash
# Ablation (IAPO paper, Qwen3-8B on tau2-bench; docs/design.md section 7): clip bound c = 0.5 (weights within exp(2c) = 2.72x).
# Expected (held-out test, domain-macro pass^1): 42.29 on tau2 (but UserBench 17.78, AgentChange 25.67: the wider clip does not transfer)
#   reference points: IAPO (beta+=0.05, c=0.25, neg_route=error) 42.18; GRPO 29.61.
# Everything else is recipes/iapo/qwen3_8b_tau2.sh (same knobs; "$@" is passed through as Hydra overrides).
#   ANNOTATOR_BASE_URL=http://<server>:8000/v1 USER_BASE_URL=http://<server>:8100/v1 bash recipes/ablations/clip_c_0p5.sh      (DRY_RUN=1: print config only)
set -xeuo pipefail

export CLIP_C=0.5
export EXPERIMENT_NAME=${EXPERIMENT_NAME:-iapo_qwen3_8b_tau2_clip_c_0p5}
exec bash "$(dirname "${BASH_SOURCE[0]}")/../iapo/qwen3_8b_tau2.sh" "$@"
