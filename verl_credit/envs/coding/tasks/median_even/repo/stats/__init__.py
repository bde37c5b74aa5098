"""Descriptive statistics for plain lists of numbers."""
