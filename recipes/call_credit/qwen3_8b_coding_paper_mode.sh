#!/usr/bin/env bash
# CALL-CREDIT with the seed's literal decomposition (call_credit.mode=paper: A_i = A * s_i * T, no mass
# conservation; docs/design.md section 4), Qwen3-8B on the coding sandbox, for comparison with mass_conserving.
# Expected: no reference numbers in docs/design.md section 7.
# Everything else is recipes/call_credit/qwen3_8b_coding.sh ("$@" passed through; DRY_RUN=1 prints the config).
set -xeuo pipefail

export CALL_CREDIT_MODE=paper
export EXPERIMENT_NAME=${EXPERIMENT_NAME:-call_credit_paper_mode_qwen3_8b_coding}
exec bash "$(dirname "${BASH_SOURCE[0]}")/qwen3_8b_coding.sh" "$@"
