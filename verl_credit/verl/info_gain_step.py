"""The ``info_gain`` estimator's extra forward passes, through verl's actor, in the credit trainer.

InfoPO's information gain of action ``a_i`` (``verl_credit.credit_math.info_gain`` eq. 1) compares the
teacher-forced log-probs of the next action ``a_{i+1}`` with the feedback between them (tool result,
user reply) as it was and with that feedback overwritten by a placeholder. The first are verl's
``old_log_probs`` (the actor's pass over the step's rows, same weights, same temperature); the
second come from one extra actor pass per feedback turn, batched:

1. :func:`find_feedback_pairs`: for every session and every pair of consecutive actions, the row
   holding ``a_{i+1}`` and, in that row's ``input_ids``, the feedback tokens: everything between
   the end of ``a_i`` and the start of ``a_{i+1}``, less the generation prompt that opens
   ``a_{i+1}`` (``<|im_start|>assistant\\n``: the authors' observation span is the rendered
   feedback message, the next action keeps its header). ``a_i`` may end in an earlier row
   (``credit.layout=per_request``, or a multi-output session) when that row's tokens are a prefix
   of this one's; a pair whose feedback cannot be located is counted, and gets no gain.
2. :func:`build_variant_rows`: per pair, the row cut after ``a_{i+1}``'s last token with the
   feedback masked (``mask_feedback_tokens``: same length, positions unchanged); only the fields
   verl's actor reads (prompts, responses, input_ids, position_ids, response_mask, loss_mask).
3. :func:`measure_information_gains`: the variants go into a TransferQueue partition of their own
   (:data:`PARTITION`), padded to a multiple of the actor's data-parallel size times its forward
   micro-batch, balanced across ranks like verl's ``_balance_batch``, through
   ``actor_rollout_wg.compute_log_prob`` exactly as verl's ``_compute_old_log_prob`` calls it; the
   log-probs are read back with verl's ``response_from_nested`` and the partition is cleared.
   With ``algorithm.rollout_correction.bypass_mode`` (``old_log_probs`` are the rollout engine's)
   the unmasked cut rows go through the actor too, so both sides come from the same model.

Cost: one forward pass over the prefix up to ``a_{i+1}`` per feedback turn -- about ``T / 2`` times
the step's old-log-prob pass for sessions of ``T`` actions (``credit/info_gain_token_ratio`` is the
measured token ratio, ``credit/info_gain_seconds`` the wall time; ``timing_s/step`` is verl's).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from verl_credit.credit_math.info_gain import compute_feedback_gain, mask_feedback_tokens
from verl_credit.estimators.needs import INFORMATION_GAINS_KEY
from verl_credit.verl.batch import CREDIT_KEY, group_sessions, session_spans

__all__ = [
    "PARTITION",
    "FeedbackPair",
    "InformationGains",
    "actor_dp_size",
    "attach_information_gains",
    "build_variant_rows",
    "find_feedback_pairs",
    "generation_prompt_ids",
    "info_gain_credit_metrics",
    "measure_information_gains",
]

logger = logging.getLogger(__name__)
logger.setLevel(os.getenv("VERL_LOGGING_LEVEL", "INFO"))

#: the TransferQueue partition of the masked rows (cleared after every step; never sampled)
PARTITION = "credit_info_gain"
#: the fields of a masked row: what verl's actor reads in ``compute_log_prob``
VARIANT_FIELDS = ("prompts", "responses", "input_ids", "position_ids", "response_mask", "loss_mask")


@dataclass(frozen=True)
class FeedbackPair:
    """The feedback of action ``action`` of session ``session`` and where the next action is.

    ``row``: the batch row holding action ``action + 1``; ``start``/``end``: the feedback tokens in
    that row's ``input_ids``; ``next_spans``: action ``action + 1``'s spans in the row's response;
    ``cut``: the masked row's response length (the end of ``next_spans``).
    """

    session: int
    action: int
    row: int
    start: int
    end: int
    next_spans: tuple[tuple[int, int], ...]
    cut: int


@dataclass
class InformationGains:
    """One step's gains: ``by_session[session key]`` is one gain or ``None`` per action."""

    by_session: dict[str, list[float | None]] = field(default_factory=dict)
    pairs: int = 0
    unmatched: int = 0
    forward_rows: int = 0
    forward_tokens: int = 0
    batch_tokens: int = 0
    seconds: float = 0.0

    def metrics(self) -> dict[str, float]:
        gains = [g for row in self.by_session.values() for g in row if g is not None]
        return {
            "credit/info_gain_pairs": float(self.pairs),
            "credit/info_gain_unmatched": float(self.unmatched),
            "credit/info_gain_mean": sum(gains) / len(gains) if gains else 0.0,
            "credit/info_gain_forward_rows": float(self.forward_rows),
            "credit/info_gain_forward_tokens": float(self.forward_tokens),
            "credit/info_gain_token_ratio": self.forward_tokens / self.batch_tokens if self.batch_tokens else 0.0,
            "credit/info_gain_seconds": self.seconds,
        }


def generation_prompt_ids(tokenizer: Any, chat_template_kwargs: Mapping[str, Any] | None = None) -> list[int]:
    """The tokens the chat template appends to open an assistant turn (``<|im_start|>assistant\\n``
    for ChatML), ``[]`` when the tokenizer has no chat template or they cannot be told apart."""
    kwargs = dict(chat_template_kwargs or {})
    messages = [{"role": "user", "content": "x"}]

    def render(opening: bool) -> list[int]:
        # transformers 5 returns a mapping by default (return_dict=True); 4.x a list
        ids = tokenizer.apply_chat_template(
            messages, add_generation_prompt=opening, tokenize=True, return_dict=False, **kwargs
        )
        return [int(i) for i in (ids["input_ids"] if isinstance(ids, Mapping) else ids)]

    try:
        without, opened = render(False), render(True)
    except Exception as exc:  # no template, or a template that needs other arguments
        logger.warning("credit: info_gain cannot render the generation prompt (%s); the whole gap is masked", exc)
        return []
    if len(opened) <= len(without) or opened[: len(without)] != without:
        return []
    return opened[len(without) :]


def _action_spans(spans: Mapping[int, Sequence[tuple[int, int, int]]]) -> dict[int, list[tuple[int, int, int]]]:
    """``{action: [(row, start, end)]}`` in row order (a session's rows come in output order)."""
    found: dict[int, list[tuple[int, int, int]]] = {}
    for row, row_spans in spans.items():
        for action, start, end in row_spans:
            found.setdefault(int(action), []).append((row, int(start), int(end)))
    return found


def find_feedback_pairs(
    spans_by_session: Sequence[Mapping[int, Sequence[tuple[int, int, int]]]],
    prompt_lengths: Mapping[int, int],
    input_ids: Mapping[int, torch.Tensor],
    generation_prompt: Sequence[int] = (),
) -> tuple[list[FeedbackPair], int]:
    """Every (action, next action) pair with feedback between them, and the number of pairs whose
    feedback could not be located (``a_i`` in an earlier row that is not a prefix of ``a_{i+1}``'s).

    Args:
        spans_by_session: per session (numbered as the pairs' ``session``), ``{row: [(action, start,
            end)]}`` in response coordinates.
        prompt_lengths, input_ids: per row, its prompt length and its ``(N,)`` tokens (prompt + response).
        generation_prompt: tokens kept unmasked at the end of the feedback when they end it.
    """
    pairs: list[FeedbackPair] = []
    unmatched = 0
    opener = list(generation_prompt)
    for number, spans in enumerate(spans_by_session):
        by_action = _action_spans(spans)
        for action in sorted(by_action):
            if action + 1 not in by_action:
                continue
            next_row = by_action[action + 1][0][0]
            next_spans = tuple((s, e) for r, s, e in by_action[action + 1] if r == next_row)
            ids = input_ids[next_row]
            end = prompt_lengths[next_row] + min(s for s, _ in next_spans)
            here = [e for r, _, e in by_action[action] if r == next_row]
            if here:
                start = prompt_lengths[next_row] + max(here)
            else:
                row, _, last = by_action[action][-1]
                start = prompt_lengths[row] + last
                if start > ids.shape[0] or not torch.equal(ids[:start], input_ids[row][:start]):
                    unmatched += 1
                    continue
            if start > end:
                unmatched += 1
                continue
            if opener and end - start >= len(opener) and ids[end - len(opener) : end].tolist() == opener:
                end -= len(opener)
            if end > start:
                pairs.append(
                    FeedbackPair(number, action, next_row, start, end, next_spans, max(e for _, e in next_spans))
                )
    return pairs, unmatched


def build_variant_rows(
    pairs: Sequence[FeedbackPair],
    prompt_lengths: Mapping[int, int],
    input_ids: Mapping[int, torch.Tensor],
    position_ids: Mapping[int, torch.Tensor],
    response_masks: Mapping[int, torch.Tensor],
    placeholder_ids: Sequence[int] | None,
) -> list[dict[str, torch.Tensor]]:
    """One row per pair: the pair's row cut after the next action, the feedback masked
    (``placeholder_ids=None``: left as it is, the unmasked reference row)."""
    rows = []
    for pair in pairs:
        prompt = prompt_lengths[pair.row]
        length = prompt + pair.cut
        ids = input_ids[pair.row][:length]
        if placeholder_ids is not None:
            ids = mask_feedback_tokens(ids, pair.start, pair.end, placeholder_ids)
        mask = response_masks[pair.row][: pair.cut].to(torch.int64)
        rows.append(
            {
                "prompts": ids[:prompt].clone(),
                "responses": ids[prompt:].clone(),
                "input_ids": ids.clone(),
                "position_ids": position_ids[pair.row][..., :length].clone(),
                "response_mask": mask.clone(),
                "loss_mask": mask.clone(),
            }
        )
    return rows


def _padding_row(template: Mapping[str, torch.Tensor], eos_token_id: int) -> dict[str, torch.Tensor]:
    """A two-token row (prompt, response: eos) with no trainable token, to fill the last rank."""
    from verl.trainer.ppo.padding_utils import build_padding_position_ids

    ids = torch.full((2,), int(eos_token_id), dtype=torch.int64)
    mask = torch.zeros(1, dtype=torch.int64)
    return {
        "prompts": ids[:1].clone(),
        "responses": ids[1:].clone(),
        "input_ids": ids,
        "position_ids": build_padding_position_ids(template["position_ids"], torch.ones(2, dtype=torch.int64)),
        "response_mask": mask,
        "loss_mask": mask.clone(),
    }


def actor_dp_size(worker_group: Any) -> int:
    """The actor's data-parallel size, read as verl's ``_balance_batch`` reads it."""
    if "actor" not in worker_group._dispatch_info:
        worker_group._dispatch_info["actor"] = worker_group._query_dispatch_info("actor")
    return max(worker_group._dispatch_info["actor"]) + 1


def _forward(
    tq: Any,
    worker_group: Any,
    rows: list[dict[str, torch.Tensor]],
    multiple: int,
    eos_token_id: int,
    extra_info: Mapping[str, Any],
    dp_size: int,
    step_key: str,
) -> tuple[list[torch.Tensor], int]:
    """``rows`` through ``worker_group.compute_log_prob`` (padded to ``multiple``, balanced over
    ``dp_size`` ranks); returns each row's response log-probs and the tokens forwarded."""
    from transfer_queue import KVBatchMeta
    from verl.utils.seqlen_balancing import calculate_workload, get_seqlen_balanced_partitions
    from verl.utils.tensordict_utils import list_of_dict_to_tensordict
    from verl.workers.utils.padding import response_from_nested

    real = len(rows)
    padded = rows + [_padding_row(rows[0], eos_token_id) for _ in range((-real) % max(multiple, 1))]
    keys = [f"{step_key}_{number}" for number in range(len(padded))]
    tags = [
        {
            "prompt_len": int(row["prompts"].shape[0]),
            "response_len": int(row["responses"].shape[0]),
            "seq_len": int(row["input_ids"].shape[0]),
            **({"is_padding": True} if number >= real else {}),
        }
        for number, row in enumerate(padded)
    ]
    tq.kv_batch_put(keys=keys, partition_id=PARTITION, fields=list_of_dict_to_tensordict(padded), tags=tags)
    try:
        meta = KVBatchMeta(keys=keys, tags=tags, partition_id=PARTITION, extra_info=dict(extra_info))
        if dp_size > 1:
            lengths = torch.tensor([tag["seq_len"] for tag in tags], dtype=torch.int64)
            partitions = get_seqlen_balanced_partitions(
                calculate_workload(lengths), k_partitions=dp_size, equal_size=True
            )
            meta.reorder([index for partition in partitions for index in partition])
        output = worker_group.compute_log_prob(meta)
        if len(output) != len(meta):
            raise RuntimeError(f"credit: info_gain: the actor returned {len(output)} rows for {len(meta)}")
        fetched = tq.kv_batch_get(keys=keys, partition_id=PARTITION, select_fields=["log_probs", "response_mask"])
        log_probs = response_from_nested(fetched["log_probs"], fetched["response_mask"]).unbind()
    finally:
        tq.kv_clear(keys=keys, partition_id=PARTITION)
    return list(log_probs[:real]), sum(tag["seq_len"] for tag in tags)


def measure_information_gains(
    keys: Sequence[str],
    tags: Sequence[Mapping[str, Any]],
    uids: Sequence[Any],
    extras: Sequence[Any],
    rollout_mask: torch.Tensor,
    old_log_probs: torch.Tensor | None,
    *,
    tq: Any,
    partition_id: str,
    worker_group: Any,
    tokenizer: Any,
    placeholder: str,
    extra_info: Mapping[str, Any],
    micro_batch_size: int = 1,
    chat_template_kwargs: Mapping[str, Any] | None = None,
    step_key: str = "step",
) -> InformationGains:
    """Every session's per-action information gain (eq. 1) for one step.

    Args:
        keys, tags, uids, extras: per row, as stored in TransferQueue (``partition_id``).
        rollout_mask: ``(rows, R)`` response mask as produced by the rollout.
        old_log_probs: ``(rows, R)`` the actor's log-probs of the rows (verl's ``old_log_probs``);
            ``None`` (e.g. bypass mode: they are the rollout engine's): the unmasked cut rows are
            forwarded too.
        tq: the TransferQueue module (``transfer_queue``).
        worker_group: verl's actor worker group (``compute_log_prob``).
        tokenizer: the policy's tokenizer (placeholder and generation prompt).
        placeholder: ``credit.info_gain.placeholder``.
        extra_info: what verl's ``_compute_old_log_prob`` sets on the batch (temperature, ...).
        micro_batch_size: the actor's forward micro-batch per GPU (1 with dynamic batch size).
        chat_template_kwargs: ``data.apply_chat_template_kwargs`` (for the generation prompt).
        step_key: prefix of the masked rows' keys.
    """
    started = time.perf_counter()
    sessions, _ = group_sessions(keys, tags, uids)
    result = InformationGains()
    if not sessions:
        return result
    spans_by_session = [session_spans(session, extras, rollout_mask, keys)[0] for session in sessions]
    needed = sorted({row for spans in spans_by_session for row in spans})
    fetched = tq.kv_batch_get(
        keys=[keys[row] for row in needed],
        partition_id=partition_id,
        select_fields=["prompts", "input_ids", "position_ids"],
    )
    prompt_lengths = {row: int(n) for row, n in zip(needed, fetched["prompts"].offsets().diff().tolist(), strict=True)}
    input_ids = dict(zip(needed, fetched["input_ids"].unbind(), strict=True))
    position_ids = dict(zip(needed, _unbind(fetched["position_ids"]), strict=True))
    response_masks = {row: rollout_mask[row] for row in needed}
    result.batch_tokens = sum(int(tags[row].get("seq_len", input_ids[row].shape[0])) for row in needed)
    opener = generation_prompt_ids(tokenizer, chat_template_kwargs)
    pairs, result.unmatched = find_feedback_pairs(spans_by_session, prompt_lengths, input_ids, opener)
    for session, spans in zip(sessions, spans_by_session, strict=True):
        count = 1 + max((a for row_spans in spans.values() for a, _, _ in row_spans), default=-1)
        result.by_session[session.key] = [None] * count
    result.pairs = len(pairs)
    if not pairs:
        result.seconds = time.perf_counter() - started
        return result

    placeholder_ids = list(tokenizer.encode(placeholder, add_special_tokens=False))
    rows = build_variant_rows(pairs, prompt_lengths, input_ids, position_ids, response_masks, placeholder_ids)
    if old_log_probs is None:
        rows += build_variant_rows(pairs, prompt_lengths, input_ids, position_ids, response_masks, None)
    dp_size = actor_dp_size(worker_group)
    log_probs, result.forward_tokens = _forward(
        tq,
        worker_group,
        rows,
        dp_size * max(int(micro_batch_size), 1),
        int(tokenizer.eos_token_id if tokenizer.eos_token_id is not None else 0),
        extra_info,
        dp_size,
        step_key,
    )
    result.forward_rows = len(rows)
    width = max(pair.cut for pair in pairs)
    without = torch.zeros((len(pairs), width), dtype=torch.float64)
    with_feedback = torch.zeros_like(without)
    mask = torch.zeros((len(pairs), width), dtype=torch.bool)
    for number, pair in enumerate(pairs):
        masked = log_probs[number].to(torch.float64)
        without[number, : masked.shape[0]] = masked[:width]
        if old_log_probs is None:
            reference = log_probs[len(pairs) + number].to(torch.float64)
        else:
            reference = old_log_probs[pair.row, : pair.cut].to(torch.float64)
        with_feedback[number, : reference.shape[0]] = reference[:width]
        for start, end in pair.next_spans:
            mask[number, start:end] = rollout_mask[pair.row, start:end].to(torch.bool)
    gains = compute_feedback_gain(with_feedback, without, mask)
    for pair, gain in zip(pairs, gains.tolist(), strict=True):
        result.by_session[sessions[pair.session].key][pair.action] = float(gain)
    result.seconds = time.perf_counter() - started
    return result


def attach_information_gains(
    keys: Sequence[str],
    tags: Sequence[Mapping[str, Any]],
    uids: Sequence[Any],
    extras: Sequence[Any],
    gains: InformationGains,
) -> int:
    """Put each session's gains into its final row's ``extra_fields["credit"]`` (in memory) under
    ``information_gains``, as a rollout-time measurement would be, so the estimator, the step's dump
    (``credit.debug.dump_dir``), the offline check and the step pictures all read the same numbers.
    The list has the payload's ``num_actions`` entries (``None`` past the last measured action).
    Returns the number of sessions that got gains (a row without a credit payload gets none)."""
    sessions, _ = group_sessions(keys, tags, uids)
    attached = 0
    for session in sessions:
        measured = gains.by_session.get(session.key)
        extra = extras[session.final_row]
        payload = extra.get(CREDIT_KEY) if isinstance(extra, dict) else None
        if measured is None or not isinstance(payload, dict):
            continue
        count = int(payload.get("num_actions", len(measured)))
        payload[INFORMATION_GAINS_KEY] = [*measured[:count], *([None] * max(0, count - len(measured)))]
        attached += 1
    return attached


def _unbind(value: torch.Tensor) -> list[torch.Tensor]:
    """Rows of a nested (jagged) or dense tensor."""
    return list(value.unbind())


def info_gain_credit_metrics(extras: Mapping[str, torch.Tensor], valid_tokens: torch.Tensor) -> dict[str, float]:
    """The estimator's terms for the step's log: gate, magnitude ratio and the share of the token
    advantage that the information gain contributes (the authors' ``intrinsic_contribution``).

    Args:
        extras: ``BatchCredit.extras`` of an ``info_gain`` step.
        valid_tokens: ``(B, T)`` trainable tokens per action (``BatchCredit.lengths``).
    """
    if "information_gain_bonus" not in extras:
        return {}
    lengths = valid_tokens.to(torch.float64)
    tokens = float(lengths.sum())
    has = extras["has_information_gain"] > 0
    bonus = float((extras["information_gain_bonus"].abs() * lengths).sum()) / tokens if tokens else 0.0
    rows = lengths.sum(dim=-1) > 0
    gate = extras["information_gain_gate"][:, 0][rows]
    ratio = extras["information_gain_ratio"][rows]
    return {
        "credit/info_gain_actions": float(has.sum()),
        "credit/info_gain_gate_mean": float(gate.mean()) if gate.numel() else 0.0,
        "credit/info_gain_ratio": float(ratio.max()) if ratio.numel() else 0.0,
        "credit/info_gain_bonus_abs_mean": bonus,
    }
