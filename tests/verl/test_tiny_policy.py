"""The tiny service-world policy of the CPU smoke run (``verl_credit.verl.cpu.tiny_policy``).

* the chat template renders a scripted episode the way Qwen2.5 does (hand-written expected text),
  and every hermes ``<tool_call>`` body in the rendering parses back to the episode's call;
* the tokenizer keeps each control token as one id and encodes ``\\n`` as one id (verl's Qwen
  Continuous-Token builder requires it);
* the assistant-token mask of an encoded episode covers exactly the assistant messages;
* the tool schemas the template sees are verl's ``model_dump`` of the world's schemas;
* ``build_tiny_policy`` writes a directory that ``AutoTokenizer`` / ``AutoModelForCausalLM`` reload,
  and the reloaded model samples exactly what the build measured.
"""

from __future__ import annotations

import json

import pytest
import torch

from verl_credit.envs.service.rollouts import sample_groups
from verl_credit.envs.service.tools import SYSTEM_PROMPT, TOOL_SCHEMAS
from verl_credit.envs.service.user import OPENING_MESSAGE
from verl_credit.verl.cpu import tiny_policy as tp


@pytest.fixture(scope="module")
def episodes() -> list[list[dict]]:
    found, failures, rate = tp.scripted_episodes(tp.service_specs(1), per_spec=4, seed=0)
    assert len(found) == 4 and 1 <= len(failures) <= 4 and 0 < rate < 1
    return found + failures  # 4 successes, then the failures


@pytest.fixture(scope="module")
def tokenizer(episodes):
    return tp.build_tokenizer(tp.rendered_corpus(episodes), vocab_size=1000)


def _tool_calls(messages: list[dict]) -> list[tuple[str, dict]]:
    """(name, arguments) of every tool call of a transcript (arguments: a JSON string or a dict)."""
    calls = [call["function"] for message in messages for call in message.get("tool_calls") or []]
    return [(f["name"], json.loads(a) if isinstance(a := f["arguments"], str) else a) for f in calls]


def test_service_specs_are_the_task_seeds_of_sample_groups():
    assert tp.service_specs(3, "refund", seed=2) == [{"variant": "refund", "seed": s} for s in (2000, 2001, 2002)]
    rollouts = sample_groups(groups=3, group_size=1, seed=0, variant="revision")
    assert [r.record["task"] for r in rollouts] == tp.service_specs(3, "revision", seed=0)
    with pytest.raises(ValueError, match="count"):
        tp.service_specs(0)


def test_template_renders_tool_calls_and_responses_like_qwen(tokenizer):
    messages = [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "hi"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": "a", "type": "function", "function": {"name": "f", "arguments": '{"x": "#W1"}'}},
                {"id": "b", "type": "function", "function": {"name": "g", "arguments": {"y": 2}}},
            ],
        },
        {"role": "tool", "tool_call_id": "a", "name": "f", "content": "one"},
        {"role": "tool", "tool_call_id": "b", "name": "g", "content": "two"},
        {"role": "assistant", "content": "done"},
    ]
    tools = [{"type": "function", "function": {"name": "f", "description": "d"}}]
    text = tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)
    assert text == (
        "<|im_start|>system\nS\n\n# Tools\n<tools>\n"
        '{"type": "function", "function": {"name": "f", "description": "d"}}\n</tools><|im_end|>\n'
        "<|im_start|>user\nhi<|im_end|>\n"
        '<|im_start|>assistant\n<tool_call>\n{"name": "f", "arguments": {"x": "#W1"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "g", "arguments": {"y": 2}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\none\n</tool_response>\n<tool_response>\ntwo\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\ndone<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    # without tools: a plain ChatML system turn
    plain = tokenizer.apply_chat_template(messages[:2], tokenize=False)
    assert plain == "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"


def test_rendered_scripted_episode_parses_back_to_its_tool_calls(tokenizer, episodes):
    raw = next(e for e in sample_groups(1, 8, seed=0, variant="refund") if e.record["reward"] > 0).record["messages"]
    first_call = next(m for m in raw if m.get("tool_calls"))["tool_calls"][0]
    assert isinstance(first_call["function"]["arguments"], str)  # as the scripted agent writes them
    text = tp.render(tokenizer, raw)
    # string and dict arguments render the same JSON object
    assert text == tp.render(tokenizer, tp.normalize_messages(raw))
    assert text.startswith(f"<|im_start|>system\n{SYSTEM_PROMPT}\n\n# Tools\n<tools>\n")
    assert f"<|im_start|>user\n{OPENING_MESSAGE}<|im_end|>\n" in text
    _, parsed = tp.parse_tool_calls(text)
    assert parsed == _tool_calls(raw) and len(parsed) >= 3
    tools = [m for m in raw if m["role"] == "tool"]
    assert text.count("<|im_start|>user\n<tool_response>\n") == len(tools)
    for message in tools:
        assert f"<tool_response>\n{message['content']}\n</tool_response><|im_end|>\n" in text


def test_parse_tool_calls_reads_like_verls_hermes_parser():
    text = 'ok <tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call><tool_call>not json</tool_call>'
    assert tp.parse_tool_calls(text) == ("ok ", [("f", {"a": 1})])
    assert tp.parse_tool_calls("no calls <tool_call>") == ("no calls <tool_call>", [])


def test_tokenizer_keeps_control_tokens_whole(tokenizer, episodes):
    for token in (*tp.CHATML_TOKENS, *tp.TOOL_TOKENS):
        ids = tokenizer.encode(token, add_special_tokens=False)
        assert len(ids) == 1 and tokenizer.decode(ids) == token
    assert tokenizer.convert_ids_to_tokens([0, 1, 2]) == list(tp.CHATML_TOKENS)
    assert (tokenizer.eos_token, tokenizer.pad_token, tokenizer.bos_token) == ("<|im_end|>", "<|endoftext|>", None)
    assert len(tokenizer.encode("\n", add_special_tokens=False)) == 1
    # tool tokens are not special: vLLM-style decoding that skips special tokens keeps them
    sample = '<tool_call>\n{"name": "f"}\n</tool_call><|im_end|>'
    assert tokenizer.decode(tokenizer.encode(sample), skip_special_tokens=True) == sample[: -len("<|im_end|>")]
    # world text is a phrase token: the system prompt with all tool schemas, the opening message
    prompt = tokenizer.encode(tp.render(tokenizer, tp.opening_messages(), add_generation_prompt=True))
    assert tokenizer.convert_ids_to_tokens(prompt)[::4] == ["<|im_start|>"] * 3
    assert len(prompt) == 10
    assert tokenizer.decode(prompt[1]).startswith(f"system\n{SYSTEM_PROMPT}\n\n# Tools\n<tools>\n")
    # deterministic
    corpus = tp.rendered_corpus(episodes[:2])
    assert tp.build_tokenizer(corpus, 400).get_vocab() == tp.build_tokenizer(corpus, 400).get_vocab()


def test_tokenizer_reloads_as_qwen2_tokenizer_with_the_same_ids(tokenizer, episodes, tmp_path):
    """AutoTokenizer loads any tokenizer next to a qwen2 config as Qwen2Tokenizer (its own
    pre-tokenizer): the ids must not change, for world text and for text never seen."""
    from transformers import AutoTokenizer, Qwen2Config

    tokenizer.save_pretrained(tmp_path)
    Qwen2Config(vocab_size=len(tokenizer)).save_pretrained(tmp_path)
    reloaded = AutoTokenizer.from_pretrained(tmp_path)
    assert len(reloaded) == len(tokenizer) and reloaded.eos_token_id == tokenizer.eos_token_id
    texts = [tp.render(tokenizer, e) for e in episodes] + ["Error: order #W0000000 not found 1234  x\n\n\u00e9"]
    for text in texts:
        assert reloaded.encode(text, add_special_tokens=False) == tokenizer.encode(text, add_special_tokens=False)
    assert reloaded.apply_chat_template(episodes[0], tools=tp.AGENT_TOOLS, tokenize=False) == tp.render(
        tokenizer, episodes[0]
    )


def test_assistant_mask_covers_exactly_the_assistant_messages(tokenizer, episodes):
    messages = episodes[0]
    encoded = tp.encode_episode(tokenizer, messages)
    ids, mask = encoded.input_ids, encoded.assistant_mask
    assert len(ids) == len(mask) and not any(mask[: encoded.prompt_length])
    # the sequence is the whole transcript through the last assistant's <|im_end|>
    last = max(i for i, m in enumerate(messages) if m["role"] == "assistant")
    assert tokenizer.decode(ids) == tp.render(tokenizer, messages[: last + 1])[: -len("\n")]
    # each maximal run of 1s is one assistant message exactly as the template writes it
    runs, start = [], None
    for index, flag in enumerate([*mask, 0]):
        if flag and start is None:
            start = index
        elif not flag and start is not None:
            runs.append(tokenizer.decode(ids[start:index]))
            start = None
    assistants = [m for m in messages[: last + 1] if m["role"] == "assistant"]
    assert len(runs) == len(assistants)
    for run, message in zip(runs, assistants, strict=True):
        assert run.endswith("<|im_end|>") and "<|im_start|>" not in run
        _, calls = tp.parse_tool_calls(run)
        assert calls == _tool_calls([message])
        if not message.get("tool_calls"):
            assert run == message["content"] + "<|im_end|>"
    with pytest.raises(ValueError, match="assistant turn"):
        tp.encode_episode(tokenizer, tp.opening_messages())
    # the SFT labels are the masked ids and nothing else
    _, _, labels = tp._batch([encoded], tokenizer.pad_token_id)
    assert labels[0].tolist() == [i if m else -100 for i, m in zip(ids, mask, strict=True)]


def test_agent_tools_are_what_the_agent_loop_renders():
    """The warm-start renders the tools exactly as ``credit_agent`` hands them to the chat template."""
    from verl_credit.verl.agent_loop import EnvironmentTool, prompt_tool_schema

    rendered = [prompt_tool_schema(EnvironmentTool(schema)) for schema in TOOL_SCHEMAS]
    assert json.dumps(tp.AGENT_TOOLS) == json.dumps(rendered)  # same keys in the same order


def test_warm_start_lowers_the_assistant_loss(tokenizer, episodes):
    model = tp.build_model(tokenizer, hidden_size=64, layers=1, seed=0)
    result = tp.warm_start(model, tokenizer, episodes, steps=12, lr=3e-3, seed=0, batch_size=2)
    assert len(result["losses"]) == 12 and result["final_loss"] < result["first_loss"] - 1.0


@pytest.mark.slow
def test_build_tiny_policy_writes_a_reloadable_model(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    specs = tp.service_specs(1)
    facts = tp.build_tiny_policy(
        tmp_path, specs, steps=4, episodes_per_spec=4, vocab_size=800, hidden_size=64, layers=1, samples_per_spec=2
    )
    saved = json.loads((tmp_path / "tiny_policy.json").read_text())
    assert saved == json.loads(json.dumps(facts))
    assert saved["specs"] == specs and saved["steps"] == 4 and 0.0 <= saved["sampled_success_rate"] <= 1.0
    assert len(saved["sampled_rewards"]) == 2

    tokenizer = AutoTokenizer.from_pretrained(tmp_path)
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|endoftext|>"
    assert len(tokenizer) == saved["vocab_size"]
    prompt = tokenizer.apply_chat_template(
        tp.opening_messages(), tools=tp.AGENT_TOOLS, tokenize=True, add_generation_prompt=True, return_dict=False
    )
    assert len(prompt) == saved["prompt_length"]

    model = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert model.dtype == torch.bfloat16 and model.config.model_type == "qwen2"
    assert model.config.tie_word_embeddings and model.config.bos_token_id is None
    assert model.config.eos_token_id == tokenizer.eos_token_id and model.config.max_position_embeddings >= 4096
    assert model.generation_config.eos_token_id == tokenizer.eos_token_id
    assert sum(p.numel() for p in model.parameters()) == saved["parameters"]

    # the checkpoint holds the weights the success rate was measured with: same samples again
    details: list[dict] = []
    rate = tp.sampled_success_rate(model.float(), tokenizer, specs, 2, seed=0, details=details)
    assert rate == saved["sampled_success_rate"]
    assert max(d["response_length"] for d in details) == saved["sampled_response_length"]["max"]
