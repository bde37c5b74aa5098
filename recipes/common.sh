#!/usr/bin/env bash
# Shared part of the training recipes (sourced by recipes/{grpo,iapo,ablations,call_credit}/*.sh; not run directly).
#
# The paper's setup (docs/design.md section 7): verl GRPO with FSDP, vLLM rollout, N=16 rollouts per task, at most 30
# assistant turns, Qwen3 thinking off, tau2-bench train split (airline 30 + retail 74 + telecom 74 = 178 tasks),
# 8 GPUs per node. Validation runs on a split carved out of train (scripts/prepare_tau2.py: 25 tasks, seed 0, so
# training runs on the other 153), never on tau2's test split: that one is only for recipes/eval/tau2_eval.sh.
# The simulated user is tau2's user simulator behind an OpenAI-compatible endpoint of its own (the IAPO annotator
# has its own too; scripts/serve_annotator.sh serves Qwen3-32B, REPLICAS x TP GPUs; docs/cluster.md has the
# layouts). The user's server needs tool calling, because telecom users have tools:
#   PORT=8100 bash scripts/serve_annotator.sh --enable-auto-tool-choice --tool-call-parser hermes
#
# Knobs (environment variables; every recipe passes "$@" last, so any Hydra override wins):
#   DATA_DIR            prepared data (python scripts/prepare_tau2.py --out $DATA_DIR)      [~/data/tau2]
#   VAL_FILES           data.val_files: the validation split carved out of train             [$DATA_DIR/val.parquet]
#   NNODES / GPUS_PER_NODE  training nodes (Ray) and GPUs per node; NNODES > 1 needs CKPT_DIR  [1 / 8]
#   ROLLOUT_N           rollouts per task (group size N)                                      [16]
#   MAX_TURNS           assistant turns per episode (also simulated-user replies)             [30]
#   MAX_PROMPT_LENGTH / MAX_RESPONSE_LENGTH  tokens (system prompt + tools; whole episode)   [10240 / 22528]
#   MAX_TOOL_RESPONSE_CHARS  verl truncates longer tool results (its default, 256, would cut tau2's)  [8192]
#   MAX_PARALLEL_CALLS  tool calls of one assistant turn that are executed (verl's default, 1, runs only the
#                       first call of a turn and drops the rest)                              [16]
#   ROLLOUT_GPU_MEM     vLLM gpu_memory_utilization of the rollout, sized for 512 live sessions (32 tasks x 16)
#                       on 80 GB GPUs: what the FSDP actor's shard that stays on each GPU during the rollout
#                       leaves (8B: ~14 GB on one node, ~7 GB on two), the rest to the KV cache (docs/cluster.md
#                       has the arithmetic)                                   [0.7 on one node | 0.8 on more]
#   TRAIN_BATCH_SIZE    tasks per step; PPO_MINI_BATCH_SIZE tasks per update, at most TRAIN_BATCH_SIZE
#                       (verl refuses a larger one, but only once the workers start)          [32 / 16]
#   LR, TOTAL_EPOCHS, SAVE_FREQ, TEST_FREQ                                                    [1e-6, 15, 20, 10]
#   MAX_CKPT_TO_KEEP    checkpoints kept (trainer.max_actor_ckpt_to_keep / max_critic_ckpt_to_keep; an 8B
#                       actor checkpoint with optimizer state is ~100 GB); 0 keeps all        [2]
#   DYNAMIC_SAMPLING    1: verl's group filtering (DAPO dynamic sampling): groups whose N rollouts all scored
#                       the same (no GRPO signal) are dropped and replaced by fresh prompts before the update
#                       (algorithm.filter_groups, metric env_reward); 0: every group trains, zero-variance ones
#                       with advantage 0 (credit/zero_adv_groups), as in the IAPO paper's setting  [0]
#   ANNOTATOR_BASE_URL  annotator endpoint(s), comma-separated (…/v1); spread over all      [http://127.0.0.1:8000/v1]
#   ANNOTATOR_MODEL     served annotator model                                                [Qwen/Qwen3-32B]
#   USER_BASE_URL / USER_MODEL  simulated-user endpoint(s), comma-separated, and model: its own server, not
#                       the annotator's                                       [http://127.0.0.1:8100/v1 / Qwen/Qwen3-32B]
#                       (127.0.0.1 URLs work on one node only: with NNODES > 1 the trainer refuses a loopback
#                       URL and probes every endpoint from every node before any worker starts)
#   USER_TIMEOUT / USER_MAX_RETRIES  the simulated user's client: seconds per request and retries of a failed
#                       one; a hung user fails its session after USER_TIMEOUT x (USER_MAX_RETRIES + 1) s plus the
#                       waits between tries, which must stay below credit.session.deadline (900 s) for a dead user to
#                       be reported as one (tau2's own client: 300 s x 5 attempts)                    [120 / 2]
#   PROJECT_NAME, EXPERIMENT_NAME  verl's names of the run                                    [see below]
#   CKPT_DIR            checkpoints (trainer.default_local_dir) [~/ckpt/$PROJECT_NAME/$EXPERIMENT_NAME]; with
#                       NNODES > 1 it must be set, to a folder every node mounts (every node writes its shards
#                       there and a resume reads them back; the trainer checks that every node sees it)
#   CACHE_DIR           folder of the annotation cache (sqlite, WAL mode): node-local disk, never a network
#                       filesystem shared by nodes (python -m verl_credit.main refuses one when NNODES > 1
#                       unless the path contains {hostname})   [${TMPDIR:-/tmp}/verl_credit/$PROJECT_NAME/$EXPERIMENT_NAME]
#   LOGGER              verl trainer.logger; wandb is opt-in: LOGGER='["console","wandb"]' with WANDB_API_KEY,
#                       `wandb login` or WANDB_MODE=offline (checked before Ray starts)       [["console"]]
#   ENDPOINT_USE_PROXY  1: the endpoint checks (curl) honour HTTP(S)_PROXY; 0: they go direct  [0]
#   SEED                one seed for the run: data shuffling (data.seed), vLLM sampling
#                       (actor_rollout_ref.rollout.seed), the actor's mini-batch shuffling
#                       (actor.data_loader_seed) and the actor's and reference's FSDP init (*.fsdp_config.seed); the paper's tables average three (recipes/paper/run_all.sh)  [42]
#   DRY_RUN=1           print the composed config (Hydra --cfg job --resolve) and stop before Ray starts
#   PYTHON              interpreter                                                           [python3]
# TRAIN_BATCH_SIZE, LR and TOTAL_EPOCHS are not given in docs/design.md section 7; the defaults are ours.

PYTHON=${PYTHON:-python3}
DRY_RUN=${DRY_RUN:-0}
DATA_DIR=${DATA_DIR:-$HOME/data/tau2}
NNODES=${NNODES:-1}
GPUS_PER_NODE=${GPUS_PER_NODE:-8}
ROLLOUT_N=${ROLLOUT_N:-16}
MAX_TURNS=${MAX_TURNS:-30}
MAX_PROMPT_LENGTH=${MAX_PROMPT_LENGTH:-10240}
MAX_RESPONSE_LENGTH=${MAX_RESPONSE_LENGTH:-22528}
MAX_TOOL_RESPONSE_CHARS=${MAX_TOOL_RESPONSE_CHARS:-8192}
TRAIN_BATCH_SIZE=${TRAIN_BATCH_SIZE:-32}
PPO_MINI_BATCH_SIZE=${PPO_MINI_BATCH_SIZE:-16}
LR=${LR:-1e-6}
TOTAL_EPOCHS=${TOTAL_EPOCHS:-15}
SAVE_FREQ=${SAVE_FREQ:-20}
TEST_FREQ=${TEST_FREQ:-10}
if [[ -z "${ROLLOUT_GPU_MEM:-}" ]]; then
    # more than one node: the FSDP shard that stays on each GPU during the rollout is smaller (docs/cluster.md)
    if [[ "$NNODES" =~ ^[0-9]+$ ]] && ((NNODES > 1)); then ROLLOUT_GPU_MEM=0.8; else ROLLOUT_GPU_MEM=0.7; fi
fi
ANNOTATOR_BASE_URL=${ANNOTATOR_BASE_URL:-http://127.0.0.1:8000/v1}
ANNOTATOR_MODEL=${ANNOTATOR_MODEL:-Qwen/Qwen3-32B}
USER_BASE_URL=${USER_BASE_URL:-http://127.0.0.1:8100/v1}
USER_MODEL=${USER_MODEL:-Qwen/Qwen3-32B}
USER_TIMEOUT=${USER_TIMEOUT:-120}
USER_MAX_RETRIES=${USER_MAX_RETRIES:-2}
VAL_FILES=${VAL_FILES:-$DATA_DIR/val.parquet}
MAX_CKPT_TO_KEEP=${MAX_CKPT_TO_KEEP:-2}
DYNAMIC_SAMPLING=${DYNAMIC_SAMPLING:-0}
PROJECT_NAME=${PROJECT_NAME:-verl_credit_tau2}
LOGGER=${LOGGER:-'["console"]'}
MAX_PARALLEL_CALLS=${MAX_PARALLEL_CALLS:-16}
ENDPOINT_USE_PROXY=${ENDPOINT_USE_PROXY:-0}
SEED=${SEED:-42}

case "$DRY_RUN" in 0 | 1) ;; *) echo "DRY_RUN must be 0 or 1, got '$DRY_RUN'" >&2 && exit 2 ;; esac
case "$ENDPOINT_USE_PROXY" in 0 | 1) ;; *) echo "ENDPOINT_USE_PROXY must be 0 or 1, got '$ENDPOINT_USE_PROXY'" >&2 && exit 2 ;; esac
case "$SEED" in '' | *[!0-9]*) echo "SEED must be a non-negative integer, got '$SEED'" >&2 && exit 2 ;; esac
case "$DYNAMIC_SAMPLING" in 0 | 1) ;; *) echo "DYNAMIC_SAMPLING must be 0 or 1, got '$DYNAMIC_SAMPLING'" >&2 && exit 2 ;; esac
case "$MAX_CKPT_TO_KEEP" in '' | *[!0-9]*) echo "MAX_CKPT_TO_KEEP must be a non-negative integer, got '$MAX_CKPT_TO_KEEP'" >&2 && exit 2 ;; esac
case "$USER_MAX_RETRIES" in '' | *[!0-9]*) echo "USER_MAX_RETRIES must be a non-negative integer, got '$USER_MAX_RETRIES'" >&2 && exit 2 ;; esac
for knob in NNODES GPUS_PER_NODE ROLLOUT_N MAX_TURNS MAX_PROMPT_LENGTH MAX_RESPONSE_LENGTH TRAIN_BATCH_SIZE \
    PPO_MINI_BATCH_SIZE TOTAL_EPOCHS MAX_PARALLEL_CALLS USER_TIMEOUT; do
    case "${!knob}" in '' | *[!0-9]* | 0) echo "$knob must be a positive integer, got '${!knob}'" >&2 && exit 2 ;; esac
done
if ((PPO_MINI_BATCH_SIZE > TRAIN_BATCH_SIZE)); then
    echo "PPO_MINI_BATCH_SIZE=$PPO_MINI_BATCH_SIZE is more than TRAIN_BATCH_SIZE=$TRAIN_BATCH_SIZE (tasks per update" \
        "and per step): set PPO_MINI_BATCH_SIZE too, e.g. to half of TRAIN_BATCH_SIZE" >&2
    exit 2
fi

# "a,b" -> ["a","b"] (a Hydra list of quoted strings: URLs contain ':' and '/')
hydra_list() {
    local IFS=, item out=""
    for item in $1; do out+="${out:+,}\"${item}\""; done
    printf '[%s]' "$out"
}

# Model, actor, rollout and trainer sections shared by every recipe. Needs MODEL_PATH, ROLLOUT_TP and
# EXPERIMENT_NAME set by the recipe. CKPT_DIR is often on NFS; CACHE_DIR (the annotation cache) stays on
# node-local disk, because sqlite's WAL mode cannot be shared across hosts.
common_sections() {
    if ((NNODES > 1)) && [[ -z "${CKPT_DIR:-}" ]]; then
        echo "NNODES=$NNODES: set CKPT_DIR to a folder on storage every node mounts (every node writes its" \
            "checkpoint shards there and a resume reads them back; docs/cluster.md)" >&2
        exit 2
    fi
    CKPT_DIR=${CKPT_DIR:-$HOME/ckpt/$PROJECT_NAME/$EXPERIMENT_NAME}
    local keep=$MAX_CKPT_TO_KEEP
    [[ "$keep" == 0 ]] && keep=null
    CACHE_DIR=${CACHE_DIR:-${TMPDIR:-/tmp}/verl_credit/$PROJECT_NAME/$EXPERIMENT_NAME}
    CACHE_DIR=${CACHE_DIR%/}
    MODEL=(
        actor_rollout_ref.model.path="$MODEL_PATH"
        actor_rollout_ref.model.use_remove_padding=True
        actor_rollout_ref.model.enable_gradient_checkpointing=True
    )
    ACTOR=(
        actor_rollout_ref.actor.strategy=fsdp
        actor_rollout_ref.actor.optim.lr="$LR"
        actor_rollout_ref.actor.ppo_mini_batch_size="$PPO_MINI_BATCH_SIZE"
        actor_rollout_ref.actor.use_dynamic_bsz=True
        actor_rollout_ref.actor.ppo_max_token_len_per_gpu=$((MAX_PROMPT_LENGTH + MAX_RESPONSE_LENGTH))
        actor_rollout_ref.actor.use_kl_loss=True
        actor_rollout_ref.actor.kl_loss_coef=0.001
        actor_rollout_ref.actor.kl_loss_type=low_var_kl
        actor_rollout_ref.actor.entropy_coeff=0
        actor_rollout_ref.ref.strategy=fsdp
        actor_rollout_ref.ref.log_prob_use_dynamic_bsz=True
        actor_rollout_ref.ref.log_prob_max_token_len_per_gpu=$((MAX_PROMPT_LENGTH + MAX_RESPONSE_LENGTH))
        actor_rollout_ref.actor.fsdp_config.seed="$SEED"
        actor_rollout_ref.actor.data_loader_seed="$SEED"
        actor_rollout_ref.ref.fsdp_config.seed="$SEED"
    )
    ROLLOUT=(
        actor_rollout_ref.rollout.name=vllm
        actor_rollout_ref.rollout.mode=async
        actor_rollout_ref.rollout.n="$ROLLOUT_N"
        actor_rollout_ref.rollout.seed="$SEED"
        actor_rollout_ref.rollout.tensor_model_parallel_size="$ROLLOUT_TP"
        actor_rollout_ref.rollout.gpu_memory_utilization="$ROLLOUT_GPU_MEM"
        actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=True
        actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=$((MAX_PROMPT_LENGTH + MAX_RESPONSE_LENGTH))
        actor_rollout_ref.rollout.multi_turn.enable=True
        actor_rollout_ref.rollout.multi_turn.format=hermes
        actor_rollout_ref.rollout.multi_turn.max_assistant_turns="$MAX_TURNS"
        actor_rollout_ref.rollout.multi_turn.max_user_turns="$MAX_TURNS"
        actor_rollout_ref.rollout.multi_turn.max_tool_response_length="$MAX_TOOL_RESPONSE_CHARS"
        actor_rollout_ref.rollout.multi_turn.max_parallel_calls="$MAX_PARALLEL_CALLS"
        actor_rollout_ref.rollout.agent.default_agent_loop=credit_agent
        actor_rollout_ref.rollout.val_kwargs.n=1
    )
    TRAINER=(
        trainer.nnodes="$NNODES"
        trainer.n_gpus_per_node="$GPUS_PER_NODE"
        trainer.logger="$LOGGER"
        trainer.project_name="$PROJECT_NAME"
        trainer.experiment_name="$EXPERIMENT_NAME"
        trainer.default_local_dir="$CKPT_DIR"
        trainer.total_epochs="$TOTAL_EPOCHS"
        trainer.save_freq="$SAVE_FREQ"
        trainer.max_actor_ckpt_to_keep="$keep"
        trainer.max_critic_ckpt_to_keep="$keep"
        trainer.test_freq="$TEST_FREQ"
        trainer.val_before_train=True
    )
    # verl's group filtering: zero-variance groups are replaced before the update (DYNAMIC_SAMPLING=1)
    FILTER_GROUPS=(algorithm.filter_groups.enable=False)
    if [[ "$DYNAMIC_SAMPLING" == 1 ]]; then
        FILTER_GROUPS=(
            algorithm.filter_groups.enable=True
            algorithm.filter_groups.metric=env_reward
            algorithm.filter_groups.max_inflight_gen_batches=2
        )
    fi
    TRAINER+=("${FILTER_GROUPS[@]}")
}

# data.* overrides shared by every recipe (train parquet in $DATA_DIR, validation VAL_FILES, thinking off);
# extra data.* overrides may be passed as arguments.
data_section() {
    DATA=(
        data.train_files="$DATA_DIR/train.parquet"
        data.val_files="$VAL_FILES"
        data.train_batch_size="$TRAIN_BATCH_SIZE"
        data.seed="$SEED"
        data.max_prompt_length="$MAX_PROMPT_LENGTH"
        data.max_response_length="$MAX_RESPONSE_LENGTH"
        data.truncation=error
        data.return_raw_chat=True
        +data.apply_chat_template_kwargs.enable_thinking=False
        "$@"
    )
}

# data + environment (tau2 with its simulated user) on top of common_sections.
tau2_sections() {
    common_sections
    data_section data.filter_overlong_prompts=True
    ENVIRONMENT=(
        credit.env.name=tau2
        "+credit.env.options.user.base_urls=$(hydra_list "$USER_BASE_URL")"
        "+credit.env.options.user.model=$USER_MODEL"
        +credit.env.options.user.timeout_s="$USER_TIMEOUT"
        +credit.env.options.user.max_retries="$USER_MAX_RETRIES"
        credit.user.name=env
        credit.user.max_turns="$MAX_TURNS"
    )
    require_data "python scripts/prepare_tau2.py --out $DATA_DIR"
}

# The prepared parquet files (train, validation) must exist before a real run; $1 says how to make them.
require_data() {
    [[ "$DRY_RUN" == 1 ]] && return 0
    local file
    for file in "$DATA_DIR/train.parquet" "$VAL_FILES"; do
        if [[ ! -f "$file" ]]; then
            echo "missing $file: run $1" >&2
            exit 2
        fi
    done
}

# The annotation cache file under CACHE_DIR, as a quoted Hydra value (a {hostname} part needs the quotes).
cache_path_override() {
    printf "credit.annotator.cache_path='%s/graphs.sqlite'" "$CACHE_DIR"
}

# Fail early (before Ray) when an endpoint the run needs does not answer. The check goes direct
# (curl --noproxy '*': a cluster's HTTP(S)_PROXY usually cannot reach in-cluster servers, and the run's own
# HTTP clients, the LLM annotator and the simulated users, ignore proxy variables by default too);
# ENDPOINT_USE_PROXY=1 lets curl honour them (the tau2 user then needs +credit.env.options.user.trust_env=true).
require_endpoint() {
    local what=$1 urls=$2 url
    [[ "$DRY_RUN" == 1 ]] && return 0
    local proxy=(--noproxy '*')
    [[ "$ENDPOINT_USE_PROXY" == 1 ]] && proxy=()
    local IFS=,
    for url in $urls; do
        if ! curl -sf "${proxy[@]+"${proxy[@]}"}" --max-time 10 "${url%/}/models" >/dev/null; then
            echo "$what endpoint $url does not answer (start it with scripts/serve_annotator.sh, or set the URL)" >&2
            exit 2
        fi
    done
}

# python -m verl_credit.main <overrides...>; DRY_RUN=1 prints the composed config and exits before Ray starts.
launch_credit_trainer() {
    if [[ "$DRY_RUN" == 1 ]]; then
        "$PYTHON" -m verl_credit.main "$@" --cfg job --resolve
    else
        "$PYTHON" -m verl_credit.main "$@"
    fi
}
