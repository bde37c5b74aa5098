#!/usr/bin/env bash
# Out-of-domain check of a checkpoint: BFCL-v4 multi-turn (function-calling retention) with the bfcl-eval
# package's own generator and scorer, against the checkpoint served by vLLM's OpenAI server.
# Expected (IAPO paper, Qwen3-8B): IAPO 39.36 vs GRPO 39.04 (overall multi-turn accuracy, %).
#
# Steps: (1) a verl FSDP checkpoint (…/global_step_N/actor) is merged to a Hugging Face model as in
# recipes/eval/tau2_eval.sh; (2) it is served with `vllm serve <model folder>` (the served name is the folder:
# bfcl-eval's local handler sends its --local-model-path as the model name); skip both with POLICY_BASE_URL
# (its served name must be the merged folder); (3) `bfcl generate --backend vllm --skip-server-setup` with the
# package's handler BFCL_MODEL (prompt format, tool-call parsing) and `bfcl evaluate`, in bfcl-eval's own venv
# (recipes/eval/setup_bfcl.sh); (4) recipes/eval/bfcl_eval.py summarize writes $OUT_DIR/summary.json:
# per category and the unweighted mean, the number scripts/paper_table.py puts in the table.
#
#   CKPT=~/ckpt/verl_credit_tau2/iapo_qwen3_8b_tau2/global_step_150/actor bash recipes/eval/bfcl_eval.sh
#   DRY_RUN=1 CKPT=Qwen/Qwen3-8B bash recipes/eval/bfcl_eval.sh      # print the plan, no GPU, no request
# Knobs: CKPT, OUT_DIR, BFCL_MODEL [Qwen/Qwen3-8B-FC: bfcl-eval's handler for a vLLM-served Qwen3 in function-
# calling mode], CATEGORIES [multi_turn = base, miss_func, miss_param, long_context], CASES [0 = all; N = the first
# N of each category], TEMPERATURE [0.001: bfcl's default], THREADS [8], POLICY_TP [1], POLICY_GPUS [0],
# POLICY_PORT [8200], POLICY_BASE_URL, MAX_MODEL_LEN [32768], BFCL_PYTHON [setup_bfcl.sh's], VLLM [vllm],
# BFCL_TIMEOUT_S [21600 per bfcl step], PYTHON [python3], DRY_RUN [0].
set -xeuo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
PYTHON=${PYTHON:-python3}
DRY_RUN=${DRY_RUN:-0}
CKPT=${CKPT:?set CKPT to a verl checkpoint (…/global_step_N/actor), a Hugging Face model directory or hub id}
OUT_DIR=${OUT_DIR:-$HOME/eval/bfcl/$(basename "$(dirname "$CKPT")")_$(basename "$CKPT")}
BFCL_MODEL=${BFCL_MODEL:-Qwen/Qwen3-8B-FC}
CATEGORIES=${CATEGORIES:-multi_turn}
CASES=${CASES:-0}
TEMPERATURE=${TEMPERATURE:-0.001}
THREADS=${THREADS:-8}
POLICY_TP=${POLICY_TP:-1}
POLICY_GPUS=${POLICY_GPUS:-0}
POLICY_PORT=${POLICY_PORT:-8200}
MAX_MODEL_LEN=${MAX_MODEL_LEN:-32768}
VLLM=${VLLM:-vllm}
BFCL_TIMEOUT_S=${BFCL_TIMEOUT_S:-21600}
case "$DRY_RUN" in 0 | 1) ;; *) echo "DRY_RUN must be 0 or 1" >&2 && exit 2 ;; esac
case "$CASES" in '' | *[!0-9]*) echo "CASES must be a non-negative integer, got '$CASES'" >&2 && exit 2 ;; esac
for knob in THREADS POLICY_TP BFCL_TIMEOUT_S; do
    case "${!knob}" in '' | *[!0-9]* | 0) echo "$knob must be a positive integer, got '${!knob}'" >&2 && exit 2 ;; esac
done

# (1) checkpoint -> Hugging Face model
HF_MODEL=$CKPT
if [[ -d "$CKPT" ]] && compgen -G "$CKPT/model_world_size_*_rank_*.pt" >/dev/null; then
    HF_MODEL=$OUT_DIR/hf_model
    MERGE=("$PYTHON" -m verl.model_merger merge --backend fsdp --local_dir "$CKPT" --target_dir "$HF_MODEL")
    if [[ "$DRY_RUN" == 1 ]]; then
        echo "would run: ${MERGE[*]}"
    elif [[ ! -f "$HF_MODEL/config.json" ]]; then
        "${MERGE[@]}"
    fi
fi

# (2) serve it under its own path as the model name (unless POLICY_BASE_URL points at a server already)
if [[ -z "${POLICY_BASE_URL:-}" ]]; then
    POLICY_BASE_URL=http://127.0.0.1:$POLICY_PORT/v1
    SERVE=("$VLLM" serve "$HF_MODEL" --port "$POLICY_PORT" --tensor-parallel-size "$POLICY_TP"
        --max-model-len "$MAX_MODEL_LEN")
    if [[ "$DRY_RUN" == 1 ]]; then
        echo "would run: CUDA_VISIBLE_DEVICES=$POLICY_GPUS ${SERVE[*]}"
    else
        mkdir -p "$OUT_DIR"
        CUDA_VISIBLE_DEVICES=$POLICY_GPUS "${SERVE[@]}" >"$OUT_DIR/vllm_policy.log" 2>&1 &
        SERVER_PID=$!
        trap 'kill "$SERVER_PID" 2>/dev/null || true' EXIT
        for _ in $(seq 1 180); do
            curl -sf --noproxy '*' --max-time 5 "$POLICY_BASE_URL/models" >/dev/null && break
            kill -0 "$SERVER_PID" 2>/dev/null || { echo "vllm exited; see $OUT_DIR/vllm_policy.log" >&2; exit 1; }
            sleep 10
        done
    fi
fi

# (3)-(4) bfcl-eval's generate and evaluate in its own venv, then the summary
PLAN=(recipes/eval/bfcl_eval.py --model-path "$HF_MODEL" --base-url "$POLICY_BASE_URL"
    --registry-model "$BFCL_MODEL" --project-root "$OUT_DIR/bfcl_root" --categories "$CATEGORIES" --cases "$CASES"
    --temperature "$TEMPERATURE" --threads "$THREADS")
cd "$REPO"
if [[ "$DRY_RUN" == 1 ]]; then
    "$PYTHON" "${PLAN[0]}" commands --bfcl "${BFCL_PYTHON:-python} -m bfcl_eval" "${PLAN[@]:1}" "$@"
else
    BFCL_PYTHON=${BFCL_PYTHON:-$(bash "$REPO/recipes/eval/setup_bfcl.sh" | tail -n 1)}
    "$BFCL_PYTHON" "${PLAN[0]}" run "${PLAN[@]:1}" --out "$OUT_DIR/summary.json" --timeout "$BFCL_TIMEOUT_S" \
        --log "$OUT_DIR/bfcl.log" "$@"
fi
