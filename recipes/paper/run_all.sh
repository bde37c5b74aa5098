#!/usr/bin/env bash
# Every run of the IAPO paper's comparison, trained, evaluated and tabulated, resumable run by run.
#
# Reproduces (docs/design.md section 7; the paper's Table 1 at 4B: GRPO 34.79, GiGPO 37.22, InfoPO 37.99, IAPO 38.40):
#   table1  grpo / iapo at Qwen3-8B (29.61 / 42.18) and Qwen3-4B (34.79 / 38.40), gigpo / info_gain at 4B,
#           each over SEEDS (three seeds: mean +- std), evaluated on tau2-bench's held-out test split against a
#           held-out user, and on BFCL-v4 multi-turn (IAPO 39.36 vs GRPO 39.04, Qwen3-8B)
#   table3  the ablations at 8B (beta+ 0 / 0.1 / 0.3: 32.50 / 33.96 / 31.39; c 0.125 / 0.5: 32.92 / 42.29;
#           support / projected negative branch: 41.88 / 41.46), over ABLATION_SEEDS
#   swap    the annotator swap (Gemma4-31B annotator: 40.90), over ABLATION_SEEDS
# Each run: (1) train with its recipe (SEED, EXPERIMENT_NAME and CKPT_DIR of the run; verl resumes an interrupted
# training from CKPT_DIR), (2) recipes/eval/tau2_eval.sh on its last checkpoint (resumes from its results.jsonl),
# (3) table1 runs: recipes/eval/bfcl_eval.sh; a stage that finished leaves a marker and is skipped on a rerun.
# Last, scripts/paper_table.py writes RESULTS_DIR/table.md and table.csv.
#
# GPU-hours per run are ESTIMATES, not measurements (no GPU run of this project has been timed): 8 GPUs x the
# expected training time (Qwen3-8B ~40 h, Qwen3-4B ~25 h for 15 epochs of the 178 train tasks x N=16, up to 30
# turns; info_gain ~30% more: one extra actor pass per feedback turn) plus 4 GPUs of the Qwen3-32B user/annotator
# server for as long; evaluation ~6 GPU-hours (policy + held-out user, 400 tau2 episodes; BFCL-v4 multi-turn).
# LIST=1 prints the runs and the estimated total.
#
#   ANNOTATOR_BASE_URL=http://<server>:8000/v1 EVAL_USER_BASE_URL=http://<server>:8002/v1 \
#       EVAL_USER_MODEL=<held-out user> bash recipes/paper/run_all.sh
#   DRY_RUN=1 bash recipes/paper/run_all.sh       # compose every run (training configs, eval plans); no GPU
#   LIST=1 bash recipes/paper/run_all.sh          # the runs and their estimated GPU-hours
# Knobs: RESULTS_DIR [~/eval/paper]  CKPT_ROOT [~/ckpt/paper]  SEEDS ["1 2 3"]  ABLATION_SEEDS ["1"]
#        ONLY [regex over TABLE/MODEL/ARM/seedN, e.g. 'table1/qwen3_4b']  BFCL [1: table1 runs also on BFCL]
#        TRAIN_USER_BASE_URL / TRAIN_USER_MODEL [the training recipes' USER_BASE_URL / USER_MODEL defaults]
#        EVAL_USER_BASE_URL [http://127.0.0.1:8002/v1] / EVAL_USER_MODEL [none: required, a held-out model other
#        than TRAIN_USER_MODEL; checked before any training starts; DRY_RUN=1 without it plans with a placeholder]
#        DRY_RUN [0]  LIST [0]
#        PYTHON [python3]; everything the training and evaluation recipes read (ANNOTATOR_BASE_URL, DATA_DIR, ...).
set -xeuo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
PYTHON=${PYTHON:-python3}
DRY_RUN=${DRY_RUN:-0}
LIST=${LIST:-0}
RESULTS_DIR=${RESULTS_DIR:-$HOME/eval/paper}
CKPT_ROOT=${CKPT_ROOT:-$HOME/ckpt/paper}
SEEDS=${SEEDS:-1 2 3}
ABLATION_SEEDS=${ABLATION_SEEDS:-1}
ONLY=${ONLY:-}
BFCL=${BFCL:-1}
TRAIN_USER_BASE_URL=${TRAIN_USER_BASE_URL:-${USER_BASE_URL:-http://127.0.0.1:8100/v1}}
TRAIN_USER_MODEL=${TRAIN_USER_MODEL:-${USER_MODEL:-${ANNOTATOR_MODEL:-Qwen/Qwen3-32B}}}
EVAL_USER_BASE_URL=${EVAL_USER_BASE_URL:-http://127.0.0.1:8002/v1}
EVAL_USER_MODEL=${EVAL_USER_MODEL:-}
for knob in DRY_RUN LIST BFCL; do
    case "${!knob}" in 0 | 1) ;; *) echo "$knob must be 0 or 1, got '${!knob}'" >&2 && exit 2 ;; esac
done
# The held-out evaluation user (recipes/eval/tau2_eval.sh refuses the training user's model): checked here, before
# days of training end in a refused evaluation.
if [[ "$LIST" == 0 && -z "$EVAL_USER_MODEL" ]]; then
    if [[ "$DRY_RUN" == 0 ]]; then
        echo "set EVAL_USER_MODEL to the held-out evaluation user's model (served at" \
            "EVAL_USER_BASE_URL=$EVAL_USER_BASE_URL), not the training user's ($TRAIN_USER_MODEL)" >&2
        exit 2
    fi
    EVAL_USER_MODEL='<held-out user: set EVAL_USER_MODEL>'
    echo "EVAL_USER_MODEL is not set: the evaluation plans name a placeholder, a real run refuses to start" >&2
elif [[ "$LIST" == 0 && "${EVAL_USER_MODEL,,}" == "${TRAIN_USER_MODEL,,}" ]]; then
    echo "EVAL_USER_MODEL=$EVAL_USER_MODEL is the training user's model (TRAIN_USER_MODEL): the evaluation needs a" \
        "held-out user model" >&2
    exit 2
fi
for seed in $SEEDS $ABLATION_SEEDS; do
    case "$seed" in '' | *[!0-9]*) echo "SEEDS and ABLATION_SEEDS must be non-negative integers, got '$seed'" >&2 && exit 2 ;; esac
done

# TABLE MODEL ARM RECIPE SEED-SET GPU-HOURS(estimate, per seed) [ENV=VALUE ...]
RUNS=(
    "table1 qwen3_8b grpo grpo/qwen3_8b_tau2.sh SEEDS 486"
    "table1 qwen3_8b iapo iapo/qwen3_8b_tau2.sh SEEDS 486"
    "table1 qwen3_4b grpo grpo/qwen3_4b_tau2.sh SEEDS 306"
    "table1 qwen3_4b iapo iapo/qwen3_4b_tau2.sh SEEDS 306"
    "table1 qwen3_4b gigpo gigpo/qwen3_8b_tau2.sh SEEDS 306 MODEL_PATH=Qwen/Qwen3-4B ROLLOUT_TP=1"
    "table1 qwen3_4b info_gain info_gain/qwen3_4b_tau2.sh SEEDS 396"
    "table3 qwen3_8b beta_plus_0 ablations/beta_plus_0.sh ABLATION_SEEDS 486"
    "table3 qwen3_8b beta_plus_0p1 ablations/beta_plus_0p1.sh ABLATION_SEEDS 486"
    "table3 qwen3_8b beta_plus_0p3 ablations/beta_plus_0p3.sh ABLATION_SEEDS 486"
    "table3 qwen3_8b clip_c_0p125 ablations/clip_c_0p125.sh ABLATION_SEEDS 486"
    "table3 qwen3_8b clip_c_0p5 ablations/clip_c_0p5.sh ABLATION_SEEDS 486"
    "table3 qwen3_8b neg_route_support ablations/neg_route_support.sh ABLATION_SEEDS 486"
    "table3 qwen3_8b neg_route_projected ablations/neg_route_projected.sh ABLATION_SEEDS 486"
    "swap qwen3_8b annotator_swap ablations/annotator_swap.sh ABLATION_SEEDS 486"
)

# the last checkpoint verl saved in $1 (its latest_checkpointed_iteration.txt)
last_actor() {
    local step
    step=$(cat "$1/latest_checkpointed_iteration.txt" 2>/dev/null || true)
    [[ -n "$step" ]] || { echo "no checkpoint in $1 (training did not save one)" >&2; return 1; }
    echo "$1/global_step_$step/actor"
}

total=0
planned=0
for run in "${RUNS[@]}"; do
    read -r table model arm recipe seed_set hours extra <<<"$run"
    for seed in ${!seed_set}; do
        label="$table/$model/$arm/seed$seed"
        if [[ -n "$ONLY" ]] && ! [[ "$label" =~ $ONLY ]]; then continue; fi
        planned=$((planned + 1))
        total=$((total + hours))
        if [[ "$LIST" == 1 ]]; then
            echo "run $label: recipes/$recipe ${extra:-} (estimated $hours GPU-hours)"
            continue
        fi
        folder=$RESULTS_DIR/$model/$arm/seed$seed
        ckpt_dir=$CKPT_ROOT/$model/$arm/seed$seed
        experiment=${arm}_${model}_tau2_seed$seed
        read -r -a extra_env <<<"${extra:-}"
        echo "== $label (estimated $hours GPU-hours)" >&2
        # (1) training (verl's trainer.resume_mode=auto picks an interrupted run up from ckpt_dir)
        if [[ "$DRY_RUN" == 1 || ! -f "$folder/train.done" ]]; then
            env "${extra_env[@]+"${extra_env[@]}"}" SEED="$seed" EXPERIMENT_NAME="$experiment" CKPT_DIR="$ckpt_dir" \
                USER_BASE_URL="$TRAIN_USER_BASE_URL" USER_MODEL="$TRAIN_USER_MODEL" DRY_RUN="$DRY_RUN" PYTHON="$PYTHON" \
                bash "$REPO/recipes/$recipe" trainer.resume_mode=auto
            if [[ "$DRY_RUN" == 0 ]]; then
                mkdir -p "$folder"
                touch "$folder/train.done"
            fi
        fi
        if [[ "$DRY_RUN" == 1 ]]; then
            actor=$ckpt_dir/global_step_LAST/actor
        else
            actor=$(last_actor "$ckpt_dir")
        fi
        # (2) tau2-bench, held-out test split, held-out user (evaluate.py resumes from results.jsonl)
        if [[ "$DRY_RUN" == 1 || ! -f "$folder/tau2/results.metrics.json" ]]; then
            env CKPT="$actor" OUT_DIR="$folder/tau2" USER_BASE_URL="$EVAL_USER_BASE_URL" USER_MODEL="$EVAL_USER_MODEL" \
                TRAIN_USER_BASE_URL="$TRAIN_USER_BASE_URL" TRAIN_USER_MODEL="$TRAIN_USER_MODEL" DRY_RUN="$DRY_RUN" \
                PYTHON="$PYTHON" bash "$REPO/recipes/eval/tau2_eval.sh"
        fi
        # (3) BFCL-v4 multi-turn (Table 1 runs)
        if [[ "$table" == table1 && "$BFCL" == 1 ]] && [[ "$DRY_RUN" == 1 || ! -f "$folder/bfcl/summary.json" ]]; then
            env CKPT="$actor" OUT_DIR="$folder/bfcl" DRY_RUN="$DRY_RUN" PYTHON="$PYTHON" \
                bash "$REPO/recipes/eval/bfcl_eval.sh"
        fi
    done
done
echo "runs: $planned, estimated GPU-hours: $total (estimates, not measured)" >&2
if [[ "$LIST" == 1 || "$DRY_RUN" == 1 ]]; then
    exit 0
fi
"$PYTHON" "$REPO/scripts/paper_table.py" --root "$RESULTS_DIR" --markdown "$RESULTS_DIR/table.md" \
    --csv "$RESULTS_DIR/table.csv" "$@"
