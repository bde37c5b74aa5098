"""Benchmarks: ``learning`` (does routed credit make policy-gradient learning faster?)."""
