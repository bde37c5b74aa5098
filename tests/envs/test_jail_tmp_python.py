"""The namespace jail keeps a Python installation that lives under /tmp visible (read-only).

CI clones the project (and creates its venv) wherever it likes, possibly under /tmp, which the
jail replaces with a private tmpfs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from verl_credit.envs.coding.jail import namespace_jail_available

#: slow: starts the namespace jail
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]

PROBE = """
import json, sys
from pathlib import Path
from verl_credit.envs.coding.jail import python_dirs_under_tmp, run_jailed
root = Path(sys.argv[1])
result = run_jailed("python -c 'import sys; print(sys.prefix)' && touch \\"$(dirname $(command -v python))/x\\"",
                    root, mode="namespace", timeout_s=20)
print(json.dumps({"kept": python_dirs_under_tmp(), "exit": result.exit_code, "output": result.output}))
"""


@pytest.mark.timeout(120)
@pytest.mark.skipif(not namespace_jail_available(), reason="namespace jail not available on this machine")
def test_python_under_tmp_is_visible_and_read_only_in_the_jail(tmp_path: Path) -> None:
    assert str(tmp_path).startswith("/tmp/")
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False, system_site_packages=True).create(env_dir)
    python = env_dir / "bin" / "python"
    root = tmp_path / "root"  # the jailed command's working directory (removed with tmp_path)
    root.mkdir()
    completed = subprocess.run(
        [str(python), "-c", PROBE, str(root)],
        capture_output=True,
        text=True,
        timeout=100,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), *sys.path[1:]])},
    )
    assert completed.returncode == 0, completed.stderr
    report = json.loads(completed.stdout.strip().splitlines()[-1])
    assert str(env_dir) in report["kept"]
    # python ran inside the jail from the venv under /tmp ...
    assert str(env_dir) in report["output"]
    # ... and that venv is read-only there: the touch failed, nothing was created outside the jail
    assert report["exit"] != 0
    assert not (env_dir / "bin" / "x").exists()
