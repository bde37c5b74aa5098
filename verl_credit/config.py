"""Typed settings of the credit estimators: one source for every default in docs/design.md.

The Hydra node ``credit`` (``verl_credit/config/credit_trainer.yaml``) mirrors these dataclasses;
the CLI flags build the same objects. Every field declares its type and allowed range
(:mod:`verl_credit.config_rules`); a bad value -- of the wrong type (``'0.5'``, ``'false'``), not
finite, or out of range -- raises ``ValueError`` naming the key and the allowed range.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, is_dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any

from verl_credit.anchor_states import ANCHOR_STATES
from verl_credit.call_graph import ROLES
from verl_credit.config_rules import (
    MAX_COUNT,
    MAX_SECONDS,
    MAX_WEIGHT,
    Choice,
    Number,
    PluginSections,
    Section,
    Switch,
    Text,
    Weights,
    check_fields,
    rule_of,
    setting,
)
from verl_credit.credit_math.call_credit import CALL_CREDIT_MODES
from verl_credit.credit_math.gigpo import GIGPO_MODES
from verl_credit.credit_math.iapo import NEG_ROUTES
from verl_credit.estimators.registry import estimator_names, estimator_sections, get_estimator

if TYPE_CHECKING:
    from verl_credit.estimators.registry import Estimator

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
    "InfoGainConfig",
    "TurnRewardConfig",
    "build_section",
    "credit_keys",
    "mapping_of",
]

RV_REWARDS: tuple[str, ...] = ("off", "self_correction", "literal")

#: the largest IAPO clip bound and tilts: exp(2 c) and exp(beta psi) stay far from overflow
MAX_TILT = 10.0
#: an epsilon added to a std: positive (0 divides by zero) and at most 1
EPS = Number(0.0, 1.0, low_open=True)
#: a discount in (0, 1]
DISCOUNT = Number(0.0, 1.0, low_open=True)
#: a share or mixing weight in [0, 1]
SHARE = Number(0.0, 1.0)
#: a multiplier in (0, 1]
FACTOR = Number(0.0, 1.0, low_open=True)
#: a non-negative weight (at most MAX_WEIGHT)
WEIGHT = Number(0.0, MAX_WEIGHT)


@dataclass(frozen=True)
class IAPOConfig:
    """IAPO routing (docs/design.md section 3)."""

    beta_plus: float = setting(0.05, Number(0.0, MAX_TILT))
    """Tilt of the positive branch away from error-heavy actions (0 = support only)."""
    clip_c: float = setting(0.25, Number(0.0, MAX_TILT))
    """Clip bound of the z-scored features; ``max m / min m <= exp(2 c)``."""
    neg_route: str = setting("error", Choice(NEG_ROUTES))
    """Negative-branch weights: ``error`` (w- = m-), ``support`` (w- = m+), ``projected``."""
    beta_minus: float = setting(0.05, Number(0.0, MAX_TILT))
    """Tilt toward error-heavy actions of the ``projected`` negative branch."""
    eps: float = setting(1e-6, EPS)
    """Added to the feature std in the z-score."""

    def __post_init__(self) -> None:
        check_fields(self, "credit.iapo")


@dataclass(frozen=True)
class CounterfactualConfig:
    """``credit.call_credit.counterfactual``: counterfactual calibration of AE calls (docs/design.md section 4).

    Each step, the ``budget`` AE calls with the largest ``|A_i|`` are replayed through the session's
    environment with the call's tool call replaced (``proposer``); ``Delta_k = R(tau) - R(tau')`` and
    ``w_k <- w_k max(1 + eta sign(A) Delta_k, factor_floor)``, then each trajectory's mass is restored.
    """

    enabled: bool = setting(False, Switch())
    """Switch (needs an environment with ``replay``, e.g. the coding sandbox)."""
    budget: int = setting(4, Number(0, MAX_COUNT, integer=True))
    """K: AE calls replayed per training step (the K largest ``|A_i|`` of the batch)."""
    eta: float = setting(0.5, WEIGHT)
    """Calibration strength."""
    factor_floor: float = setting(1e-3, FACTOR)
    """Lower bound of the calibration factor (keeps every weight positive)."""
    proposer: str = setting("remove", Text())
    """Alternative of the replayed call: ``remove`` (the call is dropped: "what if this edit had not been
    made", model-free), another registered name, or ``package.module:Class``."""
    concurrency: int = setting(4, Number(1, MAX_COUNT, integer=True))
    """Replays run at once (each in its own environment instance)."""
    timeout: float = setting(300.0, Number(0.0, MAX_SECONDS, low_open=True))
    """Seconds per replay; a replay past it counts as a failure."""

    def __post_init__(self) -> None:
        check_fields(self, "credit.call_credit.counterfactual")


@dataclass(frozen=True)
class IGDownweightConfig:
    """``credit.call_credit.ig_downweight``: IG calls whose replay shows ``Delta < theta_ig`` get
    ``w * factor`` (mass restored). The ``budget`` IG calls with the largest ``|A_i|`` are replayed
    per step (same environment, proposer, concurrency and timeout as ``counterfactual``)."""

    enabled: bool = setting(False, Switch())
    """Switch (replays through the environment, as ``counterfactual``: needs ``replay``, e.g. the coding sandbox)."""
    budget: int = setting(4, Number(0, MAX_COUNT, integer=True))
    """IG calls replayed per training step."""
    theta_ig: float = setting(0.5, Number())
    """Threshold on ``Delta = R(tau) - R(tau without the call)``; with 0/1 rewards, 0.5 down-weights
    reads whose removal does not lower the reward."""
    factor: float = setting(0.5, FACTOR)
    """Multiplier of a down-weighted IG call's weight, in (0, 1]."""

    def __post_init__(self) -> None:
        check_fields(self, "credit.call_credit.ig_downweight")


@dataclass(frozen=True)
class AdaptiveOmegaConfig:
    """``credit.call_credit.adaptive_omega``: after each step, omega moves by ``rho`` toward the EMA
    (weight ``ema_beta``) of each role's share of mean ``|A_i|`` (times ``1 + mean Delta`` where
    replays measured one), clipped to ``[omega_min, omega_max]``; the next step uses it."""

    enabled: bool = setting(False, Switch())
    """Switch; the adapted omega is kept in checkpoints (``credit_state.json``)."""
    rho: float = setting(0.1, SHARE)
    """Step of omega toward its target, in [0, 1]."""
    ema_beta: float = setting(0.1, FACTOR)
    """Weight of the newest step in the EMAs, in (0, 1]."""
    omega_min: float = setting(0.1, Number(0.0, MAX_WEIGHT, low_open=True))
    """Lower bound of each adapted role weight."""
    omega_max: float = setting(2.0, Number(0.0, MAX_WEIGHT, low_open=True))
    """Upper bound of each adapted role weight; at least ``omega_min``."""

    def __post_init__(self) -> None:
        prefix = "credit.call_credit.adaptive_omega"
        check_fields(self, prefix)
        if not self.omega_max >= self.omega_min:
            raise ValueError(
                f"{prefix}.omega_max must be >= {prefix}.omega_min ({self.omega_min}), got {self.omega_max}"
            )


@dataclass(frozen=True)
class DPOExportConfig:
    """``credit.call_credit.dpo_export``: append ``(context, original AE, counterfactual AE, Delta)``
    pairs of the counterfactual replays to a JSONL file (``verl_credit.dpo_export``)."""

    path: str | None = setting(None, Text(null="no export"))
    """JSONL file the pairs are appended to (``null``: no export)."""
    theta_ae: float = setting(0.0, Number(0.0))
    """Only pairs with ``|Delta| > theta_ae``."""

    def __post_init__(self) -> None:
        check_fields(self, "credit.call_credit.dpo_export")

    @property
    def enabled(self) -> bool:
        return self.path is not None


@dataclass(frozen=True)
class CallCreditConfig:
    """CALL-CREDIT decomposition (docs/design.md section 4)."""

    mode: str = setting("mass_conserving", Choice(CALL_CREDIT_MODES))
    """``mass_conserving`` (w = L s / sum L s) or ``paper`` (A_i = A s_i T)."""
    smoothing: float = setting(1.0, WEIGHT)
    """lambda in (deg + lambda); 0 is the seed's literal formula."""
    gamma: float = setting(0.95, DISCOUNT)
    """Temporal discount gamma^(T - pos)."""
    alpha: float = setting(0.0, SHARE)
    """Token fusion: alpha * A^GRPO + (1 - alpha) * A^call (0 = pure call credit)."""
    omega: Mapping[str, float] = setting(
        rule=Weights(ROLES, Number(0.0, MAX_WEIGHT, low_open=True)), factory=lambda: {"AE": 1.0, "IG": 0.6, "RV": 0.4}
    )
    """Role weights omega(r)."""
    rv_reward: str = setting("off", Choice(RV_REWARDS))
    """RV self-correction reward: ``off``, ``self_correction`` (+kappa) or ``literal`` (seed formula)."""
    kappa: float = setting(0.1, WEIGHT)
    """Size of the RV self-correction reward."""
    counterfactual: CounterfactualConfig = field(
        default_factory=CounterfactualConfig, metadata={"rule": Section(CounterfactualConfig)}
    )
    ig_downweight: IGDownweightConfig = field(
        default_factory=IGDownweightConfig, metadata={"rule": Section(IGDownweightConfig)}
    )
    adaptive_omega: AdaptiveOmegaConfig = field(
        default_factory=AdaptiveOmegaConfig, metadata={"rule": Section(AdaptiveOmegaConfig)}
    )
    dpo_export: DPOExportConfig = field(default_factory=DPOExportConfig, metadata={"rule": Section(DPOExportConfig)})

    def __post_init__(self) -> None:
        check_fields(self, "credit.call_credit")
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
    def adjustments_enabled(self) -> bool:
        """Whether any optional part other than the RV reward is on."""
        return self.counterfactual.enabled or self.ig_downweight.enabled or self.adaptive_omega.enabled


@dataclass(frozen=True)
class GiGPOConfig:
    """``credit.gigpo``: GiGPO's episode + anchor-state step advantage (docs/design.md section 4b)."""

    step_advantage_w: float = setting(1.0, WEIGHT)
    """Weight of the step advantage ``A^S`` added to the episode advantage."""
    gamma: float = setting(0.95, DISCOUNT)
    """Discount of the step return ``R_i = gamma^(T-1-i) R``."""
    mode: str = setting("mean_norm", Choice(GIGPO_MODES))
    """``mean_norm`` (``R_i - mean``) or ``mean_std_norm`` (divided by ``std + eps``)."""
    state: str = setting("prefix", Choice(ANCHOR_STATES))
    """Anchor state: ``prefix`` (the whole message prefix) or ``last_observation``."""
    eps: float = setting(1e-6, EPS)
    """Added to the anchor group's std in ``mean_std_norm``."""

    def __post_init__(self) -> None:
        check_fields(self, "credit.gigpo")


@dataclass(frozen=True)
class TurnRewardConfig:
    """``credit.turn_reward``: per-turn environment rewards with a leave-one-out baseline (docs/design.md 4b)."""

    lambda_turn: float = setting(1.0, WEIGHT)
    """Weight of ``G_i - b_i`` added to the outcome advantage."""
    gamma: float = setting(1.0, DISCOUNT)
    """Discount of the turn return ``G_i = sum_{k >= i} gamma^(k-i) r_k``."""

    def __post_init__(self) -> None:
        check_fields(self, "credit.turn_reward")


@dataclass(frozen=True)
class InfoGainConfig:
    """``credit.info_gain``: InfoPO's turn-level information gain fused with GRPO's advantage
    (``verl_credit.credit_math.info_gain``; the defaults are the authors' tau2 recipe)."""

    weight: float = setting(0.1, WEIGHT)
    """beta: weight of the gated, normalized information-gain advantage (their ``intrinsic_weight``)."""
    gate_temperature: float = setting(0.05, Number(0.0, MAX_WEIGHT, low_open=True))
    """T_gate of ``sigmoid(-std of the group's rewards / T_gate)`` (their ``intrinsic_gate_temperature``)."""
    normalize: bool = setting(True, Switch())
    """Centre (and scale) the gains within each group (their ``normalize_intrinsic``)."""
    placeholder: str = setting("No information found.", Text(), trainer_only=True)
    """Text whose tokens overwrite the feedback in the masked forward pass (their ``observation_placeholder``)."""
    eps: float = setting(1e-6, EPS)
    """Added to the stds of the group normalization and of the magnitude ratio."""

    def __post_init__(self) -> None:
        check_fields(self, "credit.info_gain")
        if not self.placeholder.strip():
            raise ValueError(f"credit.info_gain.placeholder must be a non-blank string, got {self.placeholder!r}")


@dataclass(frozen=True)
class CreditConfig:
    """Everything the estimators need: which one, GRPO normalization, and each method's knobs.

    The built-in estimators' sections are fields (``config.iapo``, ``config.call_credit`` ...); a
    plug-in estimator's section is in :attr:`plugin_sections`. Both are read with
    :meth:`section` (an estimator reads its own with ``Estimator.settings_of``).
    """

    estimator: str = setting("iapo", Choice(estimator_names))
    """A registered estimator (``verl_credit.estimators``): ``iapo``, ``call_credit``, ``gigpo``,
    ``turn_reward``, ``info_gain`` or ``grpo`` (the reference)."""
    norm_adv_by_std_in_grpo: bool = setting(True, Switch())
    """Divide by the group std (GRPO) or not (Dr.GRPO); verl's ``algorithm`` key of that name."""
    epsilon: float = setting(1e-6, EPS)
    """GRPO's std epsilon (verl's default); > 0 (0 divides a constant group by zero)."""
    iapo: IAPOConfig = field(default_factory=IAPOConfig, metadata={"rule": Section(IAPOConfig)})
    call_credit: CallCreditConfig = field(
        default_factory=CallCreditConfig, metadata={"rule": Section(CallCreditConfig)}
    )
    gigpo: GiGPOConfig = field(default_factory=GiGPOConfig, metadata={"rule": Section(GiGPOConfig)})
    turn_reward: TurnRewardConfig = field(
        default_factory=TurnRewardConfig, metadata={"rule": Section(TurnRewardConfig)}
    )
    info_gain: InfoGainConfig = field(default_factory=InfoGainConfig, metadata={"rule": Section(InfoGainConfig)})
    plugin_sections: Mapping[str, Any] = field(
        default_factory=dict, metadata={"rule": PluginSections(estimator_sections)}
    )
    """Internal: the sections of plug-in estimators (``credit.<section>`` keys of the mapping), by name."""

    def __post_init__(self) -> None:
        if rule_of(CreditConfig, "estimator").problem(self.estimator):
            raise ValueError(
                f"credit estimator must be one of {estimator_names()}, got {self.estimator!r} (key credit.estimator, "
                "which follows algorithm.adv_estimator)"
            )
        check_fields(self, "credit")

    def section(self, name: str) -> Any:
        """The settings of section ``credit.<name>`` (a plug-in's not given: its defaults)."""
        if name in _FIELD_SECTIONS:
            return getattr(self, name)
        if name in self.plugin_sections:
            return self.plugin_sections[name]
        kind = estimator_sections().get(name)
        if kind is None:
            raise ValueError(f"no settings section credit.{name}; sections: {sorted(estimator_sections())}")
        return kind()

    @cached_property
    def registered_estimator(self) -> Estimator:
        """The :class:`~verl_credit.estimators.registry.Estimator` of :attr:`estimator`, looked up
        once per config (a step resolves it once)."""
        return get_estimator(self.estimator)

    def to_mapping(self) -> dict[str, Any]:
        """The ``credit`` mapping :meth:`from_mapping` reads back (plug-in sections at the top level)."""
        values = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "plugin_sections"}
        values.update(self.plugin_sections)
        return {name: asdict(value) if is_dataclass(value) else value for name, value in values.items()}

    @classmethod
    def from_mapping(
        cls, values: Mapping[str, Any] | None = None, *, ignore: Sequence[str] = (), **overrides: Any
    ) -> CreditConfig:
        """Build from a (Hydra) mapping; unknown keys raise ``ValueError`` naming the key.

        Each registered estimator's section (``Estimator.settings``) is read from ``credit.<section>``
        (its nested sections too); ``ignore`` names top-level keys that belong to other consumers
        (the trainer's ``credit`` node also holds ``annotator``, ``user``, ``env``, ``layout``).
        """
        merged: dict[str, Any] = {k: v for k, v in mapping_of(values, "credit").items() if k not in ignore}
        merged.update(overrides)
        built = {
            name: value if isinstance(value, kind) else build_section(kind, value, f"credit.{name}")
            for name, kind in estimator_sections().items()
            if (value := merged.pop(name, None)) is not None or name in _FIELD_SECTIONS
        }
        sections = {name: value for name, value in built.items() if name in _FIELD_SECTIONS}
        plugin_sections = {name: value for name, value in built.items() if name not in _FIELD_SECTIONS}
        top = {f.name for f in fields(cls)} - {*_FIELD_SECTIONS, "plugin_sections"}
        unknown = sorted(set(merged) - top)
        if unknown:
            known = sorted(top | set(estimator_sections()))
            raise ValueError(f"unknown key(s) {', '.join('credit.' + k for k in unknown)}; known: {known}")
        return cls(**sections, **merged, plugin_sections=plugin_sections)


#: the estimator sections that are fields of :class:`CreditConfig` (the built-in estimators')
_FIELD_SECTIONS: frozenset[str] = frozenset(
    f.name for f in fields(CreditConfig) if isinstance(f.metadata.get("rule"), Section)
)


def credit_keys() -> tuple[str, ...]:
    """The top-level keys of the ``credit`` math: the scalars and every registered section."""
    scalars = [f.name for f in fields(CreditConfig) if not isinstance(f.metadata.get("rule"), Section | PluginSections)]
    return (*scalars, *estimator_sections())


def mapping_of(value: Any, key: str) -> dict[str, Any]:
    """``value`` as a dict (``None``: empty); anything but a mapping raises ``ValueError`` naming ``key``."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ValueError(f"{key} must be a mapping, got {value!r}")
    return dict(value)


def build_section(kind: type, values: Mapping[str, Any] | None, prefix: str) -> Any:
    """``kind(**values)`` for a config dataclass; unknown keys raise ``ValueError`` naming ``prefix.key``.

    A nested section given as a mapping is built the same way (``prefix.name``); a weight table
    (``Weights``) given as a mapping becomes a dict.
    """
    values = mapping_of(values, prefix)
    names = {f.name for f in fields(kind)}
    unknown = sorted(set(values) - names, key=str)
    if unknown:
        raise ValueError(f"unknown key(s) {', '.join(f'{prefix}.{k}' for k in unknown)}; known: {sorted(names)}")
    for item in fields(kind):
        rule = item.metadata.get("rule")
        value = values.get(item.name)
        if isinstance(rule, Section) and item.name in values and not isinstance(value, rule.kind):
            values[item.name] = build_section(rule.kind, value, f"{prefix}.{item.name}")
        elif isinstance(rule, Weights) and isinstance(value, Mapping):
            values[item.name] = dict(value)
    return kind(**values)
