"""Typed settings of the credit estimators: one source for every default in DESIGN.md.

The Hydra node ``credit`` (``verl_credit/config/credit_trainer.yaml``) mirrors these dataclasses;
the CLI flags build the same objects. Bad values raise ``ValueError`` naming the key.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from verl_credit.anchor_states import ANCHOR_STATES
from verl_credit.credit.call_credit import CALL_CREDIT_MODES, ROLES
from verl_credit.credit.gigpo import GIGPO_MODES
from verl_credit.credit.iapo import NEG_ROUTES
from verl_credit.estimators.registry import estimator_names

__all__ = [
    "RV_REWARDS",
    "AdaptiveOmegaConfig",
    "CallCreditConfig",
    "CounterfactualConfig",
    "CreditConfig",
    "DPOExportConfig",
    "GiGPOConfig",
    "IAPOConfig",
    "IGDownweightConfig",
    "TurnRewardConfig",
]

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
        _check_finite_fields(self, "credit.iapo")
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
class CounterfactualConfig:
    """``credit.call_credit.counterfactual``: counterfactual calibration of AE calls (DESIGN.md section 4).

    Each step, the ``budget`` AE calls with the largest ``|A_i|`` are replayed through the session's
    environment with the call's tool call replaced (``proposer``); ``Delta_k = R(tau) - R(tau')`` and
    ``w_k <- w_k max(1 + eta sign(A) Delta_k, factor_floor)``, then each trajectory's mass is restored.
    """

    enabled: bool = False
    """Switch (needs an environment with ``replay``, e.g. the coding sandbox)."""
    budget: int = 4
    """K: AE calls replayed per training step (the K largest ``|A_i|`` of the batch)."""
    eta: float = 0.5
    """Calibration strength."""
    factor_floor: float = 1e-3
    """Lower bound of the calibration factor (keeps every weight positive)."""
    proposer: str = "remove"
    """Alternative of the replayed call: ``remove`` (the call is dropped: "what if this edit had not been
    made", model-free), another registered name, or ``package.module:Class``."""
    concurrency: int = 4
    """Replays run at once (each in its own environment instance)."""
    timeout: float = 300.0
    """Seconds per replay; a replay past it counts as a failure."""

    def __post_init__(self) -> None:
        prefix = "credit.call_credit.counterfactual"
        _check_finite_fields(self, prefix)
        _check_switch(self.enabled, f"{prefix}.enabled")
        _check_count(self.budget, f"{prefix}.budget")
        _check_count(self.concurrency, f"{prefix}.concurrency")
        if self.budget < 0:
            raise ValueError(f"{prefix}.budget must be >= 0, got {self.budget}")
        if self.eta < 0:
            raise ValueError(f"{prefix}.eta must be >= 0, got {self.eta}")
        if not 0 < self.factor_floor <= 1:
            raise ValueError(f"{prefix}.factor_floor must be in (0, 1], got {self.factor_floor}")
        if not isinstance(self.proposer, str) or not self.proposer:
            raise ValueError(f"{prefix}.proposer must be a proposer name, got {self.proposer!r}")
        if self.concurrency < 1:
            raise ValueError(f"{prefix}.concurrency must be >= 1, got {self.concurrency}")
        if not self.timeout > 0:
            raise ValueError(f"{prefix}.timeout must be > 0, got {self.timeout}")


@dataclass(frozen=True)
class IGDownweightConfig:
    """``credit.call_credit.ig_downweight``: IG calls whose replay shows ``Delta < theta_ig`` get
    ``w * factor`` (mass restored). The ``budget`` IG calls with the largest ``|A_i|`` are replayed
    per step (same environment, proposer, concurrency and timeout as ``counterfactual``)."""

    enabled: bool = False
    budget: int = 4
    """IG calls replayed per training step."""
    theta_ig: float = 0.5
    """Threshold on ``Delta = R(tau) - R(tau without the call)``; with 0/1 rewards, 0.5 down-weights
    reads whose removal does not lower the reward."""
    factor: float = 0.5
    """Multiplier of a down-weighted IG call's weight, in (0, 1]."""

    def __post_init__(self) -> None:
        prefix = "credit.call_credit.ig_downweight"
        _check_finite_fields(self, prefix)
        _check_switch(self.enabled, f"{prefix}.enabled")
        _check_count(self.budget, f"{prefix}.budget")
        if self.budget < 0:
            raise ValueError(f"{prefix}.budget must be >= 0, got {self.budget}")
        if not 0 < self.factor <= 1:
            raise ValueError(f"{prefix}.factor must be in (0, 1], got {self.factor}")


@dataclass(frozen=True)
class AdaptiveOmegaConfig:
    """``credit.call_credit.adaptive_omega``: after each step, omega moves by ``rho`` toward the EMA
    (weight ``ema_beta``) of each role's share of mean ``|A_i|`` (times ``1 + mean Delta`` where
    replays measured one), clipped to ``[omega_min, omega_max]``; the next step uses it."""

    enabled: bool = False
    rho: float = 0.1
    """Step of omega toward its target, in [0, 1]."""
    ema_beta: float = 0.1
    """Weight of the newest step in the EMAs, in (0, 1]."""
    omega_min: float = 0.1
    omega_max: float = 2.0

    def __post_init__(self) -> None:
        prefix = "credit.call_credit.adaptive_omega"
        _check_finite_fields(self, prefix)
        _check_switch(self.enabled, f"{prefix}.enabled")
        if not 0 <= self.rho <= 1:
            raise ValueError(f"{prefix}.rho must be in [0, 1], got {self.rho}")
        if not 0 < self.ema_beta <= 1:
            raise ValueError(f"{prefix}.ema_beta must be in (0, 1], got {self.ema_beta}")
        if not self.omega_min > 0:
            raise ValueError(f"{prefix}.omega_min must be > 0, got {self.omega_min}")
        if not self.omega_max >= self.omega_min:
            raise ValueError(
                f"{prefix}.omega_max must be >= {prefix}.omega_min ({self.omega_min}), got {self.omega_max}"
            )


@dataclass(frozen=True)
class DPOExportConfig:
    """``credit.call_credit.dpo_export``: append ``(context, original AE, counterfactual AE, Delta)``
    pairs of the counterfactual replays to a JSONL file (``verl_credit.dpo_export``)."""

    path: str | None = None
    """JSONL file the pairs are appended to (``null``: no export)."""
    theta_ae: float = 0.0
    """Only pairs with ``|Delta| > theta_ae``."""

    def __post_init__(self) -> None:
        prefix = "credit.call_credit.dpo_export"
        _check_finite_fields(self, prefix)
        if self.path is not None and (not isinstance(self.path, str) or not self.path):
            raise ValueError(f"{prefix}.path must be a file path or null, got {self.path!r}")
        if self.theta_ae < 0:
            raise ValueError(f"{prefix}.theta_ae must be >= 0, got {self.theta_ae}")

    @property
    def enabled(self) -> bool:
        return self.path is not None


#: the optional parts of CALL-CREDIT: sub-node name -> its settings class
CALL_CREDIT_PARTS: dict[str, type] = {
    "counterfactual": CounterfactualConfig,
    "ig_downweight": IGDownweightConfig,
    "adaptive_omega": AdaptiveOmegaConfig,
    "dpo_export": DPOExportConfig,
}


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
    counterfactual: CounterfactualConfig = field(default_factory=CounterfactualConfig)
    ig_downweight: IGDownweightConfig = field(default_factory=IGDownweightConfig)
    adaptive_omega: AdaptiveOmegaConfig = field(default_factory=AdaptiveOmegaConfig)
    dpo_export: DPOExportConfig = field(default_factory=DPOExportConfig)

    def __post_init__(self) -> None:
        _check_finite_fields(self, "credit.call_credit")
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
            _check_finite(value, f"credit.call_credit.omega.{role}")
            if not value > 0:
                raise ValueError(f"credit.call_credit.omega.{role} must be > 0, got {value}")
        if self.rv_reward not in RV_REWARDS:
            raise ValueError(f"credit.call_credit.rv_reward must be one of {RV_REWARDS}, got {self.rv_reward!r}")
        for name, kind in CALL_CREDIT_PARTS.items():
            if not isinstance(getattr(self, name), kind):
                raise ValueError(f"credit.call_credit.{name} must be a {kind.__name__}, got {getattr(self, name)!r}")
        if self.dpo_export.enabled and not self.counterfactual.enabled:
            raise ValueError(
                "credit.call_credit.dpo_export.path needs credit.call_credit.counterfactual.enabled=true "
                "(the pairs come from its replays)"
            )

    @property
    def needs_replay(self) -> bool:
        """Whether a step replays calls (counterfactual calibration or IG down-weighting)."""
        return (self.counterfactual.enabled and self.counterfactual.budget > 0) or (
            self.ig_downweight.enabled and self.ig_downweight.budget > 0
        )

    @property
    def extras_enabled(self) -> bool:
        """Whether any optional part other than the RV reward is on."""
        return self.counterfactual.enabled or self.ig_downweight.enabled or self.adaptive_omega.enabled


@dataclass(frozen=True)
class GiGPOConfig:
    """``credit.gigpo``: GiGPO's episode + anchor-state step advantage (DESIGN.md section 4b)."""

    step_advantage_w: float = 1.0
    """Weight of the step advantage ``A^S`` added to the episode advantage."""
    gamma: float = 0.95
    """Discount of the step return ``R_i = gamma^(T-1-i) R``."""
    mode: str = "mean_norm"
    """``mean_norm`` (``R_i - mean``) or ``mean_std_norm`` (divided by ``std + eps``)."""
    state: str = "prefix"
    """Anchor state: ``prefix`` (the whole message prefix) or ``last_observation``."""
    eps: float = 1e-6
    """Added to the anchor group's std in ``mean_std_norm``."""

    def __post_init__(self) -> None:
        _check_finite_fields(self, "credit.gigpo")
        if self.mode not in GIGPO_MODES:
            raise ValueError(f"credit.gigpo.mode must be one of {GIGPO_MODES}, got {self.mode!r}")
        if self.state not in ANCHOR_STATES:
            raise ValueError(f"credit.gigpo.state must be one of {ANCHOR_STATES}, got {self.state!r}")
        if not 0 < self.gamma <= 1:
            raise ValueError(f"credit.gigpo.gamma must be in (0, 1], got {self.gamma}")
        if self.step_advantage_w < 0:
            raise ValueError(f"credit.gigpo.step_advantage_w must be >= 0, got {self.step_advantage_w}")
        if self.eps <= 0:
            raise ValueError(f"credit.gigpo.eps must be > 0, got {self.eps}")


@dataclass(frozen=True)
class TurnRewardConfig:
    """``credit.turn_reward``: per-turn environment rewards with a leave-one-out baseline (DESIGN 4b)."""

    lambda_turn: float = 1.0
    """Weight of ``G_i - b_i`` added to the outcome advantage."""
    gamma: float = 1.0
    """Discount of the turn return ``G_i = sum_{k >= i} gamma^(k-i) r_k``."""

    def __post_init__(self) -> None:
        _check_finite_fields(self, "credit.turn_reward")
        if self.lambda_turn < 0:
            raise ValueError(f"credit.turn_reward.lambda_turn must be >= 0, got {self.lambda_turn}")
        if not 0 < self.gamma <= 1:
            raise ValueError(f"credit.turn_reward.gamma must be in (0, 1], got {self.gamma}")


#: the plain (one-level) estimator sections of ``credit``: key -> settings class
SECTIONS: dict[str, type] = {"iapo": IAPOConfig, "gigpo": GiGPOConfig, "turn_reward": TurnRewardConfig}


@dataclass(frozen=True)
class CreditConfig:
    """Everything the estimators need: which one, GRPO normalization, and each method's knobs."""

    estimator: str = "iapo"
    """A registered estimator (``verl_credit.estimators``): ``iapo``, ``call_credit``, ``gigpo``,
    ``turn_reward`` or ``grpo`` (the reference)."""
    norm_adv_by_std_in_grpo: bool = True
    """Divide by the group std (GRPO) or not (Dr.GRPO); verl's ``algorithm`` key of that name."""
    epsilon: float = 1e-6
    """GRPO's std epsilon (verl's default)."""
    iapo: IAPOConfig = field(default_factory=IAPOConfig)
    call_credit: CallCreditConfig = field(default_factory=CallCreditConfig)
    gigpo: GiGPOConfig = field(default_factory=GiGPOConfig)
    turn_reward: TurnRewardConfig = field(default_factory=TurnRewardConfig)

    def __post_init__(self) -> None:
        _check_finite_fields(self, "credit")
        names = estimator_names()
        if self.estimator not in names:
            raise ValueError(f"credit estimator must be one of {names}, got {self.estimator!r}")

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
        sections = {
            name: build_section(kind, merged.pop(name, None) or {}, f"credit.{name}") for name, kind in SECTIONS.items()
        }
        call_credit_values = dict(merged.pop("call_credit", None) or {})
        if "omega" in call_credit_values:
            call_credit_values["omega"] = dict(call_credit_values["omega"])
        for name, kind in CALL_CREDIT_PARTS.items():
            if name in call_credit_values:
                part = call_credit_values[name]
                if not isinstance(part, kind):
                    if part is not None and not isinstance(part, Mapping):
                        raise ValueError(f"credit.call_credit.{name} must be a mapping, got {part!r}")
                    call_credit_values[name] = build_section(kind, part or {}, f"credit.call_credit.{name}")
        call_credit = build_section(CallCreditConfig, call_credit_values, "credit.call_credit")
        top = {f.name for f in fields(cls)} - {"call_credit", *SECTIONS}
        unknown = sorted(set(merged) - top)
        if unknown:
            raise ValueError(f"unknown key(s) {', '.join('credit.' + k for k in unknown)}; known: {sorted(top)}")
        return cls(call_credit=call_credit, **sections, **merged)


def _check_finite(value: Any, key: str) -> None:
    """A number must be finite: NaN passes no comparison check and inf passes many (``>= 0``)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return
    if not math.isfinite(value):
        raise ValueError(f"{key} must be a finite number, got {value}")


def _check_finite_fields(section: Any, prefix: str) -> None:
    """:func:`_check_finite` on every numeric field of a config dataclass, naming ``prefix.field``."""
    for item in fields(section):
        _check_finite(getattr(section, item.name), f"{prefix}.{item.name}")


def _check_switch(value: Any, key: str) -> None:
    if not isinstance(value, bool):
        raise ValueError(f"{key} must be true or false, got {value!r}")


def _check_count(value: Any, key: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{key} must be an integer, got {value!r}")


def build_section(kind: type, values: Mapping[str, Any], prefix: str) -> Any:
    """``kind(**values)`` for a config dataclass; unknown keys raise ``ValueError`` naming ``prefix.key``."""
    names = {f.name for f in fields(kind)}
    unknown = sorted(set(values) - names)
    if unknown:
        raise ValueError(f"unknown key(s) {', '.join(f'{prefix}.{k}' for k in unknown)}; known: {sorted(names)}")
    return kind(**dict(values))
