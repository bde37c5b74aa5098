"""The LLM annotator's defaults, in one place.

Read by :class:`verl_credit.annotate.llm.LLMAnnotator` (its constructor's defaults), by
``verl-credit annotate``/``route`` (the flags left unset) and by the trainer's ``credit.annotator``
settings (``verl_credit.verl.settings.AnnotatorSettings``, which the yaml node must equal), so an
offline annotation and a training run ask the server the same way unless told otherwise. No
imports: the trainer's settings module reads it without loading httpx.
"""

from __future__ import annotations

#: requests in flight per annotator (one per process; a node runs one per rollout worker)
CONCURRENCY = 16
#: seconds one request may take (the whole exchange)
TIMEOUT_S = 120.0
#: retries after a failed attempt (the retry table of :mod:`verl_credit.openai_chat`)
MAX_RETRIES = 3
#: retries after an unusable answer (empty, truncated, breaking the answer contract)
PARSE_RETRIES = 1
#: the wait before retry ``k``: ``min(BACKOFF_S * 2**(k-1), BACKOFF_MAX_S)``, jittered
BACKOFF_S = 0.5
BACKOFF_MAX_S = 30.0
#: the longest ``Retry-After`` honoured (never past the request deadline)
RETRY_AFTER_MAX_S = 60.0
#: the graph after a final failure: ``rules`` or ``uniform``
FALLBACK = "rules"

#: the annotators that ask an LLM (the others are built from rules)
LLM_ANNOTATORS: tuple[str, ...] = ("llm", "hybrid")
#: settings only an LLM annotator reads: given to another annotator (off their defaults), they are
#: refused -- by ``verl-credit annotate``/``route`` (as flags) and by the trainer
#: (``credit.annotator.*``) alike -- rather than silently dropped
LLM_ONLY_SETTINGS: tuple[str, ...] = (
    "base_urls",
    "model",
    "timeout",
    "max_retries",
    "max_model_len",
    "max_prompt_tokens",
    "trust_env",
)
