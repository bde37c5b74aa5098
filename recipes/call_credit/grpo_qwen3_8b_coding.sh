#!/usr/bin/env bash
# GRPO baseline for CALL-CREDIT: Qwen3-8B on the coding sandbox, flat trajectory advantage on every call.
# Expected: no reference numbers in docs/design.md section 7; by construction credit/reward_hacking_rate is 0 for GRPO.
# Everything else is recipes/call_credit/qwen3_8b_coding.sh ("$@" passed through; DRY_RUN=1 prints the config).
set -xeuo pipefail

export ESTIMATOR=grpo
exec bash "$(dirname "${BASH_SOURCE[0]}")/qwen3_8b_coding.sh" "$@"
