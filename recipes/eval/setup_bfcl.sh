#!/usr/bin/env bash
# A venv of its own for the bfcl-eval package (BFCL-v4's generator and scorer): bfcl-eval pins numpy 1.26
# and others that the training environment must not get, so it never goes into the project's venv.
#
#   bash recipes/eval/setup_bfcl.sh            # prints the venv's python last (BFCL_PYTHON for bfcl_eval.sh)
# Knobs: BFCL_VENV [<repo>/.cpu-train/bfcl-venv]  BFCL_EVAL_VERSION [2026.3.23]  PYTHON [python3]
# Reused while its marker names the same version; the package's data (the BFCL-v4 test cases) ships in it.
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BFCL_VENV=${BFCL_VENV:-$REPO/.cpu-train/bfcl-venv}
BFCL_EVAL_VERSION=${BFCL_EVAL_VERSION:-2026.3.23}
PYTHON=${PYTHON:-python3}
# qwen-agent, which bfcl-eval's Qwen handlers import, imports soundfile without declaring it
# (qwen-agent 0.0.34: qwen_agent/utils/utils.py), so `bfcl generate` dies on a fresh venv without it
UNDECLARED_DEPS="soundfile==0.14.0"
MARKER="$BFCL_EVAL_VERSION $UNDECLARED_DEPS"
if [[ "$(cat "$BFCL_VENV/.bfcl-eval" 2>/dev/null)" != "$MARKER" ]]; then
    rm -rf "$BFCL_VENV"
    "$PYTHON" -m venv "$BFCL_VENV"
    # shellcheck disable=SC2086  # the undeclared dependencies are separate words
    timeout 1800 "$BFCL_VENV/bin/python" -m pip install --quiet "bfcl-eval==$BFCL_EVAL_VERSION" $UNDECLARED_DEPS >&2
    echo "$MARKER" > "$BFCL_VENV/.bfcl-eval"
fi
echo "$BFCL_VENV/bin/python"
