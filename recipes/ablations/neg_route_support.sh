#!/usr/bin/env bash
# Ablation (IAPO paper, Qwen3-8B on tau2-bench; docs/design.md section 7): negative branch routed by support features (w- = m+).
# Expected (held-out test, domain-macro pass^1): 41.88 or 41.46 (docs/design.md lists 'projected negative branches 41.88 / 41.46' without saying which variant is which)
#   reference points: IAPO (beta+=0.05, c=0.25, neg_route=error) 42.18; GRPO 29.61.
# Everything else is recipes/iapo/qwen3_8b_tau2.sh (same knobs; "$@" is passed through as Hydra overrides).
#   ANNOTATOR_BASE_URL=http://<server>:8000/v1 USER_BASE_URL=http://<server>:8100/v1 bash recipes/ablations/neg_route_support.sh      (DRY_RUN=1: print config only)
set -xeuo pipefail

export NEG_ROUTE=support
export EXPERIMENT_NAME=${EXPERIMENT_NAME:-iapo_qwen3_8b_tau2_neg_route_support}
exec bash "$(dirname "${BASH_SOURCE[0]}")/../iapo/qwen3_8b_tau2.sh" "$@"
