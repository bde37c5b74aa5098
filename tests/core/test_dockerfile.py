"""Lint docker/Dockerfile (no Docker engine on CI): a small hadolint-like checker written here.

Rules (hadolint ids where one exists): the base image is pinned to a tag that is not ``latest``
(DL3006/DL3007) and is verl's vLLM image whose vLLM version matches our ``gpu`` extra; the package is
installed with ``.[gpu,tau2]``; pip runs without a cache (DL3042); ``COPY`` not ``ADD`` (DL3020);
``CMD``/``ENTRYPOINT`` in exec form (DL3025); a ``pipefail`` shell before any piped ``RUN`` (DL4006);
no ``apt-get upgrade`` (DL3005), ``apt-get install`` with ``-y --no-install-recommends`` (DL3014/DL3015);
no ``sudo`` (DL3004); no ``cd`` in ``RUN`` (DL3003); absolute ``WORKDIR`` (DL3000); ``ENV key=value``;
no ``MAINTAINER`` (DL4000); every ``COPY`` source exists in the build context (the repository root).
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import pytest

try:
    import tomllib
except ImportError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "docker" / "Dockerfile"


@dataclass(frozen=True)
class Instruction:
    line: int
    keyword: str
    args: str


def parse_dockerfile(text: str) -> list[Instruction]:
    """Instructions with continuation lines joined; comments and blank lines dropped."""
    instructions: list[Instruction] = []
    buffer, start = "", 0
    for number, raw in enumerate(text.splitlines(), start=1):
        stripped = raw.strip()
        if not buffer and (not stripped or stripped.startswith("#")):
            continue
        if buffer and stripped.startswith("#"):
            continue  # comment inside a continued instruction
        if not buffer:
            start = number
        if stripped.endswith("\\"):
            buffer += stripped[:-1] + " "
            continue
        buffer += stripped
        keyword, _, args = buffer.partition(" ")
        instructions.append(Instruction(start, keyword.upper(), args.strip()))
        buffer = ""
    if buffer:
        raise ValueError(f"line {start}: instruction ends with a dangling continuation")
    return instructions


def resolve_base_image(instructions: list[Instruction]) -> str:
    """The FROM image with ``${ARG}`` defaults substituted."""
    defaults: dict[str, str] = {}
    for instruction in instructions:
        if instruction.keyword == "ARG" and "=" in instruction.args:
            name, _, value = instruction.args.partition("=")
            defaults[name.strip()] = value.strip().strip('"')
        if instruction.keyword == "FROM":
            image = instruction.args.split()[0]
            return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: defaults.get(m.group(1) or m.group(2), ""), image)
    raise ValueError("no FROM instruction")


def image_tag(image: str) -> str:
    """``"repo/name:tag@sha256:..." -> "tag"``; ``""`` without a tag (a registry port is not a tag)."""
    last = image.partition("@")[0].split("/")[-1]
    return last.rpartition(":")[2] if ":" in last else ""


def lint(text: str, context: Path = ROOT) -> list[str]:
    """Problems found in a Dockerfile (empty list: clean)."""
    problems: list[str] = []
    instructions = parse_dockerfile(text)
    keywords = [i.keyword for i in instructions]
    if not instructions or keywords[0] not in ("FROM", "ARG"):
        problems.append("the first instruction must be FROM (or ARG for the base image)")
    image = resolve_base_image(instructions)
    tag = image_tag(image)
    if "@sha256:" not in image and not tag:
        problems.append(f"DL3006 base image {image!r} has no tag")
    if tag == "latest" or "latest" in tag.split("."):
        problems.append(f"DL3007 base image {image!r} uses a latest tag")
    env_no_cache = any(i.keyword == "ENV" and "PIP_NO_CACHE_DIR=1" in i.args for i in instructions)
    shell_pipefail = False
    installs_extras = False
    for instruction in instructions:
        where = f"line {instruction.line}"
        if instruction.keyword == "ADD":
            problems.append(f"DL3020 {where}: use COPY instead of ADD")
        if instruction.keyword == "MAINTAINER":
            problems.append(f"DL4000 {where}: MAINTAINER is deprecated")
        if instruction.keyword in ("CMD", "ENTRYPOINT"):
            try:
                if not isinstance(json.loads(instruction.args), list):
                    raise ValueError
            except ValueError:
                problems.append(f"DL3025 {where}: {instruction.keyword} must use the JSON (exec) form")
        if instruction.keyword == "SHELL" and "pipefail" in instruction.args:
            shell_pipefail = True
        if instruction.keyword == "WORKDIR" and not instruction.args.startswith(("/", "$")):
            problems.append(f"DL3000 {where}: WORKDIR must be absolute")
        if instruction.keyword == "ENV":
            first = instruction.args.split()[0] if instruction.args else ""
            if "=" not in first:
                problems.append(f"{where}: use ENV key=value")
        if instruction.keyword == "COPY":
            parts = [p for p in shlex.split(instruction.args) if not p.startswith("--")]
            for source in parts[:-1]:
                if not (context / source).exists():
                    problems.append(f"{where}: COPY source {source!r} is not in the build context")
        if instruction.keyword != "RUN":
            continue
        command = instruction.args
        if "|" in command.replace("||", "") and not shell_pipefail:
            problems.append(f"DL4006 {where}: set SHELL with -o pipefail before piped RUN")
        if re.search(r"\bsudo\b", command):
            problems.append(f"DL3004 {where}: do not use sudo")
        if re.search(r"(^|&&|;)\s*cd\s", command):
            problems.append(f"DL3003 {where}: use WORKDIR instead of cd")
        if re.search(r"apt-get\s+(dist-)?upgrade", command):
            problems.append(f"DL3005 {where}: do not apt-get upgrade")
        for segment in re.split(r"&&|;", command):
            if "apt-get install" in segment and not ("-y" in segment and "--no-install-recommends" in segment):
                problems.append(f"DL3014/DL3015 {where}: apt-get install needs -y --no-install-recommends")
            if re.search(r"\bpip3?\s+install\b", segment):
                if "--no-cache-dir" not in segment and not env_no_cache:
                    problems.append(f"DL3042 {where}: pip install without --no-cache-dir")
                if re.search(r"""["']?\.\[gpu,tau2\]["']?""", segment):
                    installs_extras = True
    if not installs_extras:
        problems.append('the image must pip install ".[gpu,tau2]"')
    return problems


def test_our_dockerfile_is_clean() -> None:
    assert lint(DOCKERFILE.read_text()) == []


def test_base_image_is_verls_vllm_image_matching_our_pins() -> None:
    image = resolve_base_image(parse_dockerfile(DOCKERFILE.read_text()))
    assert image == "verlai/verl:vllm024.dev2"
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    gpu = pyproject["project"]["optional-dependencies"]["gpu"]
    vllm_pin = next(req for req in gpu if req.startswith("vllm=="))  # "vllm==0.24.0"
    major, minor = vllm_pin.removeprefix("vllm==").split(".")[:2]
    assert image.split(":")[1].startswith(f"vllm{major}{minor:0>2}")  # vllm024 <-> 0.24
    assert "verl==0.9.1" in pyproject["project"]["dependencies"]


def test_constraints_keep_the_torch_verl_0_9_1_pins() -> None:
    """verl 0.9.1's ``vllm`` extra pins torch; the image must not let pip move it."""
    requires = metadata.requires("verl") or []
    torch_pin = next(r.split(";")[0].strip() for r in requires if r.startswith("torch==") and 'extra == "vllm"' in r)
    text = DOCKERFILE.read_text()
    assert torch_pin in text  # torch==2.11.0
    assert "--constraint /tmp/constraints.txt" in text


def _constraints(text: str) -> dict[str, str]:
    """``{package: version}`` the Dockerfile writes into /tmp/constraints.txt (its ``printf`` RUN)."""
    run = next(i.args for i in parse_dockerfile(text) if i.keyword == "RUN" and "/tmp/constraints.txt" in i.args)
    return dict(word.split("==", 1) for word in shlex.split(run) if "==" in word)


def _lock_versions() -> dict[str, str]:
    """``{package: version}`` of the CPU lock (recipes/cpu/requirements.lock)."""
    lock = (ROOT / "recipes" / "cpu" / "requirements.lock").read_text()
    return dict(re.findall(r"^([A-Za-z0-9_.\-]+)==([^\s\\]+)", lock, flags=re.MULTILINE))


def test_constraints_pin_transformers_and_transferqueue_to_the_cpu_locks_versions() -> None:
    """pip must not float the pure-Python parts of the tested stack away (transformers<5.11 and
    transferqueue>=0.1.10 are ranges): the image pins the CPU lock's versions of them."""
    pins = _constraints(DOCKERFILE.read_text())
    lock = _lock_versions()
    for package in ("transformers", "TransferQueue", "tensordict"):
        assert pins.get(package) == lock[package], (package, pins, lock.get(package))
    assert (
        pins["torch"] == "2.11.0" and pins["vllm"] == "0.24.0"
    )  # the base image's CUDA builds, not the lock's CPU ones
    # and the pins satisfy the package's own ranges (verl 0.9.1's and ours)
    from packaging.requirements import Requirement

    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    for requirement in map(Requirement, pyproject["project"]["dependencies"]):
        version = next((v for name, v in pins.items() if name.lower() == requirement.name.lower()), None)
        if version is not None:
            assert requirement.specifier.contains(version), (str(requirement), version)


def test_dockerfile_states_the_host_driver_the_cuda_base_needs() -> None:
    header = DOCKERFILE.read_text().split("FROM")[0]
    assert "CUDA 13.0" in header and "NVIDIA driver" in header
    (driver,) = re.findall(r">= (\d+)\.(\d+)\.(\d+)", header)
    assert int(driver[0]) >= 580  # CUDA 13.0 needs the R580 branch
    assert "--gpus all" in header


@pytest.mark.parametrize(
    ("dockerfile", "rule"),
    [
        ('FROM verlai/verl:latest\nRUN pip install --no-cache-dir ".[gpu,tau2]"\n', "DL3007"),
        ('FROM verlai/verl\nRUN pip install --no-cache-dir ".[gpu,tau2]"\n', "DL3006"),
        ('ARG B=verlai/verl:vllm024.latest\nFROM ${B}\nRUN pip install --no-cache-dir ".[gpu,tau2]"\n', "DL3007"),
        ('FROM a:1\nRUN pip install ".[gpu,tau2]"\n', "DL3042"),
        ('FROM a:1\nRUN pip install --no-cache-dir ".[gpu]"\n', ".[gpu,tau2]"),
        ('FROM a:1\nADD x.tar /x\nRUN pip install --no-cache-dir ".[gpu,tau2]"\n', "DL3020"),
        ('FROM a:1\nRUN pip install --no-cache-dir ".[gpu,tau2]"\nCMD bash\n', "DL3025"),
        ('FROM a:1\nRUN pip install --no-cache-dir ".[gpu,tau2]" | tee log\n', "DL4006"),
        (
            'FROM a:1\nRUN apt-get update && apt-get upgrade -y\nRUN pip install --no-cache-dir ".[gpu,tau2]"\n',
            "DL3005",
        ),
        ('FROM a:1\nRUN apt-get install git\nRUN pip install --no-cache-dir ".[gpu,tau2]"\n', "DL3015"),
        ('FROM a:1\nRUN cd /x && \\\n    pip install --no-cache-dir ".[gpu,tau2]"\n', "DL3003"),
        ('FROM a:1\nWORKDIR app\nRUN pip install --no-cache-dir ".[gpu,tau2]"\n', "DL3000"),
        ('FROM a:1\nENV A 1\nRUN pip install --no-cache-dir ".[gpu,tau2]"\n', "ENV key=value"),
        ('FROM a:1\nCOPY no_such_dir ./x\nRUN pip install --no-cache-dir ".[gpu,tau2]"\n', "not in the build context"),
    ],
)
def test_the_linter_catches_each_rule(dockerfile: str, rule: str) -> None:
    problems = lint(dockerfile)
    assert any(rule in problem for problem in problems), problems


def test_parser_joins_continuations_and_skips_comments() -> None:
    instructions = parse_dockerfile('# c\nARG X=1\nFROM a:${X}\nRUN echo a && \\\n  # inner\n  echo b\nCMD ["bash"]\n')
    assert [(i.line, i.keyword) for i in instructions] == [(2, "ARG"), (3, "FROM"), (4, "RUN"), (7, "CMD")]
    assert instructions[2].args == "echo a &&  echo b"
    assert resolve_base_image(instructions) == "a:1"
    assert image_tag("registry:5000/img") == "" and image_tag("r:5000/img:v1@sha256:ab") == "v1"


def test_readme_has_build_and_run_lines() -> None:
    readme = (ROOT / "docker" / "README.md").read_text()
    assert "docker build -f docker/Dockerfile -t verl-credit:0.1.0 ." in readme
    assert "docker run" in readme and "--gpus all" in readme
    assert "bash scripts/serve_annotator.sh" in readme and "recipes/eval/tau2_eval.sh" in readme
