#!/usr/bin/env bash
# Evaluate a checkpoint on tau2-bench's held-out test split (airline 20 + retail 40 + telecom 40 tasks), 4 trials
# per task, max 30 assistant turns, thinking off; prints pass^1..pass^4 per domain and the domain-macro mean as
# tau2 defines them (pass^k = C(successes, k) / C(trials, k), averaged over tasks; verl_credit/envs/tau2/evaluate.py).
# Expected domain-macro pass^1 (docs/design.md section 7): Qwen3-8B GRPO 29.61 (airline 22.78, retail 44.31, telecom
# 21.74), IAPO 42.18 (airline 29.72, retail 56.88, telecom 39.93); Qwen3-4B GRPO 34.79, IAPO 38.40.
#
# Steps: (1) a verl FSDP checkpoint (…/global_step_N/actor) is merged to a Hugging Face model with
# `python -m verl.model_merger merge --backend fsdp`; a Hugging Face directory or hub id is used as is;
# (2) the policy is served with `vllm serve … --enable-auto-tool-choice --tool-call-parser hermes` on POLICY_GPUS
# (skip both by setting POLICY_BASE_URL to an already served policy); (3) every test task is played TRIALS times
# against tau2's simulated user and scored by tau2's evaluator. Finished trials are kept in $OUT_DIR/results.jsonl,
# so a rerun resumes.
# The simulated user is a held-out one (USER_BASE_URL / USER_MODEL: any OpenAI-compatible server, e.g.
# MODEL=<hf id> PORT=8002 bash scripts/serve_annotator.sh --enable-auto-tool-choice --tool-call-parser hermes):
# a policy trained against one user model learns its habits, so scoring it against the same user flatters it.
# The training user (TRAIN_USER_BASE_URL / TRAIN_USER_MODEL, the training recipes' USER_BASE_URL / USER_MODEL) is
# refused as the evaluation user unless SAME_USER=1: USER_MODEL has no default and must name another model than
# TRAIN_USER_MODEL, and USER_BASE_URL another server; both users are recorded in every result line and the
# metrics JSON.
#
#   CKPT=~/ckpt/verl_credit_tau2/iapo_qwen3_8b_tau2/global_step_150/actor USER_BASE_URL=http://<server>:8002/v1 \
#       USER_MODEL=<held-out user> bash recipes/eval/tau2_eval.sh [extra evaluate.py flags, e.g. --save-messages]
#   DRY_RUN=1 CKPT=Qwen/Qwen3-8B USER_MODEL=<held-out user> bash recipes/eval/tau2_eval.sh   # the plan, no GPU
# Knobs: CKPT, OUT_DIR, TRIALS [4], MAX_TURNS [30], SPLIT [test], DOMAINS, TEMPERATURE [0.0: tau2's default],
# POLICY_TP [1], POLICY_GPUS [0], POLICY_PORT [8200], POLICY_BASE_URL, USER_BASE_URL [http://127.0.0.1:8002/v1],
# USER_MODEL [none: required, the held-out user's model; with SAME_USER=1, TRAIN_USER_MODEL],
# TRAIN_USER_BASE_URL [http://127.0.0.1:8100/v1, the training recipes' default], TRAIN_USER_MODEL [Qwen/Qwen3-32B],
# SAME_USER [0: refuse the training user's URL or model as the evaluation user's; 1: allow them],
# POLICY_MODEL_NAME [policy] (with POLICY_BASE_URL), CONCURRENCY [32], MAX_MODEL_LEN [32768], PYTHON [python3], DRY_RUN [0],
# MAX_PARALLEL_CALLS [16: tool calls executed per assistant turn, as the training recipes' verl
# multi_turn.max_parallel_calls], ENDPOINT_USE_PROXY [0: the recipe's curl checks and the runner's HTTP clients go
# direct (curl --noproxy '*'); 1: both honour HTTP(S)_PROXY / NO_PROXY (the runner's --trust-env)].
set -xeuo pipefail

PYTHON=${PYTHON:-python3}
DRY_RUN=${DRY_RUN:-0}
CKPT=${CKPT:?set CKPT to a verl checkpoint (…/global_step_N/actor), a Hugging Face model directory or hub id}
OUT_DIR=${OUT_DIR:-$HOME/eval/tau2/$(basename "$(dirname "$CKPT")")_$(basename "$CKPT")}
TRIALS=${TRIALS:-4}
MAX_PARALLEL_CALLS=${MAX_PARALLEL_CALLS:-16}
MAX_TURNS=${MAX_TURNS:-30}
SPLIT=${SPLIT:-test}
DOMAINS=${DOMAINS:-airline,retail,telecom}
TEMPERATURE=${TEMPERATURE:-0.0}
CONCURRENCY=${CONCURRENCY:-32}
POLICY_TP=${POLICY_TP:-1}
POLICY_GPUS=${POLICY_GPUS:-0}
POLICY_PORT=${POLICY_PORT:-8200}
MAX_MODEL_LEN=${MAX_MODEL_LEN:-32768}
USER_BASE_URL=${USER_BASE_URL:-http://127.0.0.1:8002/v1}
USER_MODEL=${USER_MODEL:-}
TRAIN_USER_BASE_URL=${TRAIN_USER_BASE_URL:-http://127.0.0.1:8100/v1}
TRAIN_USER_MODEL=${TRAIN_USER_MODEL:-Qwen/Qwen3-32B}
SAME_USER=${SAME_USER:-0}
ENDPOINT_USE_PROXY=${ENDPOINT_USE_PROXY:-0}
case "$DRY_RUN" in 0 | 1) ;; *) echo "DRY_RUN must be 0 or 1" >&2 && exit 2 ;; esac
case "$ENDPOINT_USE_PROXY" in 0 | 1) ;; *) echo "ENDPOINT_USE_PROXY must be 0 or 1" >&2 && exit 2 ;; esac
case "$SAME_USER" in 0 | 1) ;; *) echo "SAME_USER must be 0 or 1" >&2 && exit 2 ;; esac
CURL=(curl -sf --noproxy '*')
TRUST_ENV=()
if [[ "$ENDPOINT_USE_PROXY" == 1 ]]; then
    CURL=(curl -sf)
    TRUST_ENV=(--trust-env)
fi
for knob in TRIALS MAX_TURNS CONCURRENCY POLICY_TP MAX_PARALLEL_CALLS; do
    case "${!knob}" in '' | *[!0-9]* | 0) echo "$knob must be a positive integer, got '${!knob}'" >&2 && exit 2 ;; esac
done
# A held-out user model, unless SAME_USER=1: a policy trained against one user model learns its habits.
if [[ -z "$USER_MODEL" && "$SAME_USER" == 1 ]]; then
    USER_MODEL=$TRAIN_USER_MODEL
elif [[ -z "$USER_MODEL" ]]; then
    echo "set USER_MODEL to the held-out evaluation user's model (served at USER_BASE_URL=$USER_BASE_URL), not the" \
        "training user's ($TRAIN_USER_MODEL); SAME_USER=1 evaluates against the training user's model on purpose" >&2
    exit 2
elif [[ "${USER_MODEL,,}" == "${TRAIN_USER_MODEL,,}" && "$SAME_USER" != 1 ]]; then
    echo "USER_MODEL=$USER_MODEL is the training user's model (TRAIN_USER_MODEL): evaluate against a held-out user" \
        "model, or set SAME_USER=1 to measure against the training user on purpose" >&2
    exit 2
fi

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

# (2) serve the policy (unless POLICY_BASE_URL points at one already)
POLICY_MODEL=policy
if [[ -z "${POLICY_BASE_URL:-}" ]]; then
    POLICY_BASE_URL=http://127.0.0.1:$POLICY_PORT/v1
    SERVE=(vllm serve "$HF_MODEL" --served-model-name "$POLICY_MODEL" --port "$POLICY_PORT"
        --tensor-parallel-size "$POLICY_TP" --max-model-len "$MAX_MODEL_LEN"
        --enable-auto-tool-choice --tool-call-parser hermes)
    if [[ "$DRY_RUN" == 1 ]]; then
        echo "would run: CUDA_VISIBLE_DEVICES=$POLICY_GPUS ${SERVE[*]}"
    else
        mkdir -p "$OUT_DIR"
        CUDA_VISIBLE_DEVICES=$POLICY_GPUS "${SERVE[@]}" >"$OUT_DIR/vllm_policy.log" 2>&1 &
        SERVER_PID=$!
        trap 'kill "$SERVER_PID" 2>/dev/null || true' EXIT
        for _ in $(seq 1 180); do
            "${CURL[@]}" --max-time 5 "$POLICY_BASE_URL/models" >/dev/null && break
            kill -0 "$SERVER_PID" 2>/dev/null || { echo "vllm exited; see $OUT_DIR/vllm_policy.log" >&2; exit 1; }
            sleep 10
        done
        "${CURL[@]}" --max-time 5 "$POLICY_BASE_URL/models" >/dev/null || { echo "policy server not up after 30 min" >&2; exit 1; }
    fi
else
    POLICY_MODEL=${POLICY_MODEL_NAME:-policy}
fi

# (3) play and score
USER_URLS=()
IFS=, read -r -a user_urls <<<"$USER_BASE_URL"
for url in "${user_urls[@]}"; do USER_URLS+=(--user-base-url "$url"); done
IFS=, read -r -a train_urls <<<"$TRAIN_USER_BASE_URL"
for url in "${train_urls[@]}"; do USER_URLS+=(--training-user-base-url "$url"); done
USER_URLS+=(--training-user-model "$TRAIN_USER_MODEL")
if [[ "$SAME_USER" == 1 ]]; then USER_URLS+=(--same-user); fi
EVALUATE=(
    "$PYTHON" -m verl_credit.envs.tau2.evaluate run
    --policy-base-url "$POLICY_BASE_URL" --policy-model "$POLICY_MODEL" --temperature "$TEMPERATURE"
    "${USER_URLS[@]}" --user-model "$USER_MODEL"
    --split "$SPLIT" --domains "$DOMAINS" --trials "$TRIALS" --max-turns "$MAX_TURNS"
    --max-parallel-calls "$MAX_PARALLEL_CALLS" "${TRUST_ENV[@]+"${TRUST_ENV[@]}"}"
    --concurrency "$CONCURRENCY" --out "$OUT_DIR/results.jsonl"
)
if [[ "$DRY_RUN" == 1 ]]; then
    "${EVALUATE[@]}" --dry-run "$@"
else
    "${CURL[@]}" --max-time 10 "${user_urls[0]%/}/models" >/dev/null || { echo "user simulator ${user_urls[0]} does not answer" >&2; exit 2; }
    "${EVALUATE[@]}" "$@"
fi
