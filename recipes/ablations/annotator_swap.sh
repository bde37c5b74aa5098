#!/usr/bin/env bash
# Ablation (IAPO paper, Qwen3-8B on tau2-bench; docs/design.md section 7): swap the annotator model.
# Expected (held-out test, domain-macro pass^1): Gemma4-31B annotator 40.90 (Qwen3-32B annotator: 42.18; GRPO 29.61).
# Any model served behind an OpenAI-compatible endpoint works: serve it in the annotator's place and pass its
# served name; scripts/serve_annotator.sh picks the reasoning parser from the model (none for Gemma: vLLM's qwen3
# parser would abort at start-up). The simulated user stays Qwen3-32B on its own server (USER_BASE_URL /
# USER_MODEL, recipes/common.sh), so only the annotator changes.
#   MODEL=google/gemma-4-31b-it bash scripts/serve_annotator.sh --replicas 2 --tp 2   # the annotator: :8000, :8001
#   PORT=8100 GPUS=4,5,6,7 bash scripts/serve_annotator.sh --replicas 2 --tp 2 --enable-auto-tool-choice --tool-call-parser hermes
#                                                        # Qwen3-32B, tau2's simulated user: :8100, :8101
#   ANNOTATOR_MODEL=<served name> ANNOTATOR_BASE_URL=http://<server>:8000/v1,http://<server>:8001/v1 \
#   USER_BASE_URL=http://<server>:8100/v1,http://<server>:8101/v1 bash recipes/ablations/annotator_swap.sh
#   (DRY_RUN=1: print config only)
# The default model name below is the Gemma 4 31B instruction model's id as we expect it to be served; set
# ANNOTATOR_MODEL to whatever name your server reports at /v1/models.
set -xeuo pipefail

export ANNOTATOR_MODEL=${ANNOTATOR_MODEL:-google/gemma-4-31b-it}
slug=$(printf '%s' "$ANNOTATOR_MODEL" | tr -c 'A-Za-z0-9._-' '_')
export EXPERIMENT_NAME=${EXPERIMENT_NAME:-iapo_qwen3_8b_tau2_annotator_${slug}}
exec bash "$(dirname "${BASH_SOURCE[0]}")/../iapo/qwen3_8b_tau2.sh" "$@"
