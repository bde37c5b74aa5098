"""Advantage estimators by name (:mod:`.registry`); one module per estimator."""

from verl_credit.estimators.registry import (
    ENTRY_POINT_GROUP,
    NEEDS,
    ActionCredit,
    Estimator,
    EstimatorInputs,
    EstimatorPluginError,
    estimator_names,
    get_estimator,
    register_estimator,
)

__all__ = [
    "ENTRY_POINT_GROUP",
    "NEEDS",
    "ActionCredit",
    "Estimator",
    "EstimatorInputs",
    "EstimatorPluginError",
    "estimator_names",
    "get_estimator",
    "register_estimator",
]
