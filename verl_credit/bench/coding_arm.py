"""Learning-benchmark arm on the coding sandbox: ``grpo`` vs ``call_credit``.

World: the shipped bug-fix tasks (``verl_credit/envs/coding/tasks``) in the real sandbox -- real
files, real ``read_file``/``edit_file`` results with diffs, real pytest runs, hidden-test reward,
``edit_file`` refused on a file that was not read first (as in Claude Code). The sandbox is
deterministic, so every (state, tool call) is executed once per process and then served from a
cache (:class:`CachedTaskWorld`); the transcripts the credit map sees are the real ones.

Policy: a small softmax policy over discrete call options, one decision per model call:

====================  ==========================  =============================================
slot                  options                     parameters
====================  ==========================  =============================================
``read_1``/``read_2`` read target, read distractor,  shared by all tasks (a process skill)
                      read visible test, list_dir,
                      search for the symbol
``edit``              the reference fix, each of    per task (task knowledge)
                      the task's wrong edits
``verify``            run_tests, answer              shared
``repair``            (only after failing tests)     per task
                      each edit option, answer
====================  ==========================  =============================================

An edit rewrites the bug's site (``old`` = what the agent last saw there). After ``run_tests``
(and a repair, if any) the episode ends with a fixed answer message (not a decision). Reward:
1.0 iff every hidden test passes. Initially every option is equally likely (success ~0.13).

Learner (identical in both arms): per update ``tasks_per_step`` distinct tasks x ``group_size``
rollouts; GRPO group-normalized outcome advantage ``A_tau`` (verl's formula, through
``compute_batch_credit``); REINFORCE on the decisions, ``grad = (1/N) sum_n A_n (onehot - pi)``
(token-mean over decisions), Adam. The arms differ only in ``A_n``:

* ``grpo``: ``A_n = A_tau`` for every call;
* ``call_credit``: ``A_n = A_tau * w_n`` with ``w`` from
  ``batch_credit.compute_batch_credit(estimator="call_credit")`` on the call graphs that
  ``annotate.roles.build_call_graph`` builds from the transcripts (token lengths: whitespace
  counts of each call, the documented fallback of :class:`~verl_credit.trajectory.Trajectory`).

Measured per run: rollouts until the success rate over the last ``window`` training rollouts
reaches ``target``; final success of the trained policy on ``eval_episodes`` fresh rollouts;
``credit/reward_hacking_rate`` (``credit.call_credit.compute_reward_hacking_rate``: among
successful trajectories, the share whose mean per-token advantage on IG calls exceeds the AE one by
more than 10%), pooled over all training batches of the run.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch

from verl_credit.annotate.roles import build_call_graph
from verl_credit.batch_credit import BatchCredit, compute_batch_credit, pad_call_graphs
from verl_credit.bench.parallel import map_jobs
from verl_credit.bench.stats import format_rollouts, summarize_learning_runs
from verl_credit.call_graph import CallGraph
from verl_credit.config import CreditConfig
from verl_credit.credit_math.call_credit import compute_reward_hacking_rate
from verl_credit.envs.base import ToolResult
from verl_credit.envs.coding.sandbox import CodingSandbox, SandboxState
from verl_credit.envs.coding.task_spec import CodingTask, FileEdit, list_tasks, load_task
from verl_credit.envs.coding_agent import PlannedCall, TranscriptRecorder
from verl_credit.trajectory import Trajectory

__all__ = [
    "CODING_ARMS",
    "READ_OPTIONS",
    "VERIFY_OPTIONS",
    "CachedTaskWorld",
    "CallPolicy",
    "CodingBenchConfig",
    "CodingRollout",
    "CodingRunResult",
    "credit_for_batch",
    "format_markdown_table",
    "play_episode",
    "policy_gradient",
    "run_coding_benchmark",
    "summarize_coding_runs",
    "train_coding_run",
]

CODING_ARMS: tuple[str, ...] = ("grpo", "call_credit")
READ_OPTIONS: tuple[str, ...] = ("read_target", "read_distractor", "read_test", "list_dir", "search")
VERIFY_OPTIONS: tuple[str, ...] = ("run_tests", "answer")
FINAL_ANSWER = "Done: the bug is fixed."
_STATE_FREE_TOOLS = frozenset({"run_tests"})  # results depend on the files only; they change nothing


# ----------------------------------------------------------------------------------------------
# The world: the real sandbox behind an exact cache
# ----------------------------------------------------------------------------------------------


class CachedTaskWorld:
    """One task's sandbox as a deterministic transition table, filled on demand.

    A state is the working tree plus the set of paths the agent has read; ``step`` executes a call
    in the real sandbox the first time a (state, call) pair is seen and serves it from the table
    afterwards. ``run_tests`` is keyed by the files alone (its result does not depend on the read set).
    """

    def __init__(self, task: CodingTask, **sandbox_options: Any) -> None:
        self.task = task
        self.sandbox_options = sandbox_options
        self._sandbox: CodingSandbox | None = None
        self._states: dict[str, SandboxState] = {}
        self._transitions: dict[tuple[str, str, str], tuple[ToolResult, str]] = {}
        self._rewards: dict[str, float] = {}
        self.executed = 0  # real tool executions (cache misses)
        self.initial_state = self._remember(self._open().snapshot())

    def _open(self) -> CodingSandbox:
        if self._sandbox is None:
            self._sandbox = CodingSandbox(self.task, **self.sandbox_options)
        return self._sandbox

    def _remember(self, state: SandboxState) -> str:
        key = f"{state.digest}|{'|'.join(sorted(state.known_paths))}"
        self._states.setdefault(key, state)
        return key

    def step(self, state_key: str, name: str, arguments: Mapping[str, Any]) -> tuple[ToolResult, str]:
        """``(result, next state key)`` of tool call ``name(arguments)`` in state ``state_key``."""
        files_key = state_key.split("|", 1)[0]
        lookup = (files_key if name in _STATE_FREE_TOOLS else state_key, name, json.dumps(arguments, sort_keys=True))
        cached = self._transitions.get(lookup)
        if cached is not None:
            result, next_key = cached
            return result, state_key if name in _STATE_FREE_TOOLS else next_key
        sandbox = self._open()
        sandbox.restore(self._states[state_key])
        result = sandbox.call(name, arguments)
        self.executed += 1
        next_key = state_key if name in _STATE_FREE_TOOLS else self._remember(sandbox.snapshot())
        self._transitions[lookup] = (result, next_key)
        return result, next_key

    def reward(self, state_key: str) -> float:
        """Hidden-test reward of the working tree of ``state_key``."""
        files_key = state_key.split("|", 1)[0]
        if files_key not in self._rewards:
            sandbox = self._open()
            sandbox.restore(self._states[state_key])
            self._rewards[files_key] = sandbox.reward()
        return self._rewards[files_key]

    def close(self) -> None:
        if self._sandbox is not None:
            self._sandbox.close()
            self._sandbox = None


# ----------------------------------------------------------------------------------------------
# Policy and episodes
# ----------------------------------------------------------------------------------------------


def edit_options(task: CodingTask) -> list[tuple[str, FileEdit]]:
    """``(name, edit)`` alternatives for the bug's site: the reference fix, then the wrong edits."""
    return [("solution", task.solution[0])] + [(w.name, w.edits[0]) for w in task.wrong_edits]


class CallPolicy:
    """Softmax over call options, one logit vector per decision slot (see the module docstring)."""

    def __init__(self, tasks: Sequence[CodingTask]) -> None:
        self.logits: dict[str, np.ndarray] = {
            "read_1": np.zeros(len(READ_OPTIONS)),
            "read_2": np.zeros(len(READ_OPTIONS)),
            "verify": np.zeros(len(VERIFY_OPTIONS)),
        }
        for task in tasks:
            count = len(edit_options(task))
            self.logits[f"edit/{task.name}"] = np.zeros(count)
            self.logits[f"repair/{task.name}"] = np.zeros(count + 1)  # + answer

    def probabilities(self, slot: str) -> np.ndarray:
        logits = self.logits[slot]
        shifted = np.exp(logits - logits.max())
        return shifted / shifted.sum()

    def sample(self, slot: str, rng: np.random.Generator) -> int:
        return int(rng.choice(len(self.logits[slot]), p=self.probabilities(slot)))


@dataclass
class CodingRollout:
    """One episode: its decisions, transcript, reward and call graph.

    ``decisions[i]`` is ``(slot, option)`` of model call ``i``, or ``None`` for the fixed final answer.
    """

    task: str
    decisions: list[tuple[str, int] | None]
    messages: list[dict[str, Any]]
    reward: float
    trajectory: Trajectory
    call_graph: CallGraph

    @property
    def lengths(self) -> list[int]:
        return self.trajectory.action_lengths


def _read_call(task: CodingTask, option: int) -> PlannedCall:
    choice = READ_OPTIONS[option]
    if choice == "read_target":
        return PlannedCall("read_file", {"path": task.target})
    if choice == "read_distractor":
        return PlannedCall("read_file", {"path": task.distractors[0]})
    if choice == "read_test":
        return PlannedCall("read_file", {"path": task.visible_tests[0]})
    if choice == "list_dir":
        return PlannedCall("list_dir", {"path": "."})
    return PlannedCall("search", {"pattern": task.symbol})


def play_episode(
    world: CachedTaskWorld,
    policy: CallPolicy,
    rng: np.random.Generator,
    cache: dict[tuple[str, tuple[Any, ...]], CodingRollout] | None = None,
) -> CodingRollout:
    """Sample one episode from ``policy`` in ``world`` (transcripts/graphs cached by the choices)."""
    task = world.task
    options = edit_options(task)
    site = options[0][1]
    state = world.initial_state
    site_text = site.old  # what the agent last saw at the bug's site
    decisions: list[tuple[str, int] | None] = []

    def execute(name: str, arguments: Mapping[str, Any]) -> ToolResult:
        nonlocal state
        result, state = world.step(state, name, arguments)
        return result

    recorder = TranscriptRecorder(task, execute)

    def edit(option: int) -> ToolResult | None:
        nonlocal site_text
        new = options[option][1].new
        result = recorder.step(PlannedCall("edit_file", {"path": site.path, "old": site_text, "new": new}))
        if result is not None and not result.is_error:
            site_text = new
        return result

    for slot in ("read_1", "read_2"):
        option = policy.sample(slot, rng)
        decisions.append((slot, option))
        recorder.step(_read_call(task, option))
    option = policy.sample(f"edit/{task.name}", rng)
    decisions.append((f"edit/{task.name}", option))
    edit(option)
    option = policy.sample("verify", rng)
    decisions.append(("verify", option))
    if VERIFY_OPTIONS[option] == "answer":
        recorder.step(PlannedCall(None, content=FINAL_ANSWER))
    else:
        tests = recorder.step(PlannedCall("run_tests", {}))
        if tests is not None and not tests.content.startswith("pytest exit code 0"):
            repair_slot = f"repair/{task.name}"
            option = policy.sample(repair_slot, rng)
            decisions.append((repair_slot, option))
            if option == len(options):
                recorder.step(PlannedCall(None, content=FINAL_ANSWER))
            else:
                edit(option)
                decisions.append(None)
                recorder.step(PlannedCall(None, content=FINAL_ANSWER))
        else:
            decisions.append(None)
            recorder.step(PlannedCall(None, content=FINAL_ANSWER))
    key = (task.name, tuple(decisions))
    if cache is not None and key in cache:
        return cache[key]
    reward = world.reward(state)
    trajectory = Trajectory.from_messages(recorder.messages, id=task.name, uid=task.name, reward=reward)
    rollout = CodingRollout(task.name, decisions, recorder.messages, reward, trajectory, build_call_graph(trajectory))
    if cache is not None:
        cache[key] = rollout
    return rollout


# ----------------------------------------------------------------------------------------------
# Credit and the policy gradient
# ----------------------------------------------------------------------------------------------


def credit_for_batch(arm: str, rollouts: Sequence[CodingRollout]) -> tuple[BatchCredit, dict[str, torch.Tensor]]:
    """Per-call advantages of one arm for a batch, and the ``(B, T)`` role masks of its call graphs.

    ``grpo`` and ``call_credit`` both go through ``batch_credit.compute_batch_credit``; the role masks
    (used by the reward-hacking metric in both arms) come from the same call graphs.
    """
    if arm not in CODING_ARMS:
        raise ValueError(f"unknown coding-bench arm {arm!r}; arms: {CODING_ARMS}")
    scores = torch.tensor([r.reward for r in rollouts], dtype=torch.float32)
    index = [r.task for r in rollouts]
    lengths = [r.lengths for r in rollouts]
    graphs = [r.call_graph for r in rollouts]
    config = CreditConfig(estimator=arm)
    credit = compute_batch_credit(scores, index, lengths, config, call_graphs=graphs if arm == "call_credit" else None)
    masks = pad_call_graphs(graphs, credit.lengths.shape[1], dict(config.call_credit.omega))
    return credit, masks


def policy_gradient(
    policy: CallPolicy, rollouts: Sequence[CodingRollout], action_advantage: torch.Tensor
) -> dict[str, np.ndarray]:
    """Token-mean REINFORCE gradient over decisions: ``(1/N) sum_n A_n (onehot(a_n) - pi(. | slot_n))``.

    Args:
        action_advantage: ``(B, T)`` per-call advantage ``A_tau * w_i``; the fixed final answer
            (no decision) contributes nothing.

    Returns:
        slot -> gradient of the expected advantage with respect to that slot's logits (ascent).
    """
    gradient = {slot: np.zeros_like(logits) for slot, logits in policy.logits.items()}
    count = 0
    values = action_advantage.double().numpy()
    for row, rollout in enumerate(rollouts):
        for call, decision in enumerate(rollout.decisions):
            if decision is None:
                continue
            slot, option = decision
            score = -policy.probabilities(slot)
            score[option] += 1.0
            gradient[slot] += values[row, call] * score
            count += 1
    return {slot: g / max(count, 1) for slot, g in gradient.items()}


class _Adam:
    """Adam (gradient ascent) on a dict of parameter arrays."""

    def __init__(self, params: Mapping[str, np.ndarray], lr: float, betas: tuple[float, float] = (0.9, 0.999)):
        self.lr, self.betas, self.eps, self.t = lr, betas, 1e-8, 0
        self.m = {k: np.zeros_like(v) for k, v in params.items()}
        self.v = {k: np.zeros_like(v) for k, v in params.items()}

    def step(self, params: dict[str, np.ndarray], grads: Mapping[str, np.ndarray]) -> None:
        self.t += 1
        b1, b2 = self.betas
        for key, grad in grads.items():
            if not grad.any():
                continue  # a slot unused in this batch keeps its moments (sparse update)
            self.m[key] = b1 * self.m[key] + (1 - b1) * grad
            self.v[key] = b2 * self.v[key] + (1 - b2) * grad * grad
            m_hat = self.m[key] / (1 - b1**self.t)
            v_hat = self.v[key] / (1 - b2**self.t)
            params[key] += self.lr * m_hat / (np.sqrt(v_hat) + self.eps)


# ----------------------------------------------------------------------------------------------
# Runs
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CodingBenchConfig:
    """Benchmark knobs: experiment first, then the learner (identical in every arm)."""

    arms: tuple[str, ...] = CODING_ARMS
    """Advantage maps to compare."""
    seeds: int = 20
    """Independent runs per arm; seed k sees the same task sequence in every arm."""
    tasks: tuple[str, ...] = ()
    """Task names (empty: every shipped task)."""
    budget: int = 2048
    """Training rollouts per run."""
    target: float = 0.9
    """Moving success rate that counts as learned."""
    window: int = 128
    """Training rollouts in the moving success rate."""
    eval_episodes: int = 256
    """Rollouts of the final policy (cycling through the tasks)."""
    group_size: int = 8
    """Rollouts per task per update (the GRPO group)."""
    tasks_per_step: int = 4
    """Distinct tasks per update."""
    learning_rate: float = 0.3
    """Step size (BENCHMARKS.md reports a sweep; the same value for every arm)."""
    optimizer: str = "adam"
    """``adam`` (per-logit normalized steps) or ``sgd`` (plain gradient ascent)."""
    workers: int = 2
    """Processes (each fills its own sandbox cache)."""

    def __post_init__(self) -> None:
        for arm in self.arms:
            if arm not in CODING_ARMS:
                raise ValueError(f"unknown coding-bench arm {arm!r}; arms: {CODING_ARMS}")
        if self.seeds < 1 or self.group_size < 2 or self.tasks_per_step < 1:
            raise ValueError(
                f"need seeds >= 1, group_size >= 2, tasks_per_step >= 1; got {self.seeds}, {self.group_size}, "
                f"{self.tasks_per_step}"
            )
        if self.budget < self.group_size * self.tasks_per_step:
            raise ValueError(f"budget {self.budget} is smaller than one batch")
        if not 0 < self.target <= 1:
            raise ValueError(f"target must be in (0, 1], got {self.target}")
        if self.optimizer not in ("adam", "sgd"):
            raise ValueError(f"optimizer must be 'adam' or 'sgd', got {self.optimizer!r}")

    def task_names(self) -> list[str]:
        return list(self.tasks) or list_tasks()


@dataclass
class CodingRunResult:
    """One training run. ``curve``: (rollouts so far, batch success rate) per update."""

    arm: str
    seed: int
    rollouts_to_target: float  # math.inf when the target was not reached within the budget
    final_success: float
    initial_success: float
    hacking_count: float  # successful trajectories flagged by the reward-hacking metric
    hacking_eligible: int  # successful trajectories with IG and AE tokens
    curve: list[tuple[int, float]] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def reward_hacking_rate(self) -> float:
        return self.hacking_count / self.hacking_eligible if self.hacking_eligible else 0.0


_WORLDS: dict[tuple[str, str], CachedTaskWorld] = {}
_ROLLOUT_CACHE: dict[tuple[str, tuple[Any, ...]], CodingRollout] = {}


def _world(name: str, jail: str) -> CachedTaskWorld:
    """Process-wide world per task (the cache is exact, so sharing it across runs changes nothing)."""
    key = (name, jail)
    if key not in _WORLDS:
        _WORLDS[key] = CachedTaskWorld(load_task(name), jail=jail)
    return _WORLDS[key]


def train_coding_run(arm: str, seed: int, config: CodingBenchConfig, jail: str = "auto") -> CodingRunResult:
    """Train one policy from uniform logits with one arm's advantage map (see the module doc)."""
    started = time.perf_counter()
    names = config.task_names()
    worlds = {name: _world(name, jail) for name in names}
    tasks = [world.task for world in worlds.values()]
    task_rng = np.random.default_rng([seed, 1])  # the same task sequence in every arm
    policy_rng = np.random.default_rng([seed, 2])
    policy = CallPolicy(tasks)
    optimizer = _Adam(policy.logits, config.learning_rate) if config.optimizer == "adam" else None
    history: list[float] = []
    curve: list[tuple[int, float]] = []
    reached = math.inf
    hacking_count, hacking_eligible = 0.0, 0
    per_step = min(config.tasks_per_step, len(names))
    seen = 0
    while seen < config.budget:
        chosen = task_rng.choice(len(names), size=per_step, replace=False)
        rollouts = [
            play_episode(worlds[names[k]], policy, policy_rng, _ROLLOUT_CACHE)
            for k in chosen
            for _ in range(config.group_size)
        ]
        rewards = [r.reward for r in rollouts]
        seen += len(rollouts)
        history.extend(rewards)
        curve.append((seen, float(np.mean(rewards))))
        window_full = len(history) >= config.window
        if math.isinf(reached) and window_full and np.mean(history[-config.window :]) >= config.target:
            reached = seen
        credit, masks = credit_for_batch(arm, rollouts)
        rate, eligible = compute_reward_hacking_rate(
            torch.tensor(rewards, dtype=torch.float64),
            credit.action_advantage.double(),
            credit.lengths,
            masks["IG"],
            masks["AE"],
        )
        hacking_count += rate * eligible
        hacking_eligible += eligible
        gradient = policy_gradient(policy, rollouts, credit.action_advantage)
        if optimizer is not None:
            optimizer.step(policy.logits, gradient)
        else:
            for slot, value in gradient.items():
                policy.logits[slot] += config.learning_rate * value
    eval_rng = np.random.default_rng([seed, 3])
    wins = sum(
        play_episode(worlds[names[k % len(names)]], policy, eval_rng, _ROLLOUT_CACHE).reward
        for k in range(config.eval_episodes)
    )
    for world in worlds.values():
        world.close()  # the temp dirs go; the tables stay (a later miss reopens a sandbox)
    return CodingRunResult(
        arm=arm,
        seed=seed,
        rollouts_to_target=reached,
        final_success=wins / config.eval_episodes,
        initial_success=curve[0][1],
        hacking_count=hacking_count,
        hacking_eligible=hacking_eligible,
        curve=curve,
        seconds=time.perf_counter() - started,
    )


def _run_job(job: tuple[str, int, CodingBenchConfig, str]) -> CodingRunResult:
    torch.set_num_threads(1)
    return train_coding_run(*job)


def run_coding_benchmark(
    config: CodingBenchConfig, progress: Callable[[CodingRunResult], Any] | None = None, jail: str = "auto"
) -> list[CodingRunResult]:
    """Every (arm, seed) run, in ``config.workers`` processes."""
    jobs = [(arm, seed, config, jail) for seed in range(config.seeds) for arm in config.arms]
    results = map_jobs(_run_job, jobs, config.workers, progress)
    return sorted(results, key=lambda r: (r.arm, r.seed))


# ----------------------------------------------------------------------------------------------
# Summary
# ----------------------------------------------------------------------------------------------


def summarize_coding_runs(results: Sequence[CodingRunResult], config: CodingBenchConfig) -> dict[str, Any]:
    """Per arm: rollouts-to-target (median, IQR, reached), final success (mean, std), reward-hacking
    rate (pooled over runs), initial success."""
    arms: dict[str, Any] = {}
    for arm in config.arms:
        runs = [r for r in results if r.arm == arm]
        if not runs:
            continue
        eligible = sum(r.hacking_eligible for r in runs)
        arms[arm] = {
            **summarize_learning_runs(runs),
            "reward_hacking_rate": sum(r.hacking_count for r in runs) / eligible if eligible else 0.0,
            "reward_hacking_eligible": eligible,
        }
    return {"config": asdict(config), "arms": arms}


def format_markdown_table(summary: Mapping[str, Any]) -> str:
    """One markdown row per arm."""
    config = summary["config"]
    lines = [
        f"| arm | rollouts to {config['target']:.0%} (median) | IQR | reached | final success | "
        "credit/reward_hacking_rate | initial success |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for arm, s in summary["arms"].items():
        iqr = f"[{format_rollouts(s['rollouts_to_target_q25'])}, {format_rollouts(s['rollouts_to_target_q75'])}]"
        lines.append(
            f"| {arm} | {format_rollouts(s['rollouts_to_target_median'])} | {iqr} | {s['reached']}/{s['runs']} | "
            f"{s['final_success_mean']:.3f} ± {s['final_success_std']:.3f} | {s['reward_hacking_rate']:.3f} | "
            f"{s['initial_success_mean']:.3f} |"
        )
    return "\n".join(lines)
