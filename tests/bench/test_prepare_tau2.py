"""scripts/prepare_tau2.py: tau2's train split (less a validation split carved out of it) and its
test split as verl parquet files.

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

#: slow: tau2 data through verl's dataset reader
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
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


def _counts(frame: pd.DataFrame) -> dict[str, int]:
    return frame["extra_info"].map(lambda info: info["domain"]).value_counts().to_dict()


def _ids(frame: pd.DataFrame, domain: str | None = None) -> list[tuple[str, str]]:
    return [(i["domain"], i["task_id"]) for i in frame["extra_info"] if domain in (None, i["domain"])]


def test_val_is_carved_out_of_train_and_test_is_the_tau2_test_split(prepared: Path) -> None:
    train = pd.read_parquet(prepared / "train.parquet")
    val = pd.read_parquet(prepared / "val.parquet")
    test = pd.read_parquet(prepared / "test.parquet")
    # the stated sizes: 5 / 10 / 10 of tau2's 30 / 74 / 74 train tasks validate, the rest train
    assert _counts(val) == {"airline": 5, "retail": 10, "telecom": 10} and len(val) == 25
    assert _counts(train) == {"airline": 25, "retail": 64, "telecom": 64} and len(train) == 153
    assert _counts(test) == {"airline": 20, "retail": 40, "telecom": 40} and len(test) == 100
    for domain in DOMAINS:
        split = _split_file(domain)
        # train + val are tau2's train split, disjoint, each in the split file's order
        carved = {task for _, task in _ids(val, domain)}
        assert [task for _, task in _ids(train, domain)] == [t for t in split["train"] if t not in carved]
        assert [task for _, task in _ids(val, domain)] == [t for t in split["train"] if t in carved]
        assert [task for _, task in _ids(test, domain)] == split["test"]
    assert not set(_ids(train)) & set(_ids(val)) and not (set(_ids(train)) | set(_ids(val))) & set(_ids(test))
    for frame, split_name in ((train, "train"), (val, "val"), (test, "test")):
        assert set(frame["extra_info"].map(lambda i: i["split"])) == {split_name}
        assert list(frame["extra_info"].map(lambda i: i["index"])) == list(range(len(frame)))


def test_the_validation_draw_is_fixed_by_its_seed(prepared: Path, tmp_path: Path) -> None:
    script = _load_script()
    assert script.main(["--out", str(tmp_path / "again")]) == 0
    assert _ids(pd.read_parquet(tmp_path / "again" / "val.parquet")) == _ids(pd.read_parquet(prepared / "val.parquet"))
    assert script.main(["--out", str(tmp_path / "other"), "--val-seed", "1"]) == 0
    assert _ids(pd.read_parquet(tmp_path / "other" / "val.parquet")) != _ids(pd.read_parquet(prepared / "val.parquet"))


def test_val_tasks_zero_keeps_the_papers_178_train_tasks(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = _load_script()
    (tmp_path / "val.parquet").write_bytes(b"stale")  # a file of an earlier carve must not survive
    assert script.main(["--out", str(tmp_path), "--val-tasks", "airline=0,retail=0,telecom=0"]) == 0
    assert len(pd.read_parquet(tmp_path / "train.parquet")) == 178 and not (tmp_path / "val.parquet").exists()
    assert script.main(["--out", str(tmp_path), "--val-tasks", "airline=30"]) == 2
    assert "--val-tasks airline=30: airline has 30 train tasks; take 0 to 29" in capsys.readouterr().err
    assert script.main(["--out", str(tmp_path), "--val-tasks", "bank=3"]) == 2
    assert "expected DOMAIN=COUNT" in capsys.readouterr().err


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
    assert list(train["extra_info"].map(lambda i: i["index"])) == list(range(153))


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
    assert len(dataset) == 153
    row = dataset[0]
    assert row["raw_prompt"][0]["role"] == "system" and row["data_source"] == "tau2/airline"
    airline_train = [task for _, task in _ids(pd.read_parquet(prepared / "train.parquet"), "airline")]
    assert row["extra_info"]["domain"] == "airline" and row["extra_info"]["task_id"] == airline_train[0]
    assert row["agent_name"] == "credit_agent"
    batch = collate_fn([dataset[i] for i in range(4)])
    assert [info["task_id"] for info in batch["extra_info"]] == airline_train[:4]

    # the length filter really tokenizes the rows: with a 1000-token budget every system prompt is too long
    config.max_prompt_length = 1000
    assert len(RLHFDataset(str(prepared / "test.parquet"), tokenizer, config)) == 0


def test_bad_domains_are_rejected(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _load_script().main(["--out", str(tmp_path), "--domains", "airline,bank"]) == 2
    assert "--domains must be a subset" in capsys.readouterr().err
    assert not (tmp_path / "train.parquet").exists()


def test_one_domain_only(tmp_path: Path) -> None:
    assert _load_script().main(["--out", str(tmp_path), "--domains", "airline"]) == 0
    assert len(pd.read_parquet(tmp_path / "train.parquet")) == 25
    assert len(pd.read_parquet(tmp_path / "val.parquet")) == 5
    assert len(pd.read_parquet(tmp_path / "test.parquet")) == 20
