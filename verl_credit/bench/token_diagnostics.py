"""Why routed credit does (not) change a token policy's learning: gradient diagnostics.

On batches sampled once from the warm start (the same batches for every arm, so arms differ only
in advantages), per arm:

* ``filler_grad_share``: mean ``||g_filler|| / ||g||``, the part of the batch gradient that comes
  from *filler* tokens (written with probability >= ``filler_p`` by the warm start: the template
  words a policy has already learned), vs *choice* tokens (where it actually decides);
* ``snr``: ``||mean_k g_k||^2 / mean_k ||g_k - mean g||^2`` over the batches;
* ``cos_to_grpo``: mean cosine between the arm's batch gradient and the grpo gradient averaged
  over the *other* batches (leave-one-out): how well one batch points up the expected-reward slope;
* ``choice_adv_mass`` / ``causal_choice_adv_mass``: share of ``sum |A_t|`` on choice tokens, and on
  choice tokens of ground-truth causal actions.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from verl_credit.annotate.factory import build_annotator
from verl_credit.bench.token_policy import (
    TokenBenchConfig,
    TokenCreditMap,
    _causal_token_mask,
    new_policy,
    policy_loss,
    token_advantages,
)
from verl_credit.bench.token_policy_model import pad_batch, sample_episodes, sequence_log_probs

__all__ = ["GradientDiagnostics", "format_diagnostics", "gradient_diagnostics"]


@dataclass
class GradientDiagnostics:
    variant: str
    batches: int
    filler_token_share: float  # written tokens with warm-start probability >= filler_p
    arms: dict[str, dict[str, float]] = field(default_factory=dict)


def _flat_grad(policy: torch.nn.Module, loss: torch.Tensor) -> torch.Tensor:
    policy.zero_grad()
    loss.backward()
    return torch.cat([p.grad.flatten().clone() for p in policy.parameters() if p.grad is not None])


def gradient_diagnostics(
    variant: str,
    config: TokenBenchConfig,
    start: dict[str, torch.Tensor],
    arms: Sequence[str],
    batches: int = 12,
    filler_p: float = 0.99,
    seed: int = 12_345,
) -> GradientDiagnostics:
    """See the module doc. ``arms`` must include ``grpo`` (the reference direction)."""
    torch.set_num_threads(1)
    policy = new_policy(config)
    policy.load_state_dict(start)
    generator = torch.Generator().manual_seed(seed)
    rng = np.random.default_rng(seed)
    maps = {arm: TokenCreditMap(arm, build_annotator("rules") if arm == "iapo" else None) for arm in arms}
    grads: dict[str, list[tuple[torch.Tensor, torch.Tensor]]] = {arm: [] for arm in arms}
    masses: dict[str, list[tuple[float, float]]] = {arm: [] for arm in arms}
    filler_tokens = written_tokens = 0.0
    pool = (seed * 7 + np.arange(config.task_pool)).tolist()
    for _ in range(batches):
        task_seeds = rng.choice(pool, size=config.tasks_per_step, replace=False)
        specs = [{"variant": variant, "seed": int(s)} for s in task_seeds for _ in range(config.group_size)]
        episodes = sample_episodes(policy, specs, generator)
        scores = torch.tensor([e.reward for e in episodes], dtype=torch.float32)
        uids = [str(s) for s in np.repeat(task_seeds, config.group_size)]
        tokens, written, _ = pad_batch(episodes)
        mask = written[:, 1:].float()
        with torch.no_grad():
            old = sequence_log_probs(policy, tokens)
        filler = (old.exp() >= filler_p).float() * mask
        filler_tokens += float(filler.sum())
        written_tokens += float(mask.sum())
        causal = _causal_token_mask(episodes, tokens.shape[1] - 1)
        for arm in arms:
            credit = maps[arm].batch_credit(episodes, scores, uids)
            advantages = token_advantages(credit, episodes, tokens.shape[1] - 1) * mask
            g_all = _flat_grad(policy, policy_loss(policy, tokens, old, advantages, mask, config.clip_ratio))
            g_filler = _flat_grad(
                policy, policy_loss(policy, tokens, old, advantages * filler, mask, config.clip_ratio)
            )
            grads[arm].append((g_all, g_filler))
            absolute = advantages.abs()
            choice = mask - filler
            total = float(absolute.sum())
            masses[arm].append(
                (
                    float((absolute * choice).sum()) / max(total, 1e-12),
                    float((absolute * choice * causal).sum()) / max(total, 1e-12),
                )
            )
    reference = torch.stack([g for g, _ in grads["grpo"]])
    result = GradientDiagnostics(variant, batches, filler_tokens / max(written_tokens, 1.0))
    for arm in arms:
        stack = torch.stack([g for g, _ in grads[arm]])
        mean = stack.mean(0)
        noise = float((stack - mean).square().sum(1).mean())
        cosines = []
        for k in range(batches):
            others = torch.cat([reference[:k], reference[k + 1 :]]).mean(0) if batches > 1 else reference[k]
            cosines.append(float(torch.nn.functional.cosine_similarity(stack[k], others, dim=0)))
        shares = [float(f.norm() / g.norm().clamp_min(1e-12)) for g, f in grads[arm]]
        result.arms[arm] = {
            "filler_grad_share": float(np.mean(shares)),
            "snr": float(mean.square().sum()) / max(noise, 1e-30),
            "cos_to_grpo": float(np.mean(cosines)),
            "choice_adv_mass": float(np.mean([m[0] for m in masses[arm]])),
            "causal_choice_adv_mass": float(np.mean([m[1] for m in masses[arm]])),
        }
    return result


def format_diagnostics(diagnostics: Sequence[GradientDiagnostics]) -> str:
    header = (
        f"{'variant':<13}{'arm':<12}{'filler grad share':>18}{'grad SNR':>10}{'cos to grpo(LOO)':>18}"
        f"{'|A| on choice':>15}{'on causal choice':>18}"
    )
    rows = [header, "-" * len(header)]
    for block in diagnostics:
        for arm, d in block.arms.items():
            rows.append(
                f"{block.variant:<13}{arm:<12}{d['filler_grad_share']:>18.3f}{d['snr']:>10.3f}{d['cos_to_grpo']:>18.3f}"
                f"{d['choice_adv_mass']:>15.3f}{d['causal_choice_adv_mass']:>18.3f}"
            )
        rows.append(f"{block.variant:<13}filler tokens (p >= 0.99): {block.filler_token_share:.3f} of written tokens")
    return "\n".join(rows)
