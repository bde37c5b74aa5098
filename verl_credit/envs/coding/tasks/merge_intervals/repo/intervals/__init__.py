"""Closed numeric intervals ``[start, end]``."""
