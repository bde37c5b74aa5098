"""docs/configuration.md against the trainer yaml and the settings dataclasses (``scripts/docs_config.py``).

The document must be what the generator renders now, and must name every key of the yaml's
``credit`` node (walked recursively) and every field of the settings dataclasses; the last tests
show that each of those checks fails on a key the document does not name.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

import verl_credit.config
import verl_credit.verl.settings
from verl_credit.config import IAPOConfig
from verl_credit.config_rules import Number, setting

ROOT = Path(__file__).resolve().parents[2]


def _load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_config", ROOT / "scripts" / "docs_config.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["docs_config"] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


docs_config = _load_script()


@pytest.fixture(scope="module")
def doc() -> str:
    return docs_config.DOC_PATH.read_text(encoding="utf-8")


def test_the_document_is_what_the_generator_renders(doc: str) -> None:
    assert doc == docs_config.render(), "docs/configuration.md is stale: run python scripts/docs_config.py"


def test_every_key_of_the_yaml_credit_node_is_documented(doc: str) -> None:
    keys = docs_config.yaml_credit_keys(docs_config.credit_node())
    assert "credit.call_credit.counterfactual.timeout" in keys  # the walk goes all the way down
    assert "credit.call_credit.omega.RV" in keys
    assert docs_config.missing_keys(doc, keys) == []


def test_every_settings_field_is_documented(doc: str) -> None:
    keys = docs_config.settings_field_keys()
    assert {"credit.layout", "credit.iapo.clip_c", "credit.call_credit.dpo_export.theta_ae"} <= set(keys)
    assert docs_config.missing_keys(doc, keys) == []


def test_every_settings_dataclass_is_reached_by_the_walk() -> None:
    reached = {kind for _, kind in docs_config.settings_sections()}
    reached |= {leaf.owner for leaf in docs_config._leaf_fields(docs_config.CreditSettings, "credit")}
    for module in (verl_credit.config, verl_credit.verl.settings):
        defined = {
            kind
            for kind in vars(module).values()
            if isinstance(kind, type) and dataclasses.is_dataclass(kind) and kind.__module__ == module.__name__
        }
        assert defined <= reached, f"not reachable from CreditSettings: {sorted(k.__name__ for k in defined - reached)}"


def test_the_inlined_credit_math_keys_are_the_ones_load_settings_reads() -> None:
    # every field but plugin_sections (plug-in estimators' sections, each its own credit.<section>)
    top = {field.name for field in dataclasses.fields(verl_credit.config.CreditConfig)} - {"plugin_sections"}
    assert top == set(verl_credit.config.credit_keys())


def test_every_extra_meaning_fills_a_field_without_a_docstring() -> None:
    fields_by_key = {leaf.key: leaf for leaf in docs_config._leaf_fields(docs_config.CreditSettings, "credit")}
    for key in docs_config.EXTRA_MEANINGS:
        assert key in fields_by_key, f"EXTRA_MEANINGS names no field: {key}"
        leaf = fields_by_key[key]
        assert leaf.name not in docs_config.field_docstrings(leaf.owner), f"{key} has a docstring now: drop its entry"


def test_the_estimators_of_the_registry_are_listed(doc: str) -> None:
    for name in ("grpo", "iapo", "call_credit", "gigpo", "turn_reward", "info_gain"):
        assert f"| `{name}` |" in doc


def test_a_yaml_key_without_a_field_is_reported(doc: str, tmp_path: Path) -> None:
    text = docs_config.TRAINER_YAML.read_text(encoding="utf-8")
    assert text.count("\n  iapo:\n") == 1
    extended = tmp_path / "credit_trainer.yaml"
    extended.write_text(text.replace("\n  iapo:\n", "\n  iapo:\n    new_knob: 1\n"), encoding="utf-8")
    keys = docs_config.yaml_credit_keys(docs_config.credit_node(extended))
    assert docs_config.missing_keys(doc, keys) == ["credit.iapo.new_knob"]
    with pytest.raises(ValueError, match=r"no settings field: credit\.iapo\.new_knob"):
        docs_config.render(extended)


def test_a_settings_field_missing_from_the_document_is_reported(doc: str) -> None:
    @dataclasses.dataclass(frozen=True)
    class ExtendedIAPOConfig(IAPOConfig):
        new_field: float = setting(1.0, Number())

    keys = docs_config.settings_field_keys(ExtendedIAPOConfig, "credit.iapo")
    assert docs_config.missing_keys(doc, keys) == ["credit.iapo.new_field"]


def test_a_key_without_a_meaning_stops_the_generator(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(docs_config.EXTRA_MEANINGS, "credit.user.max_tokens")
    with pytest.raises(ValueError, match=r"credit\.user\.max_tokens has no meaning written"):
        docs_config.render()


def test_check_exits_1_naming_a_stale_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "configuration.md"
    monkeypatch.setattr(docs_config, "DOC_PATH", path)
    monkeypatch.setattr(docs_config, "render", lambda: "fresh\n")
    path.write_text("stale\n", encoding="utf-8")
    assert docs_config.main(["--check"]) == 1
    assert f"{path} is stale" in capsys.readouterr().err
    assert docs_config.main([]) == 0
    assert path.read_text(encoding="utf-8") == "fresh\n"
    assert docs_config.main(["--check"]) == 0
