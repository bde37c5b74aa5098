"""IAPO: graph features -> bounded weights -> sign-conditioned routing (docs/design.md section 3).

Pure tensor functions over a padded batch of trajectories.

Notation:
    B: trajectories in the batch.
    T: the largest number of actions of a trajectory in the batch (shorter rows are padded).
    lengths: ``(B, T)`` trainable tokens ``L_i`` per action; padding actions have length 0.
    L: ``lengths.sum(-1)``, the trainable tokens of a trajectory.

Equations (numbered as cited in the docstrings):

    (1) phi+_i = log(1 + d+_i + din_i)
    (2) phi-_i = log(1 + e_i * (1 + d-_i + din_i))
    (3) mean = (1/L) sum L_i phi_i ;  var = (1/L) sum L_i (phi_i - mean)^2
    (4) z_i = (phi_i - mean) / (sqrt(var) + eps)
    (5) m_i = exp(clip(z_i, -c, c)) / ((1/L) sum_j L_j exp(clip(z_j, -c, c)))
    (6) psi-_i = phi-_i - (1/L) sum_j L_j phi-_j
    (7) w+_i = L m+_i exp(-beta+ psi-_i) / sum_j L_j m+_j exp(-beta+ psi-_j)
    (8) w-_i = m-_i (error) | m+_i (support) |
              L m+_i exp(+beta- psi-_i) / sum_j L_j m+_j exp(+beta- psi-_j) (projected)
    (9) w_i = w+_i if A > 0 ; w-_i if A < 0 ; A_{i,l} = A w_i
        (A = 0: nothing is routed, the advantage is 0; the reported weight is 1)

Zero-length actions take no part in the length-weighted means (their ``L_i`` is 0) and carry
no tokens; their weight is still computed by the same formula so it is always finite and
positive. A trajectory with ``L = 0`` gets weight 1 everywhere.

Exactness of the uniform fallback: when a feature is constant over a trajectory's actions the
centred value ``phi - mean`` is set to exactly 0 (instead of a rounding residue), so ``m = 1`` and
``w = 1`` exactly and the routed advantage equals GRPO's bit-for-bit.
"""

from __future__ import annotations

import math
from typing import Literal

import torch

__all__ = [
    "NEG_ROUTES",
    "compute_bounded_weights",
    "compute_iapo_features",
    "compute_iapo_weights",
    "compute_iapo_weights_reference",
    "compute_support_weights",
    "select_weights_by_sign",
]

NegRoute = Literal["error", "support", "projected"]
NEG_ROUTES: tuple[str, ...] = ("error", "support", "projected")


def compute_iapo_features(
    d_plus: torch.Tensor, d_minus: torch.Tensor, d_in: torch.Tensor, errors: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Equations (1)-(2).

    Args:
        d_plus, d_minus, d_in, errors: ``(B, T)`` out-degree of ``+`` edges, out-degree of ``-``
            edges, in-degree of ``+`` edges plus direct user inputs, error indicator in {0, 1}.

    Returns:
        ``(phi_plus, phi_minus)``, each ``(B, T)``.
    """
    phi_plus = torch.log1p(d_plus + d_in)
    phi_minus = torch.log1p(errors * (1.0 + d_minus + d_in))
    return phi_plus, phi_minus


def _length_weighted_centre(phi: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``phi - mean`` (exactly 0 where ``phi`` is constant over the trajectory's tokens) and ``L``.

    Shapes: ``phi, lengths`` ``(B, T)`` -> ``centred (B, T)``, ``total (B, 1)``.
    """
    total = lengths.sum(dim=-1, keepdim=True)
    safe_total = total.clamp_min(1.0)
    mean = (lengths * phi).sum(dim=-1, keepdim=True) / safe_total
    has_tokens = lengths > 0
    big = torch.finfo(phi.dtype).max
    phi_max = torch.where(has_tokens, phi, -big).amax(dim=-1, keepdim=True)
    phi_min = torch.where(has_tokens, phi, big).amin(dim=-1, keepdim=True)
    constant = phi_max <= phi_min  # also true for rows without tokens
    centred = torch.where(constant, torch.zeros_like(phi), phi - mean)
    return centred, total


def _normalize_mass(scores: torch.Tensor, lengths: torch.Tensor, total: torch.Tensor) -> torch.Tensor:
    """``L * s_i / sum_j L_j s_j`` per row; rows with ``L = 0`` get 1. Shapes ``(B, T)``."""
    mass = (lengths * scores).sum(dim=-1, keepdim=True)
    normalized = total * scores / torch.where(mass > 0, mass, torch.ones_like(mass))
    return torch.where(total > 0, normalized, torch.ones_like(normalized))


def compute_bounded_weights(phi: torch.Tensor, lengths: torch.Tensor, clip_c: float, eps: float = 1e-6) -> torch.Tensor:
    """Equations (3)-(5): length-weighted standardization, clipping, renormalization.

    Args:
        phi: ``(B, T)`` feature per action.
        lengths: ``(B, T)`` trainable tokens per action (0 for padding).
        clip_c: clip bound ``c >= 0`` for the z-score; ``max m / min m <= exp(2c)``.
        eps: added to the std.

    Returns:
        ``m``: ``(B, T)`` positive weights with ``sum_i L_i m_i = L`` per row.
    """
    lengths = lengths.to(phi.dtype)
    centred, total = _length_weighted_centre(phi, lengths)
    variance = (lengths * centred.square()).sum(dim=-1, keepdim=True) / total.clamp_min(1.0)
    z = centred / (variance.sqrt() + eps)
    return _normalize_mass(torch.exp(z.clamp(-clip_c, clip_c)), lengths, total)


def compute_support_weights(
    m_plus: torch.Tensor, phi_minus: torch.Tensor, lengths: torch.Tensor, beta: float
) -> torch.Tensor:
    """Equations (6)-(7): the support prior tilted by the error feature.

    ``beta > 0`` moves mass away from error-heavy actions (``w+``); ``beta < 0`` moves it toward
    them (the projected negative branch uses ``-beta_minus``).

    Shapes: ``m_plus, phi_minus, lengths`` ``(B, T)`` -> ``(B, T)``.
    """
    lengths = lengths.to(m_plus.dtype)
    psi_minus, total = _length_weighted_centre(phi_minus, lengths)
    return _normalize_mass(m_plus * torch.exp(-beta * psi_minus), lengths, total)


def select_weights_by_sign(advantage: torch.Tensor, w_plus: torch.Tensor, w_minus: torch.Tensor) -> torch.Tensor:
    """Equation (9): ``w+`` where ``A > 0``, ``w-`` where ``A < 0``; 1 where ``A = 0`` (``A w = 0``).

    Shapes: ``advantage (B,)``, ``w_plus, w_minus (B, T)`` -> ``(B, T)``.
    """
    sign = advantage.unsqueeze(-1)
    return torch.where(sign > 0, w_plus, torch.where(sign < 0, w_minus, torch.ones_like(w_plus)))


def compute_iapo_weights(
    advantage: torch.Tensor,
    d_plus: torch.Tensor,
    d_minus: torch.Tensor,
    d_in: torch.Tensor,
    errors: torch.Tensor,
    lengths: torch.Tensor,
    beta_plus: float = 0.05,
    clip_c: float = 0.25,
    neg_route: NegRoute = "error",
    beta_minus: float = 0.05,
    eps: float = 1e-6,
) -> dict[str, torch.Tensor]:
    """Equations (1)-(9) for a padded batch.

    Args:
        advantage: ``(B,)`` GRPO trajectory advantage ``A_tau``.
        d_plus, d_minus, d_in, errors, lengths: ``(B, T)`` graph degrees, error indicator and
            trainable tokens per action (padding actions: all 0).
        beta_plus, clip_c, neg_route, beta_minus, eps: docs/design.md section 3 parameters.

    Returns:
        dict of ``(B, T)`` tensors: ``weight`` (the routed ``w``; 1 where ``A = 0``),
        ``w_plus``, ``w_minus``, ``m_plus``, ``m_minus``, ``phi_plus``, ``phi_minus``.
    """
    if neg_route not in NEG_ROUTES:
        raise ValueError(f"neg_route must be one of {NEG_ROUTES}, got {neg_route!r}")
    if clip_c < 0:
        raise ValueError(f"clip_c must be >= 0, got {clip_c}")
    phi_plus, phi_minus = compute_iapo_features(d_plus, d_minus, d_in, errors)
    m_plus = compute_bounded_weights(phi_plus, lengths, clip_c, eps)
    m_minus = compute_bounded_weights(phi_minus, lengths, clip_c, eps)
    w_plus = compute_support_weights(m_plus, phi_minus, lengths, beta_plus)
    if neg_route == "error":
        w_minus = m_minus
    elif neg_route == "support":
        w_minus = m_plus
    else:
        w_minus = compute_support_weights(m_plus, phi_minus, lengths, -beta_minus)
    return {
        "weight": select_weights_by_sign(advantage, w_plus, w_minus),
        "w_plus": w_plus,
        "w_minus": w_minus,
        "m_plus": m_plus,
        "m_minus": m_minus,
        "phi_plus": phi_plus,
        "phi_minus": phi_minus,
    }


def compute_iapo_weights_reference(
    advantage: float,
    d_plus: list[float],
    d_minus: list[float],
    d_in: list[float],
    errors: list[float],
    lengths: list[int],
    beta_plus: float = 0.05,
    clip_c: float = 0.25,
    neg_route: NegRoute = "error",
    beta_minus: float = 0.05,
    eps: float = 1e-6,
) -> list[float]:
    """Slow, literal, one-trajectory version of equations (1)-(9) in plain Python floats.

    Kept next to the batched code and tested against it (like verl's loop/vectorized GRPO pair).
    """
    count = len(lengths)
    total = float(sum(lengths))
    if advantage == 0 or total == 0:
        return [1.0] * count
    phi_plus = [math.log(1 + d_plus[i] + d_in[i]) for i in range(count)]
    phi_minus = [math.log(1 + errors[i] * (1 + d_minus[i] + d_in[i])) for i in range(count)]

    def centre(phi: list[float]) -> list[float]:
        present = [phi[i] for i in range(count) if lengths[i] > 0]
        if max(present) == min(present):
            return [0.0] * count
        mean = sum(lengths[i] * phi[i] for i in range(count)) / total
        return [phi[i] - mean for i in range(count)]

    def bounded(phi: list[float]) -> list[float]:
        centred = centre(phi)
        std = math.sqrt(sum(lengths[i] * centred[i] ** 2 for i in range(count)) / total)
        raw = [math.exp(min(max(centred[i] / (std + eps), -clip_c), clip_c)) for i in range(count)]
        norm = sum(lengths[i] * raw[i] for i in range(count)) / total
        return [value / norm for value in raw]

    def tilt(m: list[float], beta: float) -> list[float]:
        psi = centre(phi_minus)
        raw = [m[i] * math.exp(-beta * psi[i]) for i in range(count)]
        norm = sum(lengths[i] * raw[i] for i in range(count))
        return [total * value / norm for value in raw]

    m_plus = bounded(phi_plus)
    if advantage > 0:
        return tilt(m_plus, beta_plus)
    if neg_route == "error":
        return bounded(phi_minus)
    if neg_route == "support":
        return m_plus
    return tilt(m_plus, -beta_minus)
