"""Annotator audit metrics against hand-computed values (docs/design.md section 8 definitions)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from verl_credit.cli.main import main
from verl_credit.config import IAPOConfig
from verl_credit.credit_math.iapo import compute_iapo_weights_reference
from verl_credit.graph import validate_graph
from verl_credit.report.audit import (
    AUDIT_KEYS,
    audit_graph_sets,
    audit_to_json,
    candidate_pair_labels,
    compute_cohen_kappa,
    compute_route_weights,
    compute_spearman,
    load_graph_set,
)


def graph(n: int, edges: list[tuple[int, int, str]]) -> dict[str, Any]:
    return {
        "num_actions": n,
        "errors": [],
        "direct_user_inputs": {},
        "edges": [
            {
                "src": s,
                "dst": d,
                "sign": sign,
                "type": "input" if sign == "+" else "failed_utilization",
                "unit": f"u{s}{d}",
            }
            for s, d, sign in edges
        ],
    }


# Reference R and other O over the same trajectories (the validator adds e_i = 1 at every "-" source):
#   R.t1: 0->1 +, 0->2 +, 1->2 -      O.t1: 0->1 +, 1->2 -
#   R.t2: 0->1 +                      O.t2: 0->1 -
#   R.t3: no edges (2 actions)        O.t3: null (a parse failure)
#                                     O.t9: not in the reference (ignored)
REFERENCE = [
    {"id": "t1", "annotator": "human", "graph": graph(3, [(0, 1, "+"), (0, 2, "+"), (1, 2, "-")])},
    {"id": "t2", "annotator": "human", "graph": graph(2, [(0, 1, "+")])},
    {"id": "t3", "annotator": "human", "graph": graph(2, [])},
]
OTHER = [
    {"id": "t1", "annotator": "llm", "graph": graph(3, [(0, 1, "+"), (1, 2, "-")])},
    {"id": "t2", "annotator": "llm", "graph": graph(2, [(0, 1, "-")])},
    {"id": "t3", "annotator": "llm", "graph": None, "error": "timeout"},
    {"id": "t9", "annotator": "llm", "graph": graph(2, [])},
]

# Hand computation (compared trajectories t1, t2; t3 lacks O's graph):
# edges  R = {t1(0,1,+), t1(0,2,+), t1(1,2,-), t2(0,1,+)}, O = {t1(0,1,+), t1(1,2,-), t2(0,1,-)}
#        |R & O| = 2 -> F1 = 2*2/(4+3) = 4/7 ; Jaccard = 2/(4+3-2) = 2/5
EDGE_F1 = 4 / 7
JACCARD = 2 / 5
# kappa  pairs t1(0,1) t1(0,2) t1(1,2) t2(0,1): R = [+, +, -, +], O = [+, none, -, -]
#        p_o = 2/4 ; p_e = (R+ O+ + R- O- + Rnone Onone)/16 = (3*1 + 1*2 + 0*1)/16 = 5/16
#        kappa = (1/2 - 5/16)/(1 - 5/16) = (3/16)/(11/16) = 3/11
KAPPA = 3 / 11
# m (lengths 1, c = 0.25). A feature taking two values over 3 actions has |z| = sqrt(2) (the
# singleton) and 1/sqrt(2) (the pair), both clipped to 0.25; over 2 actions |z| = 1 -> 0.25.
#   one high of 3:  m = e^.25/((e^.25 + 2e^-.25)/3) = 1.355588, e^-.25/(...) = 0.822206
#   two high of 3:  m = e^.25/((2e^.25 + e^-.25)/3) = 1.150955, 0.698090
#   one high of 2:  m = e^.25/((e^.25 + e^-.25)/2) = 1.244919, 0.755081 ; constant feature: m = 1
# phi+ = log(1 + d+ + din):  R.t1 = [log3, log2, log2] -> m+ = [1.355588, 0.822206, 0.822206]
#                            R.t2 = [log2, log2]       -> m+ = [1, 1]
#                            O.t1 = [log2, log2, 0]    -> m+ = [1.150955, 1.150955, 0.698090]
#                            O.t2 = [0, 0]             -> m+ = [1, 1]
# ranks (ties averaged):  R m+ = [5, 1.5, 1.5, 3.5, 3.5], O m+ = [4.5, 4.5, 1, 2.5, 2.5]; mean 3
#   deviations R = [2, -1.5, -1.5, .5, .5], O = [1.5, 1.5, -2, -.5, -.5]
#   rho = (3 - 2.25 + 3 - .25 - .25) / sqrt(9 * 9) = 3.25 / 9
SPEARMAN_M_POS = 3.25 / 9
# phi- = log(1 + e (1 + d- + din)):  R.t1 = [0, log4, 0] -> m- = [0.822206, 1.355588, 0.822206]
#                                    R.t2 = [0, 0] -> [1, 1]
#                                    O.t1 = [0, log4, 0] -> same as R.t1
#                                    O.t2 = [log3, 0] -> m- = [1.244919, 0.755081]
# ranks: R m- = [1.5, 5, 1.5, 3.5, 3.5], O m- = [2.5, 5, 2.5, 4, 1]
#   deviations R = [-1.5, 2, -1.5, .5, .5], O = [-.5, 2, -.5, 1, -2]
#   rho = (.75 + 4 + .75 + .5 - 1) / sqrt(9 * 9.5) = 5 / sqrt(85.5)
SPEARMAN_M_NEG = 5 / math.sqrt(85.5)
# w+ = L m+ exp(-0.05 psi-) / sum(...), psi- = phi- - mean(phi-):
#   R.t1: psi- = [-log4/3, 2log4/3, -log4/3] -> w+ = [1.380933, 0.781488, 0.837578] sides (+, -, -)
#   R.t2: uniform -> [1, 1] sides (0, 0)
#   O.t1: same psi- -> w+ = [1.181305, 1.102197, 0.716498] sides (+, +, -)
#   O.t2: m+ = 1, psi- = [log3/2, -log3/2] -> w+ = [0.972542, 1.027458] sides (-, +)
#   same side: t1 actions 0 and 2 -> 2 of 5
SIGN_AGREEMENT = 2 / 5


def write_jsonl(path: Path, records: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


@pytest.fixture
def files(tmp_path: Path) -> tuple[Path, Path, Path]:
    reference = write_jsonl(tmp_path / "human.jsonl", REFERENCE)
    other = write_jsonl(tmp_path / "llm.jsonl", OTHER)
    copy = write_jsonl(tmp_path / "rules.jsonl", [dict(r, annotator="rules") for r in REFERENCE])
    return reference, other, copy


def test_metrics_match_the_hand_computation(files: tuple[Path, Path, Path]) -> None:
    reference, other, copy = files
    rows = audit_graph_sets([load_graph_set(reference), load_graph_set(other), load_graph_set(copy)])
    assert [row.label for row in rows] == ["human", "llm", "rules"]
    llm = rows[1]
    assert (llm.trajectories, llm.compared, llm.ignored_ids) == (3, 2, 1)
    expected = {
        "edge_f1": EDGE_F1,
        "jaccard": JACCARD,
        "kappa": KAPPA,
        "spearman_m_pos": SPEARMAN_M_POS,
        "spearman_m_neg": SPEARMAN_M_NEG,
        "sign_agreement": SIGN_AGREEMENT,
        "parse_rate": 2 / 3,
    }
    for key, value in expected.items():
        assert llm.metrics[key] == pytest.approx(value, abs=1e-9), key
    # a copy of the reference agrees perfectly
    for key in AUDIT_KEYS:
        assert rows[2].metrics[key] == pytest.approx(1.0), key
    assert rows[0].metrics["parse_rate"] == 1.0


def test_route_weights_match_the_hand_values() -> None:
    ref_t1, _ = validate_graph(REFERENCE[0]["graph"], 3)
    other_t2, _ = validate_graph(OTHER[1]["graph"], 2)
    weights = compute_route_weights([ref_t1, other_t2], [[1, 1, 1], [1, 1]], IAPOConfig())
    assert weights["m_plus"][0] == pytest.approx([1.355588, 0.822206, 0.822206], abs=1e-6)
    assert weights["m_minus"][1] == pytest.approx([1.244919, 0.755081], abs=1e-6)
    assert weights["w_plus"][0] == pytest.approx([1.380933, 0.781488, 0.837578], abs=1e-6)
    assert weights["w_plus"][1] == pytest.approx([0.972542, 1.027458], abs=1e-6)


def test_token_lengths_enter_the_weights() -> None:
    ref_t1, _ = validate_graph(REFERENCE[0]["graph"], 3)
    lengths = [3, 1, 1]
    weights = compute_route_weights([ref_t1], [lengths], IAPOConfig())["w_plus"][0]
    d_plus, d_minus, d_in = (list(v) for v in ref_t1.degrees())
    expected = compute_iapo_weights_reference(1.0, d_plus, d_minus, d_in, list(ref_t1.error_indicator()), lengths)
    assert weights == pytest.approx(expected, rel=1e-9)
    assert sum(L * w for L, w in zip(lengths, weights, strict=True)) == pytest.approx(5.0)  # mass conservation
    assert weights != pytest.approx(compute_route_weights([ref_t1], [[1, 1, 1]], IAPOConfig())["w_plus"][0])


def test_kappa_and_spearman_small_cases() -> None:
    # kappa of identical single-label lists is 1 by convention; no pairs -> undefined
    assert compute_cohen_kappa(["none"] * 4, ["none"] * 4) == 1.0
    assert math.isnan(compute_cohen_kappa([], []))
    # a = [1, 2, 2, 3] -> ranks [1, 2.5, 2.5, 4]; b = [1, 3, 2, 4] -> ranks [1, 3, 2, 4]; mean 2.5
    # rho = (2.25 + 0 + 0 + 2.25) / sqrt(4.5 * 5) = 4.5 / sqrt(22.5)
    assert compute_spearman([1, 2, 2, 3], [1, 3, 2, 4]) == pytest.approx(4.5 / math.sqrt(22.5))
    assert compute_spearman([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    assert math.isnan(compute_spearman([1, 1, 1], [1, 2, 3]))
    # a pair carrying both signs is its own label
    both, _ = validate_graph(graph(3, [(0, 2, "+"), (0, 2, "-")]), 3)
    assert candidate_pair_labels(both) == ["none", "+-", "none"]


def test_json_has_exactly_the_audit_keys(files: tuple[Path, Path, Path]) -> None:
    reference, other, _ = files
    rows = audit_graph_sets([load_graph_set(reference), load_graph_set(other)])
    out = audit_to_json(rows)
    assert list(out) == list(AUDIT_KEYS)
    assert out["edge_f1"] == {"llm": pytest.approx(EDGE_F1, abs=1e-6)}
    assert out["parse_rate"] == {"human": 1.0, "llm": pytest.approx(2 / 3, abs=1e-6)}


def test_cli_audit_prints_a_table_and_writes_json(
    files: tuple[Path, Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    reference, other, copy = files
    out = tmp_path / "audit" / "audit.json"
    assert main(["audit", str(reference), str(other), str(copy), "--json", str(out)]) == 0
    table = capsys.readouterr().out
    assert "human (ref)" in table and "0.571" in table and "66.7%" in table
    assert "llm: 1 id(s) not in the reference were ignored" in table
    data = json.loads(out.read_text())
    assert set(data) == set(AUDIT_KEYS)
    assert data["kappa"]["llm"] == pytest.approx(KAPPA, abs=1e-6) and data["kappa"]["rules"] == 1.0
    assert data["spearman_m_neg"]["llm"] == pytest.approx(SPEARMAN_M_NEG, abs=1e-6)


def test_cli_audit_with_rollout_lengths(files: tuple[Path, Path, Path], tmp_path: Path) -> None:
    reference, other, _ = files
    rollouts = []
    for record in REFERENCE:
        n = record["graph"]["num_actions"]
        messages = [{"role": "user", "content": "go"}]
        messages += [{"role": "assistant", "content": f"step {i}"} for i in range(n)]
        rollouts.append({"id": record["id"], "reward": 1.0, "messages": messages, "action_token_lengths": [2] * n})
    path = write_jsonl(tmp_path / "rollouts.jsonl", rollouts)
    out = tmp_path / "a.json"
    assert main(["audit", str(reference), str(other), "--rollouts", str(path), "--json", str(out)]) == 0
    # equal lengths (2 each) give the same weights as length 1
    assert json.loads(out.read_text())["sign_agreement"]["llm"] == pytest.approx(SIGN_AGREEMENT)


def test_bad_graph_files_name_the_file_and_line(
    files: tuple[Path, Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    reference, _, _ = files
    duplicate = write_jsonl(tmp_path / "dup.jsonl", [OTHER[0], OTHER[1], OTHER[0]])
    assert main(["audit", str(reference), str(duplicate)]) == 2
    assert f"{duplicate}:3" in capsys.readouterr().err
    # a graph of another size than the reference's for the same id
    wrong = write_jsonl(tmp_path / "wrong.jsonl", [OTHER[0], {"id": "t2", "annotator": "x", "graph": graph(4, [])}])
    assert main(["audit", str(reference), str(wrong)]) == 2
    err = capsys.readouterr().err
    assert f"{wrong}:2" in err and "num_actions" in err
    # a single file is not an audit: argparse rejects it, and so does the library
    with pytest.raises(SystemExit):
        main(["audit", str(reference)])
    with pytest.raises(ValueError, match="at least two"):
        audit_graph_sets([load_graph_set(reference)])


def test_rollouts_size_mismatch_is_reported(
    files: tuple[Path, Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    reference, other, _ = files
    rollouts = [{"id": r["id"], "reward": 0.0, "messages": [{"role": "assistant", "content": "x"}]} for r in REFERENCE]
    path = write_jsonl(tmp_path / "r.jsonl", rollouts)
    assert main(["audit", str(reference), str(other), "--rollouts", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{reference}:1" in err and "num_actions" in err and "1 actions in the rollouts" in err


def test_reference_ids_must_be_in_the_rollouts(
    files: tuple[Path, Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    reference, other, _ = files
    only_t1 = [{"id": "t1", "reward": 0.0, "messages": [{"role": "assistant", "content": "x"}] * 3}]
    path = write_jsonl(tmp_path / "r1.jsonl", only_t1)
    assert main(["audit", str(reference), str(other), "--rollouts", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{reference}:2" in err and "'t2' is not in the rollouts" in err
