"""Hybrid annotator: the rules first, the LLM only where the rules flag ``uncertain`` (docs/design.md section 5).

Every trajectory is annotated by the rule annotator (cheap, no model). A result the rules mark
``uncertain`` is escalated to the LLM annotator; should the LLM fail, the rules' own graph is the
fallback (``source = "fallback:rules"``) without running the rules twice. ``source`` of a result
says which annotator produced it (``rules``, ``llm``, ``fallback:...``), so ``AnnotationStats.
by_source`` shows the escalation rate.
"""

from __future__ import annotations

from typing import Any

from verl_credit.annotate.base import AnnotationResult, Annotator, annotator_class, register_annotator
from verl_credit.annotate.llm import LLMAnnotator
from verl_credit.trajectory import Trajectory

__all__ = ["HybridAnnotator"]


@register_annotator("hybrid")
class HybridAnnotator(Annotator):
    """Rules, escalating uncertain trajectories to an LLM.

    Args:
        rules: the rule annotator (default the registered ``rules`` annotator built with ``rules_options``).
        llm: the LLM annotator (default ``LLMAnnotator(**llm_options)`` sharing ``rules`` as its
            fallback).
        rules_options: options of the default rule annotator.
        **llm_options: options of the default :class:`LLMAnnotator` (``base_urls``, ``model``,
            ``concurrency``, ``timeout``, ``max_retries``, ``fallback``, ``max_model_len``,
            ``max_prompt_tokens``, ``trust_env``, ...).

    Nothing slow runs on the event loop: the rule pass runs in the rule annotator's worker
    thread, the LLM request is asynchronous. A cache of the final (hybrid) results is attached
    from outside (:class:`verl_credit.annotate.cache.CachedAnnotator`), as for every annotator.
    """

    def __init__(
        self,
        rules: Annotator | None = None,
        llm: LLMAnnotator | None = None,
        *,
        rules_options: dict[str, Any] | None = None,
        **llm_options: Any,
    ):
        self.rules = rules if rules is not None else annotator_class("rules")(**(rules_options or {}))
        self.llm = llm if llm is not None else LLMAnnotator(rules_annotator=self.rules, **llm_options)
        self.concurrency = self.llm.concurrency
        self.model = self.llm.model
        self.escalated = 0

    @property
    def prompt_version(self) -> str:
        """The LLM prompt version and the rules' version (both change hybrid results)."""
        rules_version = getattr(self.rules, "version", "") or ""
        return f"{self.llm.prompt_version}+rules={rules_version}"

    async def annotate_one(self, trajectory: Trajectory) -> AnnotationResult:
        rules_result = await self.rules.annotate_one(trajectory)
        if not rules_result.uncertain:
            return rules_result
        self.escalated += 1
        return await self.llm.annotate_one(trajectory, rules_result=rules_result)

    async def aclose(self) -> None:
        await self.llm.aclose()
        await self.rules.aclose()
