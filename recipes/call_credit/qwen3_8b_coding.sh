#!/usr/bin/env bash
# CALL-CREDIT, Qwen3-8B on the built-in coding sandbox (environment "coding": bug-fix tasks in jailed git repos,
# reward = hidden tests; docs/design.md section 4). Each model call is classified IG / AE / RV by the rule annotator,
# the causal call graph splits the GRPO trajectory advantage over calls (call_credit.mode=mass_conserving).
# Expected: docs/design.md section 7 has no CALL-CREDIT reference numbers; compare against the GRPO baseline
# (recipes/call_credit/grpo_qwen3_8b_coding.sh) on hidden-test pass rate and credit/reward_hacking_rate.
# Hardware: 1 node x 8 GPUs. No simulated user and no annotator server (roles come from rules).
#
#   bash recipes/call_credit/qwen3_8b_coding.sh [hydra overrides...]      # writes $DATA_DIR/{train,val}.parquet once
#   DRY_RUN=1 bash recipes/call_credit/qwen3_8b_coding.sh                  # print the composed config, stop before Ray
# Knobs: recipes/common.sh, plus ESTIMATOR (call_credit|grpo), CALL_CREDIT_MODE (mass_conserving|paper),
# CALL_CREDIT_ALPHA, CALL_CREDIT_GAMMA, RV_REWARD (off|self_correction|literal), JAIL (namespace|fallback) [namespace].
#
# Sandbox (fails closed): the policy's shell commands run in the namespace jail (credit.env.options.jail=namespace,
# verl_credit/envs/coding/jail.py): `unshare --user --map-root-user --net --mount --pid --fork --mount-proc`, then
# mount(2) remounts every mount read-only, mounts a private tmpfs on /tmp and bind-mounts the repository back
# read-write, and `setpriv` drops all capabilities. If that cannot be set up the run stops: a real launch probes the
# jail first (exit 2, before Ray), and a rollout worker whose jail breaks raises instead of running commands.
# JAIL=auto is refused: it silently falls back to the `fallback` mode (no namespaces: a lexical path check, not a
# security boundary) wherever user namespaces are off; JAIL=fallback is that mode, chosen explicitly.
# In Docker, the default profiles forbid this; the container needs
#   --security-opt seccomp=unconfined      (the default seccomp profile blocks unshare/clone of new namespaces)
#   --security-opt apparmor=unconfined     (docker-default AppArmor denies mount(2); hosts with AppArmor)
#   --security-opt systempaths=unconfined  (--mount-proc: the kernel mounts a new /proc in a user namespace only
#                                           when the container's /proc has no masked paths, and Docker masks some)
# or simply --privileged (all three). The host kernel must allow user namespaces: user.max_user_namespaces > 0,
# kernel.unprivileged_userns_clone=1 where that sysctl exists (Debian/Ubuntu kernels), and on Ubuntu >= 23.10
# kernel.apparmor_restrict_unprivileged_userns=0 unless the container is --privileged. unshare and setpriv
# (util-linux) must be in the image. Check inside the container (must print True):
#   python -c 'from verl_credit.envs.coding.jail import namespace_jail_available as ok; print(ok())'
set -xeuo pipefail

RECIPES_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
MODEL_PATH=${MODEL_PATH:-Qwen/Qwen3-8B}
ROLLOUT_TP=${ROLLOUT_TP:-2}
ESTIMATOR=${ESTIMATOR:-call_credit}
CALL_CREDIT_MODE=${CALL_CREDIT_MODE:-mass_conserving}
CALL_CREDIT_ALPHA=${CALL_CREDIT_ALPHA:-0.0}
CALL_CREDIT_GAMMA=${CALL_CREDIT_GAMMA:-0.95}
RV_REWARD=${RV_REWARD:-off}
JAIL=${JAIL:-namespace}
EXPERIMENT_NAME=${EXPERIMENT_NAME:-${ESTIMATOR}_qwen3_8b_coding}
DATA_DIR=${DATA_DIR:-$HOME/data/coding}
MAX_PROMPT_LENGTH=${MAX_PROMPT_LENGTH:-2048}
MAX_RESPONSE_LENGTH=${MAX_RESPONSE_LENGTH:-16384}
TRAIN_BATCH_SIZE=${TRAIN_BATCH_SIZE:-7}
PPO_MINI_BATCH_SIZE=${PPO_MINI_BATCH_SIZE:-7}
case "$ESTIMATOR" in call_credit | grpo) ;; *) echo "ESTIMATOR must be call_credit|grpo" >&2 && exit 2 ;; esac
case "$CALL_CREDIT_MODE" in mass_conserving | paper) ;; *) echo "CALL_CREDIT_MODE must be mass_conserving|paper" >&2 && exit 2 ;; esac
case "$JAIL" in
    namespace | fallback) ;;
    auto) echo "JAIL=auto may silently run without a sandbox boundary; use JAIL=namespace (or JAIL=fallback knowingly)" >&2 && exit 2 ;;
    *) echo "JAIL must be namespace|fallback, got '$JAIL'" >&2 && exit 2 ;;
esac
source "$RECIPES_DIR/common.sh"
common_sections

# One row per shipped task (verl_credit/envs/coding/tasks); the sandbox has no held-out split, so val = train.
if [[ "$DRY_RUN" != 1 && (! -f "$DATA_DIR/train.parquet" || ! -f "$DATA_DIR/val.parquet") ]]; then
    DATA_DIR="$DATA_DIR" "$PYTHON" - <<'PY'
import os
import pandas as pd
from verl_credit.envs.coding import SYSTEM_PROMPT, list_tasks

rows = [
    {"data_source": "coding", "agent_name": "credit_agent", "ability": "coding",
     "prompt": [{"role": "system", "content": SYSTEM_PROMPT}],
     "extra_info": {"env": "coding", "task": name, "index": index}}
    for index, name in enumerate(list_tasks())
]
out = os.path.expanduser(os.environ["DATA_DIR"])
os.makedirs(out, exist_ok=True)
for split in ("train", "val"):
    pd.DataFrame(rows).to_parquet(os.path.join(out, f"{split}.parquet"), index=False)
print(f"{out}: {len(rows)} coding tasks")
PY
fi

# Fail closed before Ray starts: the namespace jail must work on this node (see the header for Docker).
if [[ "$DRY_RUN" != 1 && "$JAIL" == namespace ]]; then
    if ! "$PYTHON" - <<'PY'
import sys
from verl_credit.envs.coding.jail import namespace_jail_available

sys.exit(0 if namespace_jail_available() else 1)
PY
    then
        echo "the coding sandbox's namespace jail (unshare --user --mount --pid --net + mount + setpriv) does not work" \
            "on $(hostname); in Docker run with --security-opt seccomp=unconfined --security-opt apparmor=unconfined" \
            "--security-opt systempaths=unconfined (or --privileged), and allow user namespaces on the host" \
            "(recipes/call_credit/qwen3_8b_coding.sh header); JAIL=fallback runs without that boundary" >&2
        exit 2
    fi
fi

data_section
ENVIRONMENT=(
    credit.env.name=coding
    +credit.env.options.jail="$JAIL"
    credit.user.name=env
)
ALGORITHM=(
    algorithm.adv_estimator="$ESTIMATOR"
    algorithm.norm_adv_by_std_in_grpo=True
    algorithm.use_kl_in_reward=False
)
CREDIT=(
    credit.layout=merged
    credit.call_credit.mode="$CALL_CREDIT_MODE"
    credit.call_credit.alpha="$CALL_CREDIT_ALPHA"
    credit.call_credit.gamma="$CALL_CREDIT_GAMMA"
    credit.call_credit.rv_reward="$RV_REWARD"
    credit.annotator.name=rules
)
TRAINER+=(trainer.v1.trainer_mode=credit_sync)

launch_credit_trainer "${DATA[@]}" "${MODEL[@]}" "${ACTOR[@]}" "${ROLLOUT[@]}" "${ENVIRONMENT[@]}" \
    "${ALGORITHM[@]}" "${CREDIT[@]}" "${TRAINER[@]}" "$@"
