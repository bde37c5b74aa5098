"""Typed settings of the credit estimators: one source for every default in DESIGN.md.

The Hydra node ``credit`` (``verl_credit/config/credit_trainer.yaml``) mirrors these dataclasses;
the CLI flags build the same objects. Bad values raise ``ValueError`` naming the key.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from verl_credit.credit.call_credit import CALL_CREDIT_MODES, ROLES
from verl_credit.credit.iapo import NEG_ROUTES

__all__ = ["ESTIMATORS", "CallCreditConfig", "CreditConfig", "IAPOConfig"]

ESTIMATORS: tuple[str, ...] = ("iapo", "call_credit", "grpo")
RV_REWARDS: tuple[str, ...] = ("off", "self_correction", "literal")


@dataclass(frozen=True)
class IAPOConfig:
    """IAPO routing (DESIGN.md section 3)."""

    beta_plus: float = 0.05
    """Tilt of the positive branch away from error-heavy actions (0 = support only)."""
    clip_c: float = 0.25
    """Clip bound of the z-scored features; ``max m / min m <= exp(2 c)``."""
    neg_route: str = "error"
    """Negative-branch weights: ``error`` (w- = m-), ``support`` (w- = m+), ``projected``."""
    beta_minus: float = 0.05
    """Tilt toward error-heavy actions of the ``projected`` negative branch."""
    eps: float = 1e-6
    """Added to the feature std in the z-score."""

    def __post_init__(self) -> None:
        if self.clip_c < 0:
            raise ValueError(f"credit.iapo.clip_c must be >= 0, got {self.clip_c}")
        if self.neg_route not in NEG_ROUTES:
            raise ValueError(f"credit.iapo.neg_route must be one of {NEG_ROUTES}, got {self.neg_route!r}")
        if self.beta_plus < 0:
            raise ValueError(f"credit.iapo.beta_plus must be >= 0, got {self.beta_plus}")
        if self.beta_minus < 0:
            raise ValueError(f"credit.iapo.beta_minus must be >= 0, got {self.beta_minus}")
        if self.eps <= 0:
            raise ValueError(f"credit.iapo.eps must be > 0, got {self.eps}")


@dataclass(frozen=True)
class CallCreditConfig:
    """CALL-CREDIT decomposition (DESIGN.md section 4)."""

    mode: str = "mass_conserving"
    """``mass_conserving`` (w = L s / sum L s) or ``paper`` (A_i = A s_i T)."""
    smoothing: float = 1.0
    """lambda in (deg + lambda); 0 is the seed's literal formula."""
    gamma: float = 0.95
    """Temporal discount gamma^(T - pos)."""
    alpha: float = 0.0
    """Token fusion: alpha * A^GRPO + (1 - alpha) * A^call (0 = pure call credit)."""
    omega: Mapping[str, float] = field(default_factory=lambda: {"AE": 1.0, "IG": 0.6, "RV": 0.4})
    """Role weights omega(r)."""
    rv_reward: str = "off"
    """RV self-correction reward: ``off``, ``self_correction`` (+kappa) or ``literal`` (seed formula)."""
    kappa: float = 0.1
    """Size of the RV self-correction reward."""

    def __post_init__(self) -> None:
        if self.mode not in CALL_CREDIT_MODES:
            raise ValueError(f"credit.call_credit.mode must be one of {CALL_CREDIT_MODES}, got {self.mode!r}")
        if self.smoothing < 0:
            raise ValueError(f"credit.call_credit.smoothing must be >= 0, got {self.smoothing}")
        if not 0 < self.gamma <= 1:
            raise ValueError(f"credit.call_credit.gamma must be in (0, 1], got {self.gamma}")
        if not 0 <= self.alpha <= 1:
            raise ValueError(f"credit.call_credit.alpha must be in [0, 1], got {self.alpha}")
        missing = [role for role in ROLES if role not in self.omega]
        if missing:
            raise ValueError(f"credit.call_credit.omega is missing roles {missing}")
        for role, value in self.omega.items():
            if role not in ROLES:
                raise ValueError(f"credit.call_credit.omega has unknown role {role!r} (roles: {ROLES})")
            if not value > 0:
                raise ValueError(f"credit.call_credit.omega.{role} must be > 0, got {value}")
        if self.rv_reward not in RV_REWARDS:
            raise ValueError(f"credit.call_credit.rv_reward must be one of {RV_REWARDS}, got {self.rv_reward!r}")


@dataclass(frozen=True)
class CreditConfig:
    """Everything the estimators need: which one, GRPO normalization, and each method's knobs."""

    estimator: str = "iapo"
    """``iapo``, ``call_credit`` or ``grpo`` (the reference)."""
    norm_adv_by_std_in_grpo: bool = True
    """Divide by the group std (GRPO) or not (Dr.GRPO); verl's ``algorithm`` key of that name."""
    epsilon: float = 1e-6
    """GRPO's std epsilon (verl's default)."""
    iapo: IAPOConfig = field(default_factory=IAPOConfig)
    call_credit: CallCreditConfig = field(default_factory=CallCreditConfig)

    def __post_init__(self) -> None:
        if self.estimator not in ESTIMATORS:
            raise ValueError(f"credit estimator must be one of {ESTIMATORS}, got {self.estimator!r}")

    @classmethod
    def from_mapping(
        cls, values: Mapping[str, Any] | None = None, *, ignore: Sequence[str] = (), **overrides: Any
    ) -> CreditConfig:
        """Build from a (Hydra) mapping; unknown keys raise ``ValueError`` naming the key.

        ``ignore`` names top-level keys that belong to other consumers (the trainer's ``credit``
        node also holds ``annotator``, ``user``, ``env``, ``layout``).
        """
        merged: dict[str, Any] = {k: v for k, v in dict(values or {}).items() if k not in ignore}
        merged.update(overrides)
        iapo = _build(IAPOConfig, merged.pop("iapo", None) or {}, "credit.iapo")
        call_credit_values = dict(merged.pop("call_credit", None) or {})
        if "omega" in call_credit_values:
            call_credit_values["omega"] = dict(call_credit_values["omega"])
        call_credit = _build(CallCreditConfig, call_credit_values, "credit.call_credit")
        top = {f.name for f in fields(cls)} - {"iapo", "call_credit"}
        unknown = sorted(set(merged) - top)
        if unknown:
            raise ValueError(f"unknown key(s) {', '.join('credit.' + k for k in unknown)}; known: {sorted(top)}")
        return cls(iapo=iapo, call_credit=call_credit, **merged)


def _build(kind: type, values: Mapping[str, Any], prefix: str) -> Any:
    names = {f.name for f in fields(kind)}
    unknown = sorted(set(values) - names)
    if unknown:
        raise ValueError(f"unknown key(s) {', '.join(f'{prefix}.{k}' for k in unknown)}; known: {sorted(names)}")
    return kind(**dict(values))
