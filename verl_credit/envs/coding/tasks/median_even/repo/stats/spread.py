"""Measures of spread."""

from stats.central import mean


def variance(values: list[float]) -> float:
    """Population variance."""
    center = mean(values)
    return sum((value - center) ** 2 for value in values) / len(values)


def value_range(values: list[float]) -> float:
    """Largest minus smallest value."""
    return max(values) - min(values)
