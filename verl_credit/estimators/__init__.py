"""Advantage estimators by name (:mod:`.registry`); one module per estimator."""

from verl_credit.estimators.registry import (
    NEEDS,
    ActionCredit,
    Estimator,
    EstimatorInputs,
    estimator_names,
    get_estimator,
    register_estimator,
)

__all__ = [
    "NEEDS",
    "ActionCredit",
    "Estimator",
    "EstimatorInputs",
    "estimator_names",
    "get_estimator",
    "register_estimator",
]
