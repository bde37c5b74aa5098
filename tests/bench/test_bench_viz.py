"""``scripts/bench_viz.py`` runs end to end on a small step and reports consistent shares."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

#: slow: runs scripts/bench_viz.py end to end
pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_viz.py"


@pytest.mark.timeout(300)
def test_bench_viz_measures_a_small_step(tmp_path: Path) -> None:
    out = tmp_path / "viz.json"
    command = [sys.executable, str(SCRIPT), "--groups", "2", "--group-size", "2", "--rollouts", "1"]
    command += ["--repeats", "1", "--step-seconds", "4", "--every", "5", "--json", str(out)]
    completed = subprocess.run(command, capture_output=True, text=True, timeout=280, check=False)
    assert completed.returncode == 0, completed.stderr[-2000:]
    figures = json.loads(out.read_text())
    assert figures["sessions"] == 4 and figures["rollouts"] == 1 and figures["estimator"] == "iapo"
    for key in ("record_s", "render_s", "render_cpu_s", "trainer_s", "worker_s"):
        assert math.isfinite(figures[key]) and figures[key] > 0, (key, figures[key])
    # the render is off the trainer's thread: the trainer's share is what submit + drain + record cost
    assert figures["trainer_share_drawn_step"] == pytest.approx((figures["trainer_s"] + figures["record_s"]) / 4)
    assert figures["trainer_share_amortized"] == pytest.approx(figures["trainer_share_drawn_step"] / 5)
    assert figures["render_share_if_inline"] == pytest.approx(figures["render_cpu_s"] / 4)
    assert figures["trainer_s"] < figures["worker_s"]  # drawing is the worker's job, not the trainer's
    last = completed.stdout.strip().splitlines()[-1]
    match = re.fullmatch(
        r"viz cost per drawn step: trainer ([\d.]+) ms \(([\d.]+)% of a 4 s step\), worker ([\d.]+) s", last
    )
    assert match, last
    assert float(match.group(1)) == pytest.approx((figures["trainer_s"] + figures["record_s"]) * 1e3, abs=0.051)
