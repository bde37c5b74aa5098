"""``verl-credit report``: pictures follow the weights, edges and errors; the HTML renders in Chromium."""

from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from matplotlib.colors import to_rgba
from matplotlib.figure import Figure

from verl_credit.cli.main import main
from verl_credit.io import InputError
from verl_credit.report.credit_input import load_credit_lines, parse_credit_line
from verl_credit.report.figures import (
    ABOVE_COLOR,
    BELOW_COLOR,
    EQUAL_COLOR,
    batch_figure,
    draw_trajectory,
    figure_png,
    share_moved,
    trajectory_figure,
)
from verl_credit.report.html import pick_trajectories, render_report


def credit_line(weights, advantage=0.5, graph=None, call_graph=None, reward=1.0, line_id="t1"):
    record = {
        "id": line_id,
        "uid": "g",
        "reward": reward,
        "estimator": "iapo",
        "trajectory_advantage": advantage,
        "actions": [
            {"index": i, "length": 3, "role": None, "weight": w, "advantage": advantage * w}
            for i, w in enumerate(weights)
        ],
        "fallback": False,
        "repaired_edges": 0,
    }
    if graph is not None:
        record["graph"] = graph
    if call_graph is not None:
        record["call_graph"] = call_graph
    return record


GRAPH = {
    "num_actions": 4,
    "errors": [{"action": 1, "kind": "tool_error", "evidence": "order not found"}],
    "direct_user_inputs": {},
    "edges": [
        {"src": 0, "dst": 2, "sign": "+", "type": "input", "unit": "order_id=#W1"},
        {"src": 0, "dst": 3, "sign": "+", "type": "success_utilization", "unit": "payment=card"},
        {"src": 1, "dst": 2, "sign": "-", "type": "failed_utilization", "unit": "#W9"},
    ],
}


def test_bar_colors_follow_the_weights():
    line = parse_credit_line(credit_line([1.3, 0.7, 1.0, 1.0000001 + 1e-3], graph=GRAPH))
    figure = Figure()
    ax = figure.add_subplot()
    drawing = draw_trajectory(ax, line)
    assert drawing.face_colors == [ABOVE_COLOR, BELOW_COLOR, EQUAL_COLOR, ABOVE_COLOR]
    # and that is what the bars on the axes really carry
    bars = [patch for patch in ax.patches if type(patch).__name__ == "Rectangle"]
    assert [bar.get_facecolor() for bar in bars] == [to_rgba(c) for c in drawing.face_colors]
    assert [round(bar.get_height(), 7) for bar in bars] == [1.3, 0.7, 1.0, round(1.0000001 + 1e-3, 7)]


def test_edges_and_errors_are_drawn():
    line = parse_credit_line(credit_line([1.2, 0.8, 1.1, 0.9], graph=GRAPH))
    figure, drawing = trajectory_figure(line)
    assert (drawing.support_arcs, drawing.failed_arcs, drawing.error_marks) == (2, 1, [1])
    arcs = [patch for patch in figure.axes[0].patches if type(patch).__name__ == "PathPatch"]
    assert len(arcs) == 3
    title = figure.axes[0].get_title()
    assert "reward 1" in title and "+0.500" in title


def test_missing_or_mismatched_graph_draws_weights_only():
    no_graph = parse_credit_line(credit_line([1.2, 0.8, 1.0, 1.0]))
    _, drawing = trajectory_figure(no_graph)
    assert (drawing.support_arcs, drawing.failed_arcs, drawing.call_arcs) == (0, 0, 0)
    wrong = parse_credit_line(credit_line([1.0, 1.0], graph=GRAPH))  # graph of 4 actions, line of 2
    assert wrong.graph is None and "graph not drawn" in wrong.notes[0]
    call = {
        "roles": ["IG", "AE", "RV", "IG"],
        "ambiguous": [False] * 4,
        "edges": [{"src": 0, "dst": 1, "kind": "IG->AE", "unit": "a.py"}],
    }
    with_calls = parse_credit_line(credit_line([0.8, 1.4, 1.0, 0.8], call_graph=call))
    _, drawing = trajectory_figure(with_calls)
    assert drawing.call_arcs == 1
    assert with_calls.roles == [None] * 4  # roles come from the actions, not the call graph


def test_malformed_credit_lines_name_line_and_field(tmp_path):
    path = tmp_path / "credit.jsonl"
    bad = credit_line([1.0, 1.0])
    bad["actions"][1]["weight"] = "heavy"
    path.write_text(json.dumps(credit_line([1.0])) + "\n" + json.dumps(bad) + "\n")
    with pytest.raises(InputError, match=r"credit.jsonl:2: actions\[1\].weight"):
        load_credit_lines(path)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(InputError, match="no credit lines"):
        load_credit_lines(empty)


@pytest.mark.slow
def test_share_moved_and_batch_figure():
    # |w - 1| > 0.1 for 1.2 and 0.85 only -> 2 of 4
    assert share_moved(np.array([1.2, 0.85, 1.05, 1.0])) == 0.5
    lines = [
        parse_credit_line(credit_line([1.2, 0.8], advantage=0.7)),
        parse_credit_line(credit_line([1.05, 0.95], advantage=-0.7, reward=0.0, line_id="t2")),
    ]
    png = figure_png(batch_figure({"iapo": lines}))
    assert png[:8] == b"\x89PNG\r\n\x1a\n"


def test_pick_trajectories_alternates_signs():
    lines = [
        parse_credit_line(credit_line([1.0], advantage=a, line_id=f"t{k}"))
        for k, a in enumerate([0.5, 0.4, -0.3, -0.2, 0.0])
    ]
    assert [ln.id for ln in pick_trajectories(lines, 4)] == ["t0", "t2", "t1", "t3"]


def _write_credit(tmp_path: Path) -> Path:
    path = tmp_path / "credit.jsonl"
    records = [
        credit_line([1.2, 0.8, 1.1, 0.9], graph=GRAPH, line_id="t1"),
        credit_line([0.9, 1.1, 1.0, 1.0], advantage=-0.5, reward=0.0, graph=GRAPH, line_id="t2"),
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


@pytest.mark.slow
def test_report_cli_writes_self_contained_html(tmp_path, capsys):
    credit = _write_credit(tmp_path)
    out = tmp_path / "report.html"
    assert main(["report", "--input", str(credit), "--out", str(out)]) == 0
    text = out.read_text()
    images = re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', text)
    assert len(images) == 3  # batch plots + 2 trajectories
    assert all(base64.b64decode(image)[:4] == b"\x89PNG" for image in images)
    assert "http://" not in text and "https://" not in text  # nothing to fetch
    assert "wrote" in capsys.readouterr().out
    assert main(["report", "--input", str(tmp_path / "missing.jsonl"), "--out", str(out)]) == 2


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        found = shutil.which(name)
        if found:
            return found
    return None


def screenshot(html: Path, tmp_path: Path, width: int = 1200, height: int = 2000) -> np.ndarray:
    """Headless Chromium's screenshot of a page (RGB(A) floats); skips the test when there is no
    Chromium. Also used by the CPU training test on the pages a real run wrote."""
    browser = _chromium()
    if browser is None:
        print("SKIP REASON: no chromium binary on PATH (Debian: apt-get install -y chromium)")
        pytest.skip("chromium not found on PATH (install the Debian 'chromium' package)")
    shot = tmp_path / f"{html.stem}.shot.png"
    command = [
        browser,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={tmp_path / 'profile'}",
        f"--screenshot={shot}",
        f"--window-size={width},{height}",
        html.resolve().as_uri(),
    ]
    subprocess.run(command, check=True, timeout=90, capture_output=True)
    from matplotlib.image import imread

    pixels = imread(shot)
    assert pixels.shape[0] == height and pixels.shape[1] == width
    return pixels


def assert_not_blank(pixels: np.ndarray) -> None:
    gray = pixels[..., :3].mean(axis=-1)
    assert gray.std() > 0.05  # a blank page has std 0
    assert (gray < 0.5).mean() > 0.002  # some dark ink (text, bars), not only a tint


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_report_renders_non_blank_in_headless_chromium(tmp_path):
    lines = load_credit_lines(_write_credit(tmp_path))
    html = render_report(lines, tmp_path / "report.html")
    assert_not_blank(screenshot(html, tmp_path))


# -- literal dollar signs (matplotlib would parse $...$ as mathtext) ------------------------------

DEEP_MATH_ID = "$" + "{" * 400 + "x" + "}" * 400 + "$"  # made the report raise RecursionError


def _texts(figure: Figure) -> list[str]:
    from matplotlib.text import Text

    return [text.get_text() for text in figure.findobj(Text) if text.get_text()]


def test_dollar_signs_in_ids_labels_roles_and_names_are_drawn_literally():
    from matplotlib import cbook

    record = credit_line([1.2, 0.8, 1.1, 0.9], graph=GRAPH, line_id=DEEP_MATH_ID)
    record["uid"] = "$task$"
    record["estimator"] = "$iapo$"
    record["actions"][0]["role"] = "$IG$"
    line = parse_credit_line(record)
    line.labels = ["refund $5 or $6", "$\\frac{1}{2}$", "plain", "a$b"]
    figure, _ = trajectory_figure(line)
    assert figure_png(figure)[:4] == b"\x89PNG"
    batch = batch_figure({"$iapo$": [line], "$grpo$ (a $b$ path)": [line]})
    assert figure_png(batch)[:4] == b"\x89PNG"
    texts = _texts(figure) + _texts(batch)
    assert not [text for text in texts if cbook.is_math_text(text)]  # nothing left for mathtext
    shown = " ".join(text.replace(r"\$", "$") for text in texts)  # what matplotlib prints
    for original in ("refund $5 or $6", "$IG$", "$task$", "$iapo$", "$grpo$ (a $b$ path)", DEEP_MATH_ID[:20]):
        assert original in shown, original


def test_report_cli_draws_a_deep_dollar_id(tmp_path):
    path = tmp_path / "credit.jsonl"
    path.write_text(json.dumps(credit_line([1.2, 0.8], line_id=DEEP_MATH_ID)) + "\n")
    assert main(["report", "--input", str(path), "--out", str(tmp_path / "r.html")]) == 0


# -- a trainer dump (credit.debug.dump_dir) -------------------------------------------------------


@pytest.fixture(scope="module")
def dump_dir(tmp_path_factory) -> Path:
    from verl_credit.verl.credit_dump import write_step_dump
    from verl_credit.verl.viz_sample import sample_step_record

    folder = tmp_path_factory.mktemp("dumps")
    for step, seed in ((1, 0), (2, 1)):
        write_step_dump(str(folder), step, sample_step_record(4, 8, estimator="iapo", seed=seed))
    return folder


@pytest.mark.slow
def test_report_cli_draws_a_step_of_a_trainer_dump(dump_dir, tmp_path, capsys):
    out = tmp_path / "dump.html"
    assert main(["report", "--dump-dir", str(dump_dir), "--out", str(out), "--max-trajectories", "4"]) == 0
    text = out.read_text()
    assert "step 2" in text and "32 sessions" in text and "match the trainer" in text  # the last step by default
    images = re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', text)
    assert len(images) == 5 and all(base64.b64decode(image)[:4] == b"\x89PNG" for image in images)
    assert "wrote" in capsys.readouterr().out
    assert main(["report", "--dump-dir", str(dump_dir), "--step", "1", "--out", str(out)]) == 0
    assert "step 1" in out.read_text()


def test_report_cli_names_what_is_wrong_with_a_dump_dir(dump_dir, tmp_path, capsys):
    out = str(tmp_path / "x.html")
    assert main(["report", "--dump-dir", str(dump_dir), "--step", "7", "--out", out]) == 2
    assert "no step 7 (dumped steps: 1, 2)" in capsys.readouterr().err
    assert main(["report", "--dump-dir", str(tmp_path), "--out", out]) == 2
    assert "no step_*.pt file" in capsys.readouterr().err
    assert main(["report", "--input", str(_write_credit(tmp_path)), "--step", "1", "--out", out]) == 2
    assert "--step needs --dump-dir" in capsys.readouterr().err
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "step_3.pt").write_bytes(b"not a torch file")
    assert main(["report", "--dump-dir", str(tmp_path / "bad"), "--out", out]) == 2
    assert "step_3.pt: cannot read the dump" in capsys.readouterr().err
