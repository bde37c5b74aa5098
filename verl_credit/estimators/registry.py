"""The estimator registry: one :class:`Estimator` per ``algorithm.adv_estimator`` name.

Every consumer (``batch_credit``, the offline pipeline, the agent loop, the trainer, the metrics, the
CLI's ``--estimator`` choices and flags, the trainer's settings) asks this registry; none branches
on an estimator's name. An estimator declares its whole contract:

* :attr:`Estimator.needs`: what it needs from a finished rollout (:data:`NEEDS`; every consumer
  gathers them through one function, :func:`verl_credit.estimators.needs.gather_needs`);
* :attr:`Estimator.settings`: its settings section, a dataclass of ``config_rules.setting``
  fields (defaults, ranges); the trainer's ``credit.<section>.<key>`` keys and the CLI's flags
  are derived from it;
* :meth:`Estimator.action_credit`: how it turns the trajectory advantages and those inputs into
  per-action credit;
* optional hooks: :meth:`Estimator.post_process_tokens` (token values after routing, e.g.
  CALL-CREDIT's alpha fusion and RV reward; ``verl-credit route`` runs it too).

Adding one is one module under
``verl_credit/estimators/`` that subclasses :class:`Estimator` and is decorated with
:func:`register_estimator`. Built-in ones are listed in :data:`BUILTIN_MODULES`; a third-party
package plugs one in through the Python entry-point group :data:`ENTRY_POINT_GROUP` (the way
verl-credit itself plugs into verl), and a ``package.module`` named in ``VERL_CREDIT_ESTIMATORS`` is
imported too. All three are loaded on first use of the registry, in every process (Ray workers
included), so an installed plug-in needs no edit to verl-credit's files.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import types
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import metadata
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

import torch

if TYPE_CHECKING:
    from verl_credit.call_graph import CallGraph
    from verl_credit.config import CreditConfig
    from verl_credit.graph import InfluenceGraph

__all__ = [
    "BUILTIN_MODULES",
    "ENTRY_POINT_GROUP",
    "NEEDS",
    "RESERVED_KEYS",
    "ActionCredit",
    "Estimator",
    "EstimatorInputs",
    "EstimatorPluginError",
    "TokenLayout",
    "estimator_names",
    "estimator_sections",
    "get_estimator",
    "register_estimator",
]

#: what an estimator may need from a finished rollout, in the order they are gathered (a provider
#: may use what an earlier one made: ``rv_statuses`` come from the same classifier pass as
#: ``call_graphs``). ``rv_statuses``: each call's verification outcome (``"pass"``/``"fail"``/None);
#: ``information_gains``: per-action teacher-forced information gains, from the trainer's extra
#: forward passes or a rollouts file
NEEDS: tuple[str, ...] = (
    "influence_graphs",
    "call_graphs",
    "rv_statuses",
    "anchor_states",
    "turn_rewards",
    "information_gains",
)
#: keys of the trainer's ``credit`` node that are not an estimator's section (an estimator's
#: ``section`` may not be one of them)
RESERVED_KEYS: frozenset[str] = frozenset(
    {"estimator", "norm_adv_by_std_in_grpo", "epsilon", "layout", "annotator", "user", "env", "debug", "viz", "session"}
)
#: the estimators shipped with verl-credit, imported on first use of the registry
BUILTIN_MODULES: tuple[str, ...] = (
    "verl_credit.estimators.grpo",
    "verl_credit.estimators.iapo",
    "verl_credit.estimators.call_credit",
    "verl_credit.estimators.gigpo",
    "verl_credit.estimators.turn_reward",
    "verl_credit.estimators.info_gain",
)
_ENV_MODULES = "VERL_CREDIT_ESTIMATORS"
#: the entry-point group a third-party package declares its estimators in, e.g. in pyproject.toml:
#: ``[project.entry-points."verl_credit.estimators"] recency = "mypackage.recency"`` (a module whose
#: import registers it) or ``"mypackage.recency:RecencyCredit"`` (an :class:`Estimator` subclass)
ENTRY_POINT_GROUP = "verl_credit.estimators"


@dataclass
class EstimatorInputs:
    """What a batch of B trajectories brings to an estimator (each list has B entries; None when
    no registered need asked for it)."""

    uids: Sequence[Any]
    scores: torch.Tensor  # (B,) outcome rewards
    graphs: Sequence[InfluenceGraph] | None = None
    call_graphs: Sequence[CallGraph] | None = None
    anchor_states: Sequence[Sequence[str]] | None = None
    turn_rewards: Sequence[Sequence[float] | None] | None = None
    information_gains: Sequence[Sequence[float | None] | None] | None = None
    rv_statuses: Sequence[Sequence[str | None]] | None = None


@dataclass(frozen=True)
class TokenLayout:
    """Where the actions of a batch's trajectories sit in its training rows.

    ``row_trajectory``: ``(rows,)`` long, the trajectory of each row; ``span_action``,
    ``span_start``, ``span_end``: ``(rows, S)`` long spans (padding: action -1, start = end = 0;
    see ``credit.tokens``); ``response_length``: R.
    """

    row_trajectory: torch.Tensor
    span_action: torch.Tensor
    span_start: torch.Tensor
    span_end: torch.Tensor
    response_length: int

    @classmethod
    def one_token_per_action(cls, num_actions: torch.Tensor) -> TokenLayout:
        """Row ``b`` is trajectory ``b`` with action ``i`` on token ``i``: the token values of this
        layout are the per-action values (what ``verl-credit route`` writes)."""
        rows = int(num_actions.shape[0])
        width = max(int(num_actions.max()) if rows else 0, 1)
        positions = torch.arange(width).unsqueeze(0).expand(rows, width)
        present = positions < num_actions.unsqueeze(1)
        return cls(
            row_trajectory=torch.arange(rows, dtype=torch.long),
            span_action=torch.where(present, positions, torch.full_like(positions, -1)),
            span_start=torch.where(present, positions, torch.zeros_like(positions)),
            span_end=torch.where(present, positions + 1, torch.zeros_like(positions)),
            response_length=width,
        )


@dataclass
class ActionCredit:
    """Per-action credit of a batch, ``(B, T)`` float64 tensors.

    ``weight`` is the routed ``w`` (multiplicative estimators: the action's advantage is
    ``A_tau * w``). Additive estimators (``gigpo``, ``turn_reward``) give ``action_advantage``
    itself and ``weight`` 1 on real actions.
    """

    weight: torch.Tensor
    action_advantage: torch.Tensor | None = None
    extras: dict[str, torch.Tensor] = field(default_factory=dict)


class Estimator:
    """One advantage estimator. Subclasses set :attr:`name` and :attr:`needs`, optionally
    :attr:`settings` (and :attr:`section`), and implement :meth:`action_credit` (pure tensor math,
    through ``verl_credit.credit_math``)."""

    name: ClassVar[str] = ""
    needs: ClassVar[frozenset[str]] = frozenset()
    #: its settings section: a frozen dataclass whose fields are ``config_rules.setting``s (default
    #: and rule); read with :meth:`settings_of`. The trainer's keys are ``credit.<section>.<field>``,
    #: the CLI's flags ``--<section>-<field>`` (``_`` -> ``-``). None: no settings of its own
    settings: ClassVar[type | None] = None
    #: the name of its section under ``credit`` (default: :attr:`name`); estimators that share one
    #: (same dataclass) read the same keys
    section: ClassVar[str] = ""
    #: whether the influence-graph metrics (edges per action, error rate) describe its credit
    routes_influence_graphs: ClassVar[bool] = False
    #: whether a group's credit depends on the other groups of the batch (batch-level statistics):
    #: then ``verl-credit route`` routes a file as one batch instead of group by group
    couples_groups: ClassVar[bool] = False

    def trajectory_advantage(self, scores: torch.Tensor, index: Sequence[Any], config: CreditConfig) -> torch.Tensor:
        """``(B,)`` ``A_tau``: GRPO's group-normalized advantage (``credit.norm_adv_by_std_in_grpo``,
        ``credit.epsilon``), in ``scores``' dtype."""
        from verl_credit.credit_math.grpo import compute_grpo_trajectory_advantage

        return compute_grpo_trajectory_advantage(
            scores, index, epsilon=config.epsilon, norm_adv_by_std_in_grpo=config.norm_adv_by_std_in_grpo
        )

    def action_credit(
        self,
        advantage: torch.Tensor,
        lengths: torch.Tensor,
        valid: torch.Tensor,
        inputs: EstimatorInputs,
        config: CreditConfig,
    ) -> ActionCredit:
        """Per-action credit.

        Args:
            advantage: ``(B,)`` float64 GRPO trajectory advantage ``A_tau``.
            lengths: ``(B, T)`` float64 trainable tokens per action (0 on padding).
            valid: ``(B, T)`` bool, real actions.
            inputs: what :attr:`needs` asked for.
            config: the ``credit`` settings.
        """
        raise NotImplementedError

    @classmethod
    def section_name(cls) -> str:
        """The key of its settings section under ``credit``."""
        return cls.section or cls.name

    def settings_of(self, config: CreditConfig) -> Any:
        """Its settings section of ``config`` (``credit.<section>``)."""
        return config.section(self.section_name())

    @property
    def needs_annotator(self) -> bool:
        """Whether its inputs come from an annotator (influence graphs): then the pipeline and the
        CLI build one and stream with a window of annotations in flight."""
        return "influence_graphs" in self.needs

    def changes_tokens(self, config: CreditConfig) -> bool:
        """Whether :meth:`post_process_tokens` changes anything under ``config`` (default: no)."""
        return False

    def post_process_tokens(
        self,
        tokens: torch.Tensor,
        credit: Any,
        layout: TokenLayout,
        inputs: EstimatorInputs,
        config: CreditConfig,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """Token advantages after routing (hook; default: unchanged).

        Args:
            tokens: ``(rows, R)`` ``A_tau * w_i`` (or the additive ``A_i``) on the tokens of
                action ``i`` (``batch_credit.route_token_advantages``), in the rows' dtype.
            credit: the batch's ``batch_credit.BatchCredit``.
            layout: where each action sits in the rows.
            inputs: what :attr:`needs` asked for.
            config: the ``credit`` settings.

        Returns:
            ``(rows, R)`` token advantages and metrics of the step (``credit/...`` names, each in
            ``verl_credit.metrics.METRIC_DOCS``). Must act on each token alone, from the value and
            action of the token (``verl-credit route`` applies it on one token per action).
        """
        return tokens, {}

    def require(self, inputs: EstimatorInputs, need: str) -> Any:
        """``inputs.<need>``, or ``ValueError`` naming the estimator when it was not prepared."""
        value = getattr(inputs, need)
        if value is None or len(value) != len(inputs.uids):
            raise ValueError(f"the {self.name} estimator needs one entry of {need} per trajectory")
        return value


_REGISTRY: dict[str, Estimator] = {}
_loaded = False
E = TypeVar("E", bound=type[Estimator])


def register_estimator(cls: E) -> E:
    """Class decorator: register one instance of ``cls`` under ``cls.name``; a second estimator of
    the same name is an error (as in verl's ``register_adv_est``)."""
    name = getattr(cls, "name", "")
    if not isinstance(name, str) or not name:
        raise ValueError(f"{cls.__name__} has no estimator name")
    unknown = set(cls.needs) - set(NEEDS)
    if unknown:
        raise ValueError(f"estimator {name!r} needs unknown inputs {sorted(unknown)}; known: {NEEDS}")
    _check_settings(cls)
    if name in _REGISTRY and type(_REGISTRY[name]) is not cls:
        raise ValueError(f"estimator {name!r} is already registered ({type(_REGISTRY[name]).__name__})")
    _REGISTRY[name] = cls()
    return cls


def _check_settings(cls: type[Estimator]) -> None:
    """An estimator's settings section: a dataclass with defaults, a section name that is an
    identifier and not a key the ``credit`` node already uses, one class per section."""
    if cls.settings is None:
        return
    name = cls.name
    if not (isinstance(cls.settings, type) and dataclasses.is_dataclass(cls.settings)):
        raise ValueError(f"estimator {name!r}: settings must be a dataclass class, got {cls.settings!r}")
    section = cls.section_name()
    if not section.isidentifier() or section in RESERVED_KEYS:
        raise ValueError(
            f"estimator {name!r}: settings section {section!r} must be an identifier other than {sorted(RESERVED_KEYS)}"
        )
    try:
        cls.settings()
    except Exception as error:  # its defaults must build: the section is optional in every config
        raise ValueError(
            f"estimator {name!r}: its settings {cls.settings.__name__}() must build from the defaults: {error}"
        ) from error
    for other in _REGISTRY.values():
        if other.section_name() == section and other.settings not in (None, cls.settings) and other.name != name:
            raise ValueError(
                f"estimator {name!r}: settings section {section!r} is already {other.settings.__name__} "
                f"(estimator {other.name!r})"
            )


class EstimatorPluginError(RuntimeError):
    """A plug-in of :data:`ENTRY_POINT_GROUP` that cannot be loaded (the message names it and its
    distribution); raised on first use of the registry, i.e. at start-up."""


def _load_entry_point(entry_point: metadata.EntryPoint) -> None:
    """Import one plug-in; an :class:`Estimator` subclass it names is registered (a module is
    expected to register its estimators on import). Errors name the entry point and its package."""
    dist = getattr(entry_point, "dist", None)
    package = dist.name if dist is not None else "an unknown distribution"
    where = f"estimator plug-in {entry_point.name} = {entry_point.value!r} ({package}, group {ENTRY_POINT_GROUP})"
    try:
        loaded = entry_point.load()
        if isinstance(loaded, type) and issubclass(loaded, Estimator):
            register_estimator(loaded)
        elif not isinstance(loaded, types.ModuleType):
            raise TypeError(f"it names {type(loaded).__name__} {loaded!r}, not a module or an Estimator subclass")
    except Exception as error:  # a broken plug-in must say which one it is, at start-up
        raise EstimatorPluginError(f"{where}: {type(error).__name__}: {error}") from error


def _load() -> None:
    global _loaded
    if _loaded:
        return
    # set first: a module being imported may itself ask the registry (estimator_names at import)
    _loaded = True
    try:
        extra = [m for m in os.environ.get(_ENV_MODULES, "").split(",") if m.strip()]
        for module in (*BUILTIN_MODULES, *extra):
            importlib.import_module(module.strip())
        # sorted by name: the registration order (the --estimator choices) does not depend on the
        # order site-packages happens to list distributions in
        for entry_point in sorted(metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
            _load_entry_point(entry_point)
    except BaseException:
        _loaded = False  # the next call reports the same error instead of a partial registry
        raise


def _ordered() -> list[Estimator]:
    """The registered estimators: the built-in ones in :data:`BUILTIN_MODULES` order (whichever
    module happened to be imported first), then the others in registration order."""
    _load()
    rank = {module: position for position, module in enumerate(BUILTIN_MODULES)}
    entries = list(_REGISTRY.values())
    return sorted(entries, key=lambda e: (rank.get(type(e).__module__, len(rank)), entries.index(e)))


def estimator_names() -> tuple[str, ...]:
    """Registered names: the built-in ones first (:data:`BUILTIN_MODULES` order), then plug-ins."""
    return tuple(estimator.name for estimator in _ordered())


def estimator_sections() -> dict[str, type]:
    """Every registered estimator's settings section: ``credit.<section>`` key -> dataclass, in
    registration order."""
    sections: dict[str, type] = {}
    for estimator in _ordered():
        if estimator.settings is not None:
            sections.setdefault(estimator.section_name(), estimator.settings)
    return sections


def get_estimator(name: str) -> Estimator:
    """The registered estimator ``name``; ``ValueError`` listing the names otherwise."""
    _load()
    if name not in _REGISTRY:
        raise ValueError(f"unknown estimator {name!r}; registered: {tuple(_REGISTRY)}")
    return _REGISTRY[name]
