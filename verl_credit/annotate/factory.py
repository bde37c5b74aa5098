"""Build an annotator by name, with the one way of attaching the graph cache.

Every caller -- ``verl-credit annotate``/``route``, the pipeline, the trainer's rollout workers,
the benchmarks -- builds its annotator here: :func:`verl_credit.annotate.base.annotator_class` picks
the registered class, and a ``cache_path`` always wraps the result in
:class:`verl_credit.annotate.cache.CachedAnnotator` (keyed by the wrapped annotator's identity, so
one database holds the graphs of several annotators, models and prompt versions). No annotator
opens a cache of its own.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from verl_credit.annotate.base import Annotator, annotator_class
from verl_credit.annotate.cache import CachedAnnotator, GraphCache

__all__ = ["build_annotator"]


def build_annotator(name: str, *, cache_path: str | Path | GraphCache | None = None, **options: Any) -> Annotator:
    """The registered annotator ``name`` built with ``options``, behind the cache at ``cache_path``.

    Raises:
        ValueError: ``name`` is not registered (the message lists the registered ones).
    """
    annotator = annotator_class(name)(**options)
    if cache_path is not None:
        return CachedAnnotator(annotator, cache_path)
    return annotator
