"""scripts/prepare_tau2.py: the paper's train split and tau2's test split as verl parquet files.

Expected counts come from the tau2 package's own split files (``split_tasks.json`` of each domain),
read here directly with ``json``, independently of the code under test.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import tau2

ROOT = Path(__file__).resolve().parents[1]
DOMAINS = ("airline", "retail", "telecom")


def _load_script() -> Any:
    spec = importlib.util.spec_from_file_location("prepare_tau2", ROOT / "scripts" / "prepare_tau2.py")
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(module)
    return module


def _split_file(domain: str) -> dict[str, list[str]]:

    path = Path(tau2.__file__).parent / "data" / "tau2" / "domains" / domain / "split_tasks.json"
    return json.loads(path.read_text())


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tau2_data")
    assert _load_script().main(["--out", str(out)]) == 0
    return out


def test_train_is_30_74_74_and_test_is_the_tau2_test_split(prepared: Path) -> None:
    train = pd.read_parquet(prepared / "train.parquet")
    test = pd.read_parquet(prepared / "test.parquet")
    train_counts = train["extra_info"].map(lambda info: info["domain"]).value_counts().to_dict()
    test_counts = test["extra_info"].map(lambda info: info["domain"]).value_counts().to_dict()
    assert train_counts == {"airline": 30, "retail": 74, "telecom": 74} and len(train) == 178
    assert test_counts == {"airline": 20, "retail": 40, "telecom": 40} and len(test) == 100
    for frame, split in ((train, "train"), (test, "test")):
        for domain in DOMAINS:
            ids = [info["task_id"] for info in frame["extra_info"] if info["domain"] == domain]
            assert ids == _split_file(domain)[split]  # same tasks, same order as tau2's split file
    train_ids = {(i["domain"], i["task_id"]) for i in train["extra_info"]}
    test_ids = {(i["domain"], i["task_id"]) for i in test["extra_info"]}
    assert not train_ids & test_ids  # held out


def test_rows_carry_what_the_agent_loop_needs(prepared: Path) -> None:
    from tau2.registry import registry

    train = pd.read_parquet(prepared / "train.parquet")
    assert list(train.columns) == ["data_source", "agent_name", "ability", "prompt", "extra_info"]
    assert set(train["agent_name"]) == {"credit_agent"}
    for domain in DOMAINS:
        rows = train[train["data_source"] == f"tau2/{domain}"]
        info = rows.iloc[0]["extra_info"]
        assert info["env"] == "tau2" and info["split"] == "train"
        policy = registry.get_env_constructor(domain)().get_policy()
        prompt = list(rows.iloc[0]["prompt"])
        assert len(prompt) == 1 and prompt[0]["role"] == "system" and policy in prompt[0]["content"]
        # nothing unread rides along with every rollout (the environment builds prompt and tools)
        assert set(info) == {"env", "domain", "task_id", "split", "index", "reward_basis"}
        assert list(info["reward_basis"]) == (["ENV_ASSERTION"] if domain == "telecom" else ["DB", "COMMUNICATE"])
    assert list(train["extra_info"].map(lambda i: i["index"])) == list(range(178))


def _tiny_chat_tokenizer() -> Any:
    """A byte-level BPE tokenizer trained in code with a ChatML chat template (nothing downloaded)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=600, special_tokens=special, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tokenizer.train_from_iterator(["the policy agent user tool reservation order phone"] * 20, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    fast.chat_template = (
        "{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{%- endfor %}"
        "{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}"
    )
    return fast


@pytest.mark.timeout(180)
def test_verl_rlhf_dataset_reads_the_files(prepared: Path, tmp_path: Path) -> None:
    from omegaconf import OmegaConf
    from verl.utils.dataset.rl_dataset import RLHFDataset, collate_fn

    tokenizer = _tiny_chat_tokenizer()
    config = OmegaConf.create(
        {
            "prompt_key": "prompt",
            "max_prompt_length": 10**6,
            "filter_overlong_prompts": True,
            "filter_overlong_prompts_workers": 1,
            "return_raw_chat": True,
            "cache_dir": str(tmp_path / "cache"),
        }
    )
    dataset = RLHFDataset(str(prepared / "train.parquet"), tokenizer, config)
    assert len(dataset) == 178
    row = dataset[0]
    assert row["raw_prompt"][0]["role"] == "system" and row["data_source"] == "tau2/airline"
    assert (
        row["extra_info"]["domain"] == "airline" and row["extra_info"]["task_id"] == _split_file("airline")["train"][0]
    )
    assert row["agent_name"] == "credit_agent"
    batch = collate_fn([dataset[i] for i in range(4)])
    assert [info["task_id"] for info in batch["extra_info"]] == _split_file("airline")["train"][:4]

    # the length filter really tokenizes the rows: with a 1000-token budget every system prompt is too long
    config.max_prompt_length = 1000
    assert len(RLHFDataset(str(prepared / "test.parquet"), tokenizer, config)) == 0


def test_bad_domains_are_rejected(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _load_script().main(["--out", str(tmp_path), "--domains", "airline,bank"]) == 2
    assert "--domains must be a subset" in capsys.readouterr().err
    assert not (tmp_path / "train.parquet").exists()


def test_one_domain_only(tmp_path: Path) -> None:
    assert _load_script().main(["--out", str(tmp_path), "--domains", "airline"]) == 0
    assert len(pd.read_parquet(tmp_path / "train.parquet")) == 30
    assert len(pd.read_parquet(tmp_path / "test.parquet")) == 20
