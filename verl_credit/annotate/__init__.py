"""Annotators: trajectories in, validated graphs out (one interface, one cache)."""
