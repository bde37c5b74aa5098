"""Fixtures for the verl-integration tests (CPU only, nothing downloaded).

* ``chatml_tokenizer``: a byte-level BPE tokenizer trained in code, with Qwen's ChatML special
  tokens, hermes tool-call tokens and a ChatML chat template that renders tools and tool calls
  (the shape of ``verl_probes/probe_mask.py``), so verl's Qwen Continuous-Token builder and
  hermes tool parser run unchanged.
* ``tiny_model``: a random 1-layer Qwen2 built from a config.
* ``orders_env_cls``: registers the scripted ``test_orders`` environment (``verl_helpers``).
* ``ray_tq``: one local Ray (2 CPUs) + TransferQueue for the whole session.
"""

from __future__ import annotations

import pytest
import torch
from verl_helpers import register_test_env

SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
]

CHATML_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n"
    "{{ messages[0]['content'] if messages[0]['role']=='system' else 'You are helpful.' }}"
    "\n# Tools\n{%- for t in tools %}\n{{ t | tojson }}{%- endfor %}<|im_end|>\n"
    "{%- elif messages[0]['role']=='system' %}<|im_start|>system\n{{ messages[0]['content'] }}<|im_end|>\n{%- endif %}"
    "{%- for m in messages %}"
    "{%- if m.role=='user' or (m.role=='system' and not loop.first) %}"
    "<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
    "{%- elif m.role=='assistant' %}<|im_start|>assistant\n{{ m.content }}"
    '{%- if m.tool_calls %}{%- for tc in m.tool_calls %}<tool_call>\n{"name": "{{ tc.function.name }}", '
    '"arguments": {{ tc.function.arguments | tojson }}}\n</tool_call>{%- endfor %}{%- endif %}<|im_end|>\n'
    "{%- elif m.role=='tool' %}{%- if loop.first or messages[loop.index0-1].role!='tool' %}<|im_start|>user{%- endif %}"
    "\n<tool_response>\n{{ m.content }}\n</tool_response>"
    "{%- if loop.last or messages[loop.index0+1].role!='tool' %}<|im_end|>\n{%- endif %}"
    "{%- endif %}{%- endfor %}{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}"
)

_CORPUS = (
    "system user assistant tool hello the answer is 42 refund order card store credit please confirm "
    'get_order order_id status delivered arguments name {} [] " : , \n yes no thanks W12 #W12'
)


@pytest.fixture(scope="session")
def chatml_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=SPECIAL_TOKENS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tokenizer.train_from_iterator([_CORPUS] * 50, trainer)
    hf = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    hf.chat_template = CHATML_TEMPLATE
    return hf


@pytest.fixture(scope="session")
def tiny_model(chatml_tokenizer):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    # The model is tiny: one thread avoids oversubscribing the 2 shared cores (10x faster here).
    torch.set_num_threads(1)
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=len(chatml_tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=2048,
        eos_token_id=chatml_tokenizer.eos_token_id,
        pad_token_id=chatml_tokenizer.pad_token_id,
        tie_word_embeddings=True,
    )
    model = Qwen2ForCausalLM(config)
    model.eval()
    return model


@pytest.fixture(scope="session")
def orders_env_cls():
    return register_test_env()


@pytest.fixture(scope="session")
def ray_tq():
    """A local Ray (2 CPUs) and a TransferQueue with one storage unit, for the whole session.
    Ray's session folder lives in a temp dir of the test's own (removed afterwards), not in
    ``/tmp/ray``."""
    import shutil
    import tempfile

    import ray
    import transfer_queue as tq
    from omegaconf import OmegaConf

    # short path: Ray puts unix sockets under it (108-byte limit)
    ray_tmp = tempfile.mkdtemp(prefix="vcray.", dir="/tmp")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, _temp_dir=ray_tmp)
    tq.init(
        OmegaConf.create(
            {
                "backend": {
                    "storage_backend": "SimpleStorage",
                    "SimpleStorage": {"total_storage_size": 4000, "num_data_storage_units": 1},
                }
            }
        )
    )
    try:
        yield tq
    finally:
        tq.close()
        ray.shutdown()
        shutil.rmtree(ray_tmp, ignore_errors=True)
