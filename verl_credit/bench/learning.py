"""Learning benchmark: does routed credit make policy-gradient learning faster in the service world?

Setup (identical for every arm):

* policy: ``pi(a | s) = softmax(W phi(s))`` over the 12 macro actions of the service world
  (``envs.service.agent``), ``phi(s)`` the 15 tracked dialogue-state features; ``W`` starts at the
  hand-written prior of the demo agent (a sloppy agent that succeeds about half the time);
* data: every update samples ``tasks_per_step`` tasks from a pool of ``task_pool`` tasks of one
  variant and ``group_size`` rollouts of each (the task sequence depends only on the seed);
* objective: REINFORCE with the GRPO group-normalized outcome advantage ``A_tau`` (verl's
  function), token-mean aggregation over actions, one update per batch (on-policy), Adam;
* every action counts as one token (``L_i = 1``): a macro action is one decision.

The only difference between arms is the map from ``A_tau`` to per-action advantages
``A_i = A_tau * w_i``:

* ``grpo``: ``w_i = 1``;
* ``iapo``: ``w`` routed by ``compute_batch_credit`` from graphs that the rule annotator builds
  from the rendered transcripts (section 8 messages; cached per distinct transcript);
* ``call_credit``: ``w`` from the service-world call graphs (``envs.service.roles``);
* ``oracle``: ``w_i = T / |C|`` on the actions ``C`` known to be causal (successes: the actions the
  correct writes depended on; failures: the mistakes), 0 elsewhere (uniform when ``C`` is empty) --
  the same total mass as every other arm, placed by the simulator's ground truth.

Measured per run: training rollouts consumed when the policy first reaches ``target`` success
(checked after every update on ``check_episodes`` rollouts that are not trained on); success of
the final policy on ``eval_episodes`` fresh rollouts; credit precision = share of the positive
advantage mass ``sum max(A_i, 0)`` that lands on causal actions.

Variants: ``refund`` (base), ``delayed`` (four-item orders: the payment method and item ids are
fetched early and used many turns later), ``error_repair`` (the first order id is mistyped; the
lookup fails and must be repaired by asking again).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from verl_credit.annotate.base import Annotator
from verl_credit.annotate.factory import build_annotator
from verl_credit.batch_credit import compute_batch_credit
from verl_credit.bench.parallel import map_jobs
from verl_credit.bench.stats import format_rollouts, mann_whitney_p, summarize_learning_runs
from verl_credit.call_graph import CallGraph
from verl_credit.config import CreditConfig
from verl_credit.credit_math.grpo import compute_grpo_trajectory_advantage
from verl_credit.envs.service.agent import MACROS, Episode, LinearSoftmaxPolicy, prior_weight_matrix, run_episode
from verl_credit.envs.service.env import ServiceEpisode
from verl_credit.envs.service.roles import build_service_call_graph
from verl_credit.graph import InfluenceGraph
from verl_credit.trajectory import Trajectory

__all__ = [
    "ARMS",
    "BENCH_VARIANTS",
    "DIAGNOSTIC_ARMS",
    "LearningConfig",
    "RunResult",
    "format_table",
    "oracle_weights",
    "plot_curves",
    "policy_gradient",
    "results_to_json",
    "run_benchmark",
    "summarize_runs",
    "train_run",
    "write_results",
]

ARMS: tuple[str, ...] = ("grpo", "iapo", "call_credit", "oracle")
# Diagnostic arms (not run by default): ``oracle_pos`` = oracle weights when A > 0, flat when A < 0.
DIAGNOSTIC_ARMS: tuple[str, ...] = ("oracle_pos",)
BENCH_VARIANTS: tuple[str, ...] = ("refund", "delayed", "error_repair")


@dataclass(frozen=True)
class LearningConfig:
    """Benchmark knobs (experiment first, then the learner, which is the same for every arm)."""

    variants: tuple[str, ...] = BENCH_VARIANTS
    """Task variants to run (``refund`` is the base; ``delayed``, ``error_repair``)."""
    arms: tuple[str, ...] = ARMS
    """Advantage maps to compare."""
    seeds: int = 20
    """Independent runs per (variant, arm); seed k uses the same tasks in every arm."""
    budget: int = 1024
    """Training rollouts per run."""
    target: float = 0.9
    """Success rate that counts as learned."""
    check_episodes: int = 64
    """Rollouts of the current policy after every update, until one check reaches ``target``."""
    eval_episodes: int = 256
    """Rollouts of the final policy for the final success rate."""
    smooth_updates: int = 4
    """Updates averaged in the plotted learning curves."""
    group_size: int = 8
    """Rollouts per task per update (GRPO group)."""
    tasks_per_step: int = 4
    """Tasks per update (batch = tasks_per_step * group_size rollouts)."""
    task_pool: int = 64
    """Distinct tasks per variant and seed."""
    learning_rate: float = 0.1
    """Adam step size: the fastest of 0.02/0.05/0.1/0.2 for the grpo arm alone (6 seeds, all
    variants); never tuned on another arm."""
    optimizer: str = "adam"
    """``adam`` or ``sgd``."""
    workers: int = 2
    """Processes."""

    def __post_init__(self) -> None:
        for arm in self.arms:
            if arm not in ARMS + DIAGNOSTIC_ARMS:
                raise ValueError(f"unknown arm {arm!r}; arms: {ARMS + DIAGNOSTIC_ARMS}")
        for variant in self.variants:
            if variant not in BENCH_VARIANTS:
                raise ValueError(f"unknown benchmark variant {variant!r}; variants: {BENCH_VARIANTS}")
        if self.optimizer not in ("adam", "sgd"):
            raise ValueError(f"optimizer must be 'adam' or 'sgd', got {self.optimizer!r}")
        if self.seeds < 1 or self.budget < self.batch_size or self.group_size < 2:
            raise ValueError(
                "need seeds >= 1, group_size >= 2 and budget >= one batch "
                f"({self.batch_size} rollouts); got seeds={self.seeds}, budget={self.budget}"
            )
        if not 0 < self.target <= 1:
            raise ValueError(f"target must be in (0, 1], got {self.target}")

    @property
    def batch_size(self) -> int:
        return self.group_size * self.tasks_per_step


@dataclass
class RunResult:
    """One training run. ``curve``: (rollouts so far, batch success rate) per update."""

    variant: str
    arm: str
    seed: int
    rollouts_to_target: float  # math.inf when the target was not reached within the budget
    final_success: float
    initial_success: float
    precision_mass: float  # positive advantage mass on causal actions
    positive_mass: float  # all positive advantage mass
    curve: list[tuple[int, float]] = field(default_factory=list)
    seconds: float = 0.0
    annotated: int = 0  # distinct transcripts the annotator saw

    @property
    def credit_precision(self) -> float:
        return self.precision_mass / self.positive_mass if self.positive_mass > 0 else float("nan")


# ----------------------------------------------------------------------------------------------
# Advantage maps
# ----------------------------------------------------------------------------------------------


def oracle_weights(episodes: Sequence[Episode], advantage: np.ndarray, negative: bool = True) -> list[np.ndarray]:
    """Per-action weights of the oracle arm: ``T / |C|`` on the ground-truth set ``C`` (causal
    actions when ``A > 0``, mistakes when ``A < 0``), 0 elsewhere; 1 everywhere when ``C`` is
    empty or ``A = 0``. Mass conserving: ``sum_i w_i = T``. ``negative=False`` keeps ``A < 0`` flat
    (the ``oracle_pos`` diagnostic)."""
    weights = []
    for episode, value in zip(episodes, advantage, strict=True):
        count = len(episode.macros)
        flags = np.asarray(episode.causal if value > 0 else episode.mistakes, dtype=bool)
        if value == 0 or not flags.any() or (value < 0 and not negative):
            weights.append(np.ones(count))
        else:
            weights.append(np.where(flags, count / flags.sum(), 0.0))
    return weights


class CreditMap:
    """``A_tau`` -> per-action weights for one arm; graphs are cached per distinct transcript."""

    def __init__(self, arm: str, annotator: Annotator | None = None):
        self.arm = arm
        self.annotator = annotator
        self.graphs: dict[tuple[str, tuple[int, ...]], InfluenceGraph] = {}
        self.call_graphs: dict[tuple[str, tuple[int, ...]], CallGraph] = {}

    def _trajectory(self, episode: Episode) -> Trajectory:
        return Trajectory.from_messages(
            episode.messages, id=episode.task_id, reward=episode.reward, action_token_lengths=[1] * len(episode.macros)
        )

    def _influence_graphs(self, episodes: Sequence[Episode]) -> list[InfluenceGraph]:
        missing = {e.key: e for e in episodes if e.key not in self.graphs}
        if missing:
            if self.annotator is None:
                raise ValueError("the iapo arm needs an annotator")
            keys = list(missing)
            results = self.annotator.annotate([self._trajectory(missing[k]) for k in keys])
            for key, result in zip(keys, results, strict=True):
                self.graphs[key] = result.graph
        return [self.graphs[e.key] for e in episodes]

    def _call_graphs(self, episodes: Sequence[Episode]) -> list[CallGraph]:
        for episode in episodes:
            if episode.key not in self.call_graphs:
                self.call_graphs[episode.key] = build_service_call_graph(self._trajectory(episode))
        return [self.call_graphs[e.key] for e in episodes]

    def weights(
        self, episodes: Sequence[Episode], scores: torch.Tensor, uids: Sequence[str]
    ) -> tuple[np.ndarray, list[np.ndarray]]:
        """``(A_tau (B,), [w (T_b,) per episode])``."""
        lengths = [[1] * len(e.macros) for e in episodes]
        if self.arm in ("oracle", "oracle_pos"):
            advantage = compute_grpo_trajectory_advantage(scores, uids).double().numpy()
            return advantage, oracle_weights(episodes, advantage, negative=self.arm == "oracle")
        graphs = self._influence_graphs(episodes) if self.arm == "iapo" else None
        call_graphs = self._call_graphs(episodes) if self.arm == "call_credit" else None
        credit = compute_batch_credit(
            scores, uids, lengths, CreditConfig(estimator=self.arm), graphs=graphs, call_graphs=call_graphs
        )
        advantage = credit.trajectory_advantage.double().numpy()
        weight = credit.weight.numpy()
        return advantage, [weight[row, : len(e.macros)] for row, e in enumerate(episodes)]


# ----------------------------------------------------------------------------------------------
# Policy gradient
# ----------------------------------------------------------------------------------------------


class Adam:
    """Adam on one parameter array (gradient *ascent*)."""

    def __init__(self, shape: tuple[int, ...], lr: float, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8):
        self.lr, self.betas, self.eps = lr, betas, eps
        self.m, self.v, self.t = np.zeros(shape), np.zeros(shape), 0

    def step(self, params: np.ndarray, grad: np.ndarray) -> None:
        self.t += 1
        b1, b2 = self.betas
        self.m = b1 * self.m + (1 - b1) * grad
        self.v = b2 * self.v + (1 - b2) * grad * grad
        m_hat = self.m / (1 - b1**self.t)
        v_hat = self.v / (1 - b2**self.t)
        params += self.lr * m_hat / (np.sqrt(v_hat) + self.eps)


def policy_gradient(
    policy: LinearSoftmaxPolicy, features: np.ndarray, actions: np.ndarray, advantages: np.ndarray
) -> np.ndarray:
    """Token-mean REINFORCE gradient ``(1/N) sum_n A_n grad log pi(a_n | s_n)`` w.r.t. ``W``.

    Shapes: ``features (N, F)``, ``actions (N,)``, ``advantages (N,)`` -> ``(K, F)``; for the linear
    softmax ``grad_W log pi(a | s) = (onehot(a) - pi(. | s)) phi(s)^T``.
    """
    logits = features @ policy.weights.T
    logits -= logits.max(axis=1, keepdims=True)
    probabilities = np.exp(logits)
    probabilities /= probabilities.sum(axis=1, keepdims=True)
    score = -probabilities
    score[np.arange(len(actions)), actions] += 1.0
    return (score * advantages[:, None]).T @ features / len(actions)


def _sample_batch(
    policy: LinearSoftmaxPolicy, task_seeds: Sequence[int], variant: str, group_size: int, rng: np.random.Generator
) -> list[Episode]:
    episodes = []
    for task_seed in task_seeds:
        spec = {"variant": variant, "seed": int(task_seed)}
        for _ in range(group_size):
            episodes.append(run_episode(ServiceEpisode(spec), lambda phi, turn: policy.sample(phi, rng)))
    return episodes


def evaluate(
    policy: LinearSoftmaxPolicy, variant: str, task_seeds: Sequence[int], episodes: int, rng: np.random.Generator
) -> float:
    """Success rate of ``policy`` (sampling) over ``episodes`` rollouts cycling through ``task_seeds``."""
    wins = 0.0
    for k in range(episodes):
        spec = {"variant": variant, "seed": int(task_seeds[k % len(task_seeds)])}
        wins += run_episode(ServiceEpisode(spec), lambda phi, turn: policy.sample(phi, rng)).reward
    return wins / episodes


def train_run(variant: str, arm: str, seed: int, config: LearningConfig) -> RunResult:
    """Train one policy from the prior with one arm's advantage map; see the module doc."""
    started = time.perf_counter()
    task_rng = np.random.default_rng([seed, 1])  # same task sequence in every arm
    policy_rng = np.random.default_rng([seed, 2])
    pool = (seed * 100_003 + np.arange(config.task_pool)).tolist()
    policy = LinearSoftmaxPolicy(prior_weight_matrix())
    optimizer = Adam(policy.weights.shape, config.learning_rate) if config.optimizer == "adam" else None
    credit_map = CreditMap(arm, build_annotator("rules") if arm == "iapo" else None)
    check_rng = np.random.default_rng([seed, 4])
    curve: list[tuple[int, float]] = []
    reached = math.inf
    precision_mass = positive_mass = 0.0
    seen = 0
    while seen < config.budget:
        task_seeds = task_rng.choice(pool, size=config.tasks_per_step, replace=False)
        episodes = _sample_batch(policy, task_seeds, variant, config.group_size, policy_rng)
        rewards = [e.reward for e in episodes]
        seen += len(episodes)
        curve.append((seen, float(np.mean(rewards))))
        scores = torch.tensor(rewards, dtype=torch.float32)
        uids = [str(seed) for seed in np.repeat(task_seeds, config.group_size)]
        advantage, weights = credit_map.weights(episodes, scores, uids)
        action_advantages = [a * w for a, w in zip(advantage, weights, strict=True)]
        for episode, values in zip(episodes, action_advantages, strict=True):
            positive = np.clip(values, 0.0, None)
            positive_mass += float(positive.sum())
            precision_mass += float(positive[np.asarray(episode.causal, dtype=bool)].sum())
        features = np.concatenate([e.features for e in episodes])
        actions = np.concatenate([np.asarray(e.macros) for e in episodes])
        gradient = policy_gradient(policy, features, actions, np.concatenate(action_advantages))
        if optimizer is not None:
            optimizer.step(policy.weights, gradient)
        else:
            policy.weights += config.learning_rate * gradient
        if math.isinf(reached) and evaluate(policy, variant, pool, config.check_episodes, check_rng) >= config.target:
            reached = seen
    eval_rng = np.random.default_rng([seed, 3])
    final = evaluate(policy, variant, pool, config.eval_episodes, eval_rng)
    return RunResult(
        variant=variant,
        arm=arm,
        seed=seed,
        rollouts_to_target=reached,
        final_success=final,
        initial_success=curve[0][1],
        precision_mass=precision_mass,
        positive_mass=positive_mass,
        curve=curve,
        seconds=time.perf_counter() - started,
        annotated=len(credit_map.graphs),
    )


def _run_job(job: tuple[str, str, int, LearningConfig]) -> RunResult:
    torch.set_num_threads(1)
    return train_run(*job)


def run_benchmark(config: LearningConfig, progress: Callable[[RunResult], Any] | None = None) -> list[RunResult]:
    """Every (variant, arm, seed) run, in a pool of ``config.workers`` processes."""
    jobs = [(v, a, s, config) for v in config.variants for s in range(config.seeds) for a in config.arms]
    return map_jobs(_run_job, jobs, config.workers, progress)


# ----------------------------------------------------------------------------------------------
# Summaries
# ----------------------------------------------------------------------------------------------


def summarize_runs(results: Sequence[RunResult], config: LearningConfig) -> dict[str, Any]:
    """Per variant and arm: rollouts-to-target (median, IQR, reached count), final success
    (mean, std), credit precision (pooled over runs), initial success; plus iapo/grpo ratios."""
    summary: dict[str, Any] = {"config": asdict(config), "variants": {}}
    for variant in config.variants:
        arms: dict[str, Any] = {}
        for arm in config.arms:
            runs = [r for r in results if r.variant == variant and r.arm == arm]
            if not runs:
                continue
            arms[arm] = {
                **summarize_learning_runs(runs),
                "credit_precision": float(
                    sum(r.precision_mass for r in runs) / max(sum(r.positive_mass for r in runs), 1e-12)
                ),
            }
        if "grpo" in arms:
            grpo_runs = [r for r in results if r.variant == variant and r.arm == "grpo"]
            for arm in arms:
                if arm != "grpo":
                    runs = [r for r in results if r.variant == variant and r.arm == arm]
                    arms[arm]["p_rollouts_vs_grpo"] = mann_whitney_p(
                        [r.rollouts_to_target for r in runs], [r.rollouts_to_target for r in grpo_runs]
                    )
                    arms[arm]["p_final_vs_grpo"] = mann_whitney_p(
                        [r.final_success for r in runs], [r.final_success for r in grpo_runs]
                    )
        ratio = math.nan
        if "iapo" in arms and "grpo" in arms:
            ratio = _ratio(arms["iapo"]["rollouts_to_target_median"], arms["grpo"]["rollouts_to_target_median"])
        summary["variants"][variant] = {"arms": arms, "iapo_grpo_ratio": ratio}
    return summary


def _ratio(a: float, b: float) -> float:
    if math.isinf(a) and math.isinf(b):
        return math.nan
    if math.isinf(b):
        return 0.0
    if math.isinf(a):
        return math.inf
    return a / b


def format_table(summary: dict[str, Any]) -> str:
    """A text table: one row per (variant, arm)."""
    header = (
        f"{'variant':<13}{'arm':<12}{'to-90% median':>14}{'IQR':>19}{'p vs grpo':>10}{'reached':>9}"
        f"{'final success':>16}{'precision':>11}{'initial':>9}"
    )
    rows = [header, "-" * len(header)]
    for variant, block in summary["variants"].items():
        for arm, s in block["arms"].items():
            iqr = f"[{format_rollouts(s['rollouts_to_target_q25'])}, {format_rollouts(s['rollouts_to_target_q75'])}]"
            p_value = s.get("p_rollouts_vs_grpo")
            p_text = "-" if p_value is None or math.isnan(p_value) else f"{p_value:.2f}"
            rows.append(
                f"{variant:<13}{arm:<12}{format_rollouts(s['rollouts_to_target_median']):>14}{iqr:>19}{p_text:>10}"
                f"{s['reached']:>5}/{s['runs']:<3}{s['final_success_mean']:>10.3f} ± {s['final_success_std']:.3f}"
                f"{s['credit_precision']:>11.3f}{s['initial_success_mean']:>9.3f}"
            )
    return "\n".join(rows)


def plot_curves(results: Sequence[RunResult], config: LearningConfig, path: str | Path) -> Path:
    """Learning curves (median and IQR over seeds of the batch success rate, smoothed over the
    moving window) per variant, one line per arm, as a PNG."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=(5.0 * len(config.variants), 3.8), layout="constrained")
    axes = figure.subplots(1, len(config.variants), squeeze=False)[0]
    colors = {
        "grpo": "#555555",
        "iapo": "#E69F00",
        "call_credit": "#CC79A7",
        "gigpo": "#0072B2",
        "oracle": "#009E73",
        "oracle_pos": "#56B4E9",
    }
    steps_per_window = max(1, config.smooth_updates)
    for ax, variant in zip(axes, config.variants, strict=True):
        for arm in config.arms:
            runs = [r for r in results if r.variant == variant and r.arm == arm]
            if not runs:
                continue
            length = min(len(r.curve) for r in runs)
            x = np.asarray([point[0] for point in runs[0].curve[:length]])
            raw = np.asarray([[point[1] for point in r.curve[:length]] for r in runs])
            span = min(steps_per_window, length)
            kernel = np.ones(span) / span
            smooth = np.asarray([np.convolve(row, kernel, mode="valid") for row in raw])
            xs = x[span - 1 :]
            q25, q50, q75 = np.percentile(smooth, [25, 50, 75], axis=0)
            ax.plot(xs, q50, color=colors.get(arm, None), label=arm, linewidth=1.6)
            ax.fill_between(xs, q25, q75, color=colors.get(arm, None), alpha=0.15)
        ax.axhline(config.target, color="#999999", linestyle=":", linewidth=1)
        ax.set_title(f"{variant} ({config.seeds} seeds)", fontsize=10)
        ax.set_xlabel("training rollouts")
        ax.set_ylabel(f"training success ({config.smooth_updates}-update mean)")
        ax.set_ylim(0, 1.02)
        ax.legend(fontsize=8, frameon=False, loc="lower right")
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(target, dpi=110)
    return target


def results_to_json(results: Sequence[RunResult], summary: dict[str, Any]) -> dict[str, Any]:
    def clean(value: Any) -> Any:
        if isinstance(value, float) and (math.isinf(value) or math.isnan(value)):
            return None if math.isnan(value) else "inf"
        if isinstance(value, dict):
            return {k: clean(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [clean(v) for v in value]
        return value

    runs = [
        {
            **{k: v for k, v in asdict(r).items() if k != "curve"},
            "credit_precision": r.credit_precision,
            "curve": r.curve,
        }
        for r in results
    ]
    return clean({"summary": summary, "runs": runs, "macros": list(MACROS)})


def write_results(results: Sequence[RunResult], summary: dict[str, Any], path: str | Path) -> Path:
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(results_to_json(results, summary), indent=1))
    return target
