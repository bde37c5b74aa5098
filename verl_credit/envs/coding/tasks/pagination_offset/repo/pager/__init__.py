"""Tiny pagination helpers."""
