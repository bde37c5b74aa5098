"""Text helpers for URLs and titles."""
