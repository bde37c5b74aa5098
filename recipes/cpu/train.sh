#!/usr/bin/env bash
# One real verl fit() on the CPU: `python -m verl_credit.main` with the CPU platform and its overrides.
#
#   VENV=<cpu-train venv> MODEL_PATH=<hf dir> DATA_DIR=<train/val parquet> RUN_DIR=<out> \
#       bash recipes/cpu/train.sh [hydra overrides...]
#
# Bounded and cleaned up: the trainer runs under `timeout` (TIMEOUT_S, default 900) in its own session;
# afterwards every process of that session and every Ray process of this run's own RAY_TMPDIR is
# stopped by PID, and the /dev/shm segments that appeared during the run are removed. Writes
# RUN_DIR/train.log, RUN_DIR/metrics.jsonl (verl's file logger) and RUN_DIR/rc.
# Every knob below is an environment variable; the overrides passed last win (Hydra).
#
# Several Ray nodes: NNODES=N RAY_ADDRESS=<head ip:port> connects to a running cluster of N nodes (each
# started with one logical GPU and at least 6 CPUs: `ray start ... --num-gpus=1 --num-cpus=6`; verl's
# resource pool reserves 3 CPUs with each GPU and TransferQueue's controller and storage actors take 1
# CPU each, on any node, and a pool that does not fit waits forever) instead of starting Ray: trainer.nnodes=N
# with one GPU per node, one agent-loop worker per node (verl places them round-robin), the per-GPU
# micro-batches split by N, and the CPU exports below handed to every worker through the job's
# runtime_env (the cluster's processes were not started from this shell). The cluster is the caller's
# to stop; this script stops only its own trainer session.
set -euo pipefail
: "${VENV:?set VENV (bash recipes/cpu/setup_env.sh prints it)}" "${MODEL_PATH:?}" "${DATA_DIR:?}" "${RUN_DIR:?}"
TIMEOUT_S=${TIMEOUT_S:-900}
ESTIMATOR=${ESTIMATOR:-iapo}
STEPS=${STEPS:-2}
BATCH=${BATCH:-2}
ROLLOUT_N=${ROLLOUT_N:-4}
MAX_TURNS=${MAX_TURNS:-8}
MAX_PROMPT_LENGTH=${MAX_PROMPT_LENGTH:-1024}
MAX_RESPONSE_LENGTH=${MAX_RESPONSE_LENGTH:-1024}
# verl truncates longer tool results; its default (256 characters) cut the service world's user record
# in the middle, hiding the gift card the customer asks for
MAX_TOOL_RESPONSE_CHARS=${MAX_TOOL_RESPONSE_CHARS:-8192}
LR=${LR:-3e-4}
# Micro-batches by token count (verl's dynamic batch size) for the actor update and the log-prob
# passes: without remove-padding (no flash-attn on a CPU) one response that runs to the length cap
# pads all rows of a fixed micro-batch to it (measured: update_actor 6 s -> 25 s a step). verl's
# engine sums micro-batch losses scaled by the mini-batch's token count, so the gradient is the
# same. Default: the longest possible sequence; 0: fixed micro-batches of PER_GPU rows.
MICRO_BATCH_TOKENS=${MICRO_BATCH_TOKENS:-$((MAX_PROMPT_LENGTH + MAX_RESPONSE_LENGTH))}
NNODES=${NNODES:-1}
RAY_ADDRESS=${RAY_ADDRESS:-}
case "$NNODES" in '' | *[!0-9]* | 0) echo "train.sh: NNODES must be a positive integer, got '$NNODES'" >&2 && exit 2 ;; esac
case "$MICRO_BATCH_TOKENS" in '' | *[!0-9]*) echo "train.sh: MICRO_BATCH_TOKENS must be 0 or a token count, got '$MICRO_BATCH_TOKENS'" >&2 && exit 2 ;; esac
if ((MICRO_BATCH_TOKENS > 0 && MICRO_BATCH_TOKENS < MAX_PROMPT_LENGTH + MAX_RESPONSE_LENGTH)); then
    echo "train.sh: MICRO_BATCH_TOKENS ($MICRO_BATCH_TOKENS) must hold the longest sequence ($((MAX_PROMPT_LENGTH + MAX_RESPONSE_LENGTH)) tokens)" >&2
    exit 2
fi
if ((NNODES > 1)) && [[ -z "$RAY_ADDRESS" ]]; then
    echo "train.sh: NNODES=$NNODES needs RAY_ADDRESS, the head of a running Ray cluster with $NNODES nodes" >&2
    exit 2
fi
if (((BATCH * ROLLOUT_N) % NNODES)); then
    echo "train.sh: BATCH * ROLLOUT_N ($((BATCH * ROLLOUT_N))) must be a multiple of NNODES ($NNODES)" >&2
    exit 2
fi
# rows per data-parallel rank: every rank takes one micro-batch of its share
PER_GPU=$((BATCH * ROLLOUT_N / NNODES))
mkdir -p "$RUN_DIR"
RUN_DIR=$(cd "$RUN_DIR" && pwd)
# One temp folder for the run, short (Ray's socket paths must stay under 107 bytes): Ray's session,
# and through TMPDIR vLLM's and TransferQueue's ZMQ sockets and verl's checkpoint locks.
RAY_TMP=$(mktemp -d /tmp/vcrun.XXXXXX)

export VERL_PLATFORM=cpu VLLM_TARGET_DEVICE=cpu VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-1}
export VLLM_CPU_OMP_THREADS_BIND=nobind VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 WANDB_MODE=disabled
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export RAY_DEDUP_LOGS=0 RAY_USAGE_STATS_ENABLED=0 RAY_TMPDIR=$RAY_TMP TMPDIR=$RAY_TMP
export VERL_FILE_LOGGER_PATH=$RUN_DIR/metrics.jsonl
if ((MICRO_BATCH_TOKENS > 0)); then
    MICRO_BATCH_ARGS=(
        actor_rollout_ref.actor.use_dynamic_bsz=True
        actor_rollout_ref.actor.ppo_max_token_len_per_gpu="$MICRO_BATCH_TOKENS"
        actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=True
        actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu="$MICRO_BATCH_TOKENS"
    )
else
    MICRO_BATCH_ARGS=()
fi
if [[ -n "$RAY_ADDRESS" ]]; then
    # an existing cluster: connect, and give its workers this run's environment (quoted: strings for Ray)
    RAY_ARGS=(+ray_kwargs.ray_init.address="$RAY_ADDRESS")
    for name in VERL_PLATFORM VLLM_TARGET_DEVICE VLLM_CPU_KVCACHE_SPACE VLLM_CPU_OMP_THREADS_BIND VLLM_NO_USAGE_STATS \
        DO_NOT_TRACK WANDB_MODE HF_HUB_OFFLINE TRANSFORMERS_OFFLINE TOKENIZERS_PARALLELISM TMPDIR VERL_FILE_LOGGER_PATH; do
        RAY_ARGS+=("+ray_kwargs.ray_init.runtime_env.env_vars.$name='${!name}'")
    done
else
    RAY_ARGS=(+ray_kwargs.ray_init.num_gpus=1 ray_kwargs.ray_init.num_cpus=8)
fi

ARGS=(
    algorithm.adv_estimator="$ESTIMATOR"
    algorithm.use_kl_in_reward=False
    data.train_files="$DATA_DIR/train.parquet"
    data.val_files="$DATA_DIR/val.parquet"
    data.train_batch_size="$BATCH"
    data.max_prompt_length="$MAX_PROMPT_LENGTH"
    data.max_response_length="$MAX_RESPONSE_LENGTH"
    data.dataloader_num_workers=0
    actor_rollout_ref.model.path="$MODEL_PATH"
    actor_rollout_ref.model.use_remove_padding=False
    actor_rollout_ref.model.enable_gradient_checkpointing=False
    +actor_rollout_ref.model.override_config.attn_implementation=sdpa
    actor_rollout_ref.actor.strategy=fsdp2
    actor_rollout_ref.actor.optim.lr="$LR"
    actor_rollout_ref.actor.ppo_mini_batch_size="$BATCH"
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu="$PER_GPU"
    actor_rollout_ref.actor.use_kl_loss=False
    actor_rollout_ref.actor.use_torch_compile=False
    actor_rollout_ref.rollout.name=vllm
    actor_rollout_ref.rollout.mode=async
    actor_rollout_ref.rollout.n="$ROLLOUT_N"
    actor_rollout_ref.rollout.tensor_model_parallel_size=1
    actor_rollout_ref.rollout.gpu_memory_utilization=0.5
    actor_rollout_ref.rollout.enforce_eager=True
    actor_rollout_ref.rollout.free_cache_engine=False
    +actor_rollout_ref.rollout.enable_sleep_mode=False
    actor_rollout_ref.rollout.max_num_batched_tokens=$((MAX_PROMPT_LENGTH + MAX_RESPONSE_LENGTH))
    actor_rollout_ref.rollout.max_model_len=$((MAX_PROMPT_LENGTH + MAX_RESPONSE_LENGTH))
    actor_rollout_ref.rollout.max_num_seqs=16
    actor_rollout_ref.rollout.calculate_log_probs=True
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu="$PER_GPU"
    "${MICRO_BATCH_ARGS[@]}"
    actor_rollout_ref.rollout.agent.num_workers="$NNODES"
    actor_rollout_ref.rollout.multi_turn.enable=True
    actor_rollout_ref.rollout.multi_turn.format=hermes
    actor_rollout_ref.rollout.multi_turn.max_assistant_turns="$MAX_TURNS"
    actor_rollout_ref.rollout.multi_turn.max_user_turns="$MAX_TURNS"
    actor_rollout_ref.rollout.multi_turn.max_parallel_calls=16
    actor_rollout_ref.rollout.multi_turn.max_tool_response_length="$MAX_TOOL_RESPONSE_CHARS"
    actor_rollout_ref.rollout.val_kwargs.n=1
    transfer_queue.backend.SimpleStorage.num_data_storage_units=1
    reward.num_workers=1
    trainer.device=cpu
    trainer.nnodes="$NNODES"
    trainer.n_gpus_per_node=1
    "${RAY_ARGS[@]}"
    trainer.total_training_steps="$STEPS"
    trainer.total_epochs=100
    trainer.logger='["console","file"]'
    trainer.project_name=verl_credit_cpu
    trainer.experiment_name="$(basename "$RUN_DIR")"
    trainer.default_local_dir="$RUN_DIR/ckpt"
    credit.env.name=service
    credit.user.max_turns="$MAX_TURNS"
    credit.debug.dump_dir="$RUN_DIR/dumps"
)

shm_before=$(mktemp)
ls -1 /dev/shm 2>/dev/null | sort > "$shm_before" || true
cleanup() {
    local pids
    # the trainer's session, then Ray processes of this run (their command lines name RAY_TMP)
    pids=$( (ps -eo pid=,sid= | awk -v s="${leader:-0}" '$2 == s {print $1}'; pgrep -f "$RAY_TMP" || true) | sort -u)
    if [[ -n "$pids" ]]; then
        kill -TERM $pids 2>/dev/null || true
        sleep 3
        kill -KILL $pids 2>/dev/null || true
    fi
    comm -13 "$shm_before" <(ls -1 /dev/shm 2>/dev/null | sort) | while read -r segment; do
        rm -rf "/dev/shm/$segment"
    done
    rm -rf "$RAY_TMP" "$shm_before"
}
trap cleanup EXIT

cd "$RUN_DIR"
set +e
setsid timeout -k 30 "$TIMEOUT_S" "$VENV/bin/python" -m verl_credit.main "${ARGS[@]}" "$@" > "$RUN_DIR/train.log" 2>&1 < /dev/null &
leader=$!
wait "$leader"
rc=$?
set -e
echo "$rc" > "$RUN_DIR/rc"
echo "train.sh: $(basename "$RUN_DIR") exited $rc after ${SECONDS} s (log: $RUN_DIR/train.log)" >&2
exit "$rc"
