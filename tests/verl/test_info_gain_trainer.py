"""``info_gain`` in ``CreditTrainerSync._compute_advantage`` against a real local TransferQueue, with
an actor worker group whose ``compute_log_prob`` runs the tiny model (what verl's FSDP actor
computes: teacher-forced log-probs of every row's tokens, written back into TransferQueue).

Rows come from ``credit_agent`` (tiny model, scripted env), stored by verl's own writer. Groups:
    igM   merged, rewards 1 / 0 / 0.5 (sessions of 4 / 3 / 2 actions)
    igE   merged, rewards 0 / 0 / 0 (GRPO has no signal: the gate is 1/2, the gain is visible)
    igP   per_request, the igE episodes (the feedback of an action sits in the next row's prompt)

The expected gains are rebuilt here from the stored tokens: the gap between two actions is read
and checked as text (``<|im_start|>user ... <|im_end|><|im_start|>assistant``), the part
before the assistant header is overwritten with the placeholder, the tiny model scores the next
action, and verl's ``old_log_probs`` are the unmasked side.
"""

from __future__ import annotations

import asyncio
import itertools
import math
from typing import Any

import pytest
import torch
from verl_helpers import DEFAULT_PLANS, TinyModelServer, batch_meta, compose_credit_config, put_session, run_session

from verl_credit.batch_credit import compute_batch_credit
from verl_credit.config import CreditConfig
from verl_credit.credit_math.info_gain import mask_feedback_tokens
from verl_credit.verl.cpu.check import expected_advantages
from verl_credit.verl.info_gain_step import PARTITION

#: Ray + TransferQueue + a tiny model (about a minute on 2 cores): deselect with -m "not slow"
pytestmark = pytest.mark.slow

USER_REPLIES = [["card", "yes please"], ["card"], []]  # -> 4, 3, 2 actions: 3 + 2 + 1 feedback turns
GROUPS = {"igM": ("merged", [1.0, 0.0, 0.5]), "igE": ("merged", [0.0, 0.0, 0.0]), "igP": ("per_request", [0.0] * 3)}
BASE = [
    "actor_rollout_ref.rollout.prompt_length=512",
    "actor_rollout_ref.rollout.response_length=256",
    "actor_rollout_ref.rollout.n=3",
    "credit.env.name=test_orders",
    "algorithm.adv_estimator=info_gain",
]
#: not the default ("No information found."): the key must reach the masked rows
PLACEHOLDER = "Nothing was found."
#: the generation prompt of conftest's ChatML template (its ``{%-`` tags trim the newlines)
OPENING = "<|im_start|>assistant"
#: what the feedback of each action of a session is (tool result, then the user's replies)
FEEDBACK = {0: '{"order_id": "#W12", "status": "delivered"}', 1: "card", 2: "yes please"}


class TinyActor:
    """The actor worker group: ``compute_log_prob(meta)`` reads the rows' ``input_ids`` from
    TransferQueue, runs the tiny model (logits / the batch's temperature) and writes ``log_probs``
    in verl's layout (value t = log p(token t + 1), one value per token of the row)."""

    def __init__(self, model: Any, tq: Any, dp_size: int = 1):
        self.model = model
        self.tq = tq
        self.dp_size = dp_size
        self._dispatch_info: dict[str, list[int]] = {}
        self.calls: list[dict[str, Any]] = []

    def _query_dispatch_info(self, mesh: str) -> list[int]:
        assert mesh == "actor"
        return list(range(self.dp_size))

    def compute_log_prob(self, meta: Any) -> Any:
        from tensordict import TensorDict

        fetched = self.tq.kv_batch_get(keys=meta.keys, partition_id=meta.partition_id, select_fields=["input_ids"])
        rows = list(fetched["input_ids"].unbind())
        temperature = float(meta.extra_info["temperature"])
        values = []
        with torch.no_grad():
            for ids in rows:
                logits = self.model(ids.unsqueeze(0)).logits[0].float() / temperature
                log_probs = torch.log_softmax(logits[:-1], dim=-1).gather(-1, ids[1:, None])[:, 0]
                values.append(torch.cat([log_probs, log_probs.new_zeros(1)]))
        output = TensorDict(
            {"log_probs": torch.nested.as_nested_tensor(values, layout=torch.jagged)}, batch_size=len(rows)
        )
        self.tq.kv_batch_put(keys=meta.keys, partition_id=meta.partition_id, fields=output)
        self.calls.append({"keys": list(meta.keys), "tags": list(meta.tags), "rows": rows, "extra": meta.extra_info})
        return meta


@pytest.fixture(scope="module")
def stored(ray_tq, chatml_tokenizer, tiny_model, orders_env_cls):
    """Roll out and store every group; returns ``{prefix: [outputs of session 0, 1, 2]}``."""
    outputs: dict[str, list[list[Any]]] = {}

    async def go():
        for prefix, (layout, rewards) in GROUPS.items():
            config = compose_credit_config([*BASE, f"credit.layout={layout}"])
            server = TinyModelServer(tiny_model, chatml_tokenizer, DEFAULT_PLANS)
            outputs[prefix] = []
            for sid, (reward, replies) in enumerate(zip(rewards, USER_REPLIES, strict=True)):
                task = {"user_replies": replies, "reward": reward}
                session, kwargs = await run_session(config, server, chatml_tokenizer, prefix, sid, task)
                await put_session(session, kwargs)
                outputs[prefix].append(session)

    asyncio.run(go())
    return outputs


def _trainer(tokenizer, actor, tmp_path, *overrides: str):
    from verl_credit.verl.trainer import CreditTrainerSync

    placeholder = f"credit.info_gain.placeholder='{PLACEHOLDER}'"
    trainer = CreditTrainerSync(
        compose_credit_config([*BASE, placeholder, f"credit.debug.dump_dir={tmp_path}", *overrides])
    )
    assert trainer.credit_settings.credit.info_gain.placeholder == PLACEHOLDER
    trainer.actor_rollout_wg = actor
    trainer.tokenizer = tokenizer
    return trainer


def _session_tokens(outputs: list[Any]) -> tuple[torch.Tensor, int, list[tuple[int, int, int]]]:
    """A merged session's tokens, prompt length and spans (response coordinates)."""
    (output,) = outputs
    ids = torch.tensor([*output.prompt_ids, *output.response_ids])
    return ids, len(output.prompt_ids), [tuple(s) for s in output.extra_fields["credit"]["spans"]]


def expected_gains(outputs: list[Any], old_log_probs: torch.Tensor, tokenizer, model) -> list[float | None]:
    """The information gain of every action of a merged session, rebuilt from its tokens."""
    ids, prompt, spans = _session_tokens(outputs)
    opening = tokenizer.encode(OPENING, add_special_tokens=False)
    placeholder = tokenizer.encode(PLACEHOLDER, add_special_tokens=False)
    gains: list[float | None] = [None] * len(spans)
    for (action, _, end), (_, next_start, next_end) in itertools.pairwise(spans):
        gap = ids[prompt + end : prompt + next_start]
        text = tokenizer.decode(gap.tolist())
        assert text.lstrip("\n").startswith("<|im_start|>user") and text.endswith("<|im_end|>" + OPENING), text
        assert FEEDBACK[action] in text, text
        assert gap[-len(opening) :].tolist() == opening
        masked = mask_feedback_tokens(ids, prompt + end, prompt + next_start - len(opening), placeholder)
        masked = masked[: prompt + next_end]
        with torch.no_grad():
            logits = model(masked.unsqueeze(0)).logits[0].float()
        lp = torch.log_softmax(logits[:-1], dim=-1).gather(-1, masked[1:, None])[:, 0]
        # response token t of the row is predicted at sequence position prompt + t - 1
        without = lp[prompt + next_start - 1 : prompt + next_end - 1].to(torch.float64)
        with_feedback = old_log_probs[next_start:next_end].to(torch.float64)
        gains[action] = float((with_feedback - without).mean())
    return gains


def _old_log_probs(tq, meta, key: str) -> torch.Tensor:
    fetched = tq.kv_batch_get(keys=[key], partition_id="train", select_fields=["old_log_probs"])
    return fetched["old_log_probs"].unbind()[0]


def _recorded(trainer) -> dict[str, list[float | None]]:
    record = trainer._pending_dump
    found = {}
    for key, payload in zip(record["keys"], record["payloads"], strict=True):
        if payload and "information_gains" in payload:
            found[key.rsplit("_", 1)[0]] = payload["information_gains"]
    return found


@pytest.mark.timeout(300)
def test_masked_forward_passes_give_the_information_gains(
    stored, ray_tq, chatml_tokenizer, tiny_model, tmp_path
) -> None:
    """igM + igE: one batched actor call with one row per feedback turn (3 + 2 + 1 per group); the
    gains the trainer recorded equal the ones rebuilt here; the written advantages equal the credit
    core's on those gains and what the offline check rebuilds; the partition is emptied."""
    meta = batch_meta(ray_tq, ["igM_", "igE_"])
    actor = TinyActor(tiny_model, ray_tq)
    trainer = _trainer(chatml_tokenizer, actor, tmp_path)
    metrics: dict[str, float] = {}
    trainer._compute_advantage(meta, metrics)

    assert len(actor.calls) == 1 and len(actor.calls[0]["rows"]) == 12
    assert actor.calls[0]["extra"]["temperature"] == trainer.config.actor_rollout_ref.rollout.temperature
    recorded = _recorded(trainer)
    expected: dict[str, list[float | None]] = {}
    for prefix in ("igM", "igE"):
        for sid, outputs in enumerate(stored[prefix]):
            key = f"{prefix}_{sid}"
            expected[key] = expected_gains(
                outputs, _old_log_probs(ray_tq, meta, f"{key}_0"), chatml_tokenizer, tiny_model
            )
            assert len(recorded[key]) == len(expected[key]) == [4, 3, 2][sid]
            assert recorded[key][-1] is None  # the last action has no next action
            for got, want in zip(recorded[key], expected[key], strict=True):
                assert (got is None) == (want is None)
                if want is not None:
                    assert got == pytest.approx(want, abs=1e-6)
    assert any(abs(g) > 1e-4 for gains in expected.values() for g in gains if g is not None)

    # the token advantages: the core on the rebuilt gains, and the offline check's rebuild
    advantages = ray_tq.kv_batch_get(keys=meta.keys, partition_id="train", select_fields=["advantages"])
    advantages = advantages["advantages"].unbind()
    keys = [f"{p}_{s}" for p in ("igM", "igE") for s in range(3)]
    lengths = [stored[k.split("_")[0]][int(k.split("_")[1])][0].extra_fields["credit"]["action_lengths"] for k in keys]
    core = compute_batch_credit(
        torch.tensor([*GROUPS["igM"][1], *GROUPS["igE"][1]]),
        ["igM"] * 3 + ["igE"] * 3,
        lengths,
        CreditConfig(estimator="info_gain"),
        information_gains=[expected[k] for k in keys],
    )
    for number, key in enumerate(keys):
        row = meta.keys.index(f"{key}_0")
        _, _, spans = _session_tokens(stored[key.split("_")[0]][int(key.split("_")[1])])
        for action, start, end in spans:
            value = core.action_advantage[number, action].to(advantages[row].dtype)
            assert torch.allclose(advantages[row][start:end], value.expand(end - start), atol=1e-6), (key, action)
    igE = [meta.keys.index(f"igE_{s}_0") for s in range(3)]
    assert any(float(advantages[row].abs().max()) > 1e-4 for row in igE)  # the gain moves a no-signal group
    rebuilt, _, problems = expected_advantages(trainer._pending_dump)
    assert not problems
    width = min(rebuilt.shape[1], trainer._pending_dump["trainer_advantages"].shape[1])
    assert torch.allclose(rebuilt[:, :width].float(), trainer._pending_dump["trainer_advantages"][:, :width], atol=1e-6)

    assert metrics["credit/info_gain_pairs"] == 12.0 and metrics["credit/info_gain_unmatched"] == 0.0
    assert metrics["credit/info_gain_forward_rows"] == 12.0 and metrics["credit/info_gain_seconds"] > 0
    assert 0 < metrics["credit/info_gain_token_ratio"] < 4
    assert metrics["credit/info_gain_gate_mean"] == pytest.approx((0.5 + 1 / (1 + math.exp(10))) / 2, rel=1e-6)
    assert not ray_tq.kv_list(PARTITION).get(PARTITION)  # the masked rows are gone


@pytest.mark.timeout(300)
def test_per_request_rows_give_the_merged_gains(stored, ray_tq, chatml_tokenizer, tiny_model, tmp_path) -> None:
    """igP (one row per request: the feedback is in the next row's prompt) measures the same gains
    as igE (the same episodes, merged) and routes the same token advantages."""
    meta = batch_meta(ray_tq, ["igE_", "igP_"])
    trainer = _trainer(chatml_tokenizer, TinyActor(tiny_model, ray_tq), tmp_path, "credit.layout=per_request")
    metrics: dict[str, float] = {}
    trainer._compute_advantage(meta, metrics)
    recorded = _recorded(trainer)
    assert metrics["credit/info_gain_pairs"] == 12.0 and metrics["credit/info_gain_unmatched"] == 0.0
    for sid in range(3):
        merged, per_request = recorded[f"igE_{sid}"], recorded[f"igP_{sid}"]
        assert len(merged) == len(per_request)
        for a, b in zip(merged, per_request, strict=True):
            assert (a is None and b is None) or a == pytest.approx(b, abs=1e-5)


@pytest.mark.timeout(300)
def test_bypass_mode_and_data_parallel_padding(stored, ray_tq, chatml_tokenizer, tiny_model, tmp_path) -> None:
    """Rollout-correction bypass (old_log_probs are the rollout engine's): the unmasked rows go
    through the actor too. Two data-parallel ranks and a forward micro-batch of 4: the 2 x 6 rows
    are padded to a multiple of 8 with rows that train nothing. The gains stay those of the first test."""
    meta = batch_meta(ray_tq, ["igE_"])
    reference_trainer = _trainer(chatml_tokenizer, TinyActor(tiny_model, ray_tq), tmp_path / "ref")
    reference_trainer._compute_advantage(meta, {})
    reference = _recorded(reference_trainer)

    actor = TinyActor(tiny_model, ray_tq, dp_size=2)
    trainer = _trainer(
        chatml_tokenizer,
        actor,
        tmp_path / "bypass",
        "algorithm.rollout_correction.bypass_mode=true",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
    )
    metrics: dict[str, float] = {}
    trainer._compute_advantage(meta, metrics)
    (call,) = actor.calls
    assert len(call["rows"]) == 16 and metrics["credit/info_gain_forward_rows"] == 12.0
    padding = [tag for tag in call["tags"] if tag.get("is_padding")]
    assert len(padding) == 4 and all(tag["seq_len"] == 2 for tag in padding)
    for key, gains in _recorded(trainer).items():
        for got, want in zip(gains, reference[key], strict=True):
            assert (got is None and want is None) or got == pytest.approx(want, abs=1e-4)
    assert not ray_tq.kv_list(PARTITION).get(PARTITION)
