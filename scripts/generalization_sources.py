"""Public third-party transcripts for ``scripts/bench_generalization.py``: where they are, how they
are read, and how each is converted to this project's rollout format (in memory, never written).

Every source is a git repository brought onto the machine with the search tool's ``fetch`` (a
mirror under ``--mirrors``, default ``/work/.mirror``: ``<owner>+<name>/repo``), read at a pinned
commit (or, for the OpenHands mocks, every commit that changed them) with ``git show``. Nothing
from these repositories is copied into this one; the hand-check labels of
``scripts/generalization_labels.json`` hold only ids and the edges and roles a reader judged.

Sources are split by *source* (repository) into development (the rules were fixed on them) and
held-out (only measured). Reserved sources the project keeps for its own evaluation are never read
here (``sierra-research/tau-bench``, ``avaljotsingh/tau-bench``, ``oscaralvaro/tau2-bench``,
``christsakm/Trajectories``, ``nus-apr/auto-code-rover``, ``RussellRyanH/CSCI-635-LiveSWE-Agent``,
``OpenHands/benchmarks``).
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["SOURCES", "Source", "load_source"]

GIT_TIMEOUT_S = 120


@dataclass(frozen=True)
class Source:
    """One public source: ``repo`` at ``commit`` (``None``: every commit that changed ``paths``)."""

    name: str
    kind: str  # "service" | "coding"
    split: str  # "dev" | "held-out"
    scaffold: str
    repo: str
    commit: str | None
    paths: tuple[str, ...]  # exact paths, or prefixes ending in "/"
    loader: str
    note: str = ""


SOURCES: tuple[Source, ...] = (
    # --- service agents ----------------------------------------------------------------------
    Source(
        "tau2-grok",
        "service",
        "dev",
        "tau2-bench llm_agent (grok-3, grok-3-mini, grok-4, grok-4-fast): airline, airline_tighter_policy, "
        "telecom, telecom-workflow",
        "blakeelias/tau2-bench",
        "75c6100ac8bb2a3974c7562a7f73099caf809dcc",
        (
            "blob:9daf1bff",
            "blob:5024be3a",
            "blob:0d522734",
            "blob:57df1dd9",
            "blob:c063908a",
            "blob:ab891036",
            "blob:c797a5bf",
        ),
        "tau2",
        "simulation files from the repository's history (data/simulations/), read by blob id",
    ),
    Source(
        "tau2-activegraph",
        "service",
        "held-out",
        "tau2-bench llm_agent under the activegraph harness (gpt-4.1-mini): mock, airline, retail, telecom",
        "yoheinakajima/activegraph-tau2-bench",
        "2d8e2c2518523e13f981c5fa6f1a1547cae33400",
        ("runs/",),
        "tau2",
        "runs/*/tau2_output/results.json (the tau2_artifacts copies are the same runs)",
    ),
    Source(
        "tooltalk",
        "service",
        "held-out",
        "ToolTalk conversations (human-written assistant with tools: accounts, alarms, calendar, email, "
        "messages, reminders, weather)",
        "microsoft/ToolTalk",
        "e05f4ce6132c80ed33392b81535b077d56ab28fd",
        ("data/tooltalk/", "data/easy/"),
        "tooltalk",
    ),
    # --- coding agents -----------------------------------------------------------------------
    Source(
        "swe-agent-0x",
        "coding",
        "dev",
        "SWE-agent 0.x command language in a fenced block (open/goto/edit N:M/create/search_*/submit), gpt-4",
        "princeton-nlp/SWE-agent",
        "0772c99cb2903ccf22ba543eaf128742afa470d6",
        (
            "tests/test_data/trajectories/gpt4__swe-bench-dev-easy_first_only__default__t-0.00__p-0.95__c-3.00__install-1/"
            "pydicom__pydicom-1458.traj",
            "tests/test_data/trajectories/gpt4__swe-agent-test-repo__default_from_url__t-0.00__p-0.95__c-3.00__install-1/"
            "6e44b9__sweagenttestrepo-1c2844.traj",
            "tests/test_data/trajectories/gpt4__swe-agent__test-repo__default_from_url__t-0.00__p-0.95__c-3.00__install-1/"
            "swe-agent__test-repo-i1.traj",
            "trajectories/demonstrations/replay__marshmallow-code__marshmallow-1867__default__t-0.20__p-0.95__c-2.00__"
            "install-1___install_from_source/marshmallow-code__marshmallow-1867.traj",
            "trajectories/demonstrations/human_thought__swe-bench-HumanEvalFix-python__lcb__t-0.00__p-0.95__c-4.00__"
            "install-0/humanevalfix-python-0.traj",
        ),
        "swe_agent",
    ),
    Source(
        "swe-agent-fc",
        "coding",
        "dev",
        "SWE-agent 1.x function calling (bash, str_replace_editor, submit)",
        "princeton-nlp/SWE-agent",
        "0772c99cb2903ccf22ba543eaf128742afa470d6",
        (
            "trajectories/demonstrations/replay__marshmallow-code__marshmallow-1867__function_calling_replace__"
            "install-1/marshmallow-code__marshmallow-1867.traj",
        ),
        "swe_agent",
    ),
    Source(
        "mini-swe-agent-v2",
        "coding",
        "dev",
        "mini-swe-agent 2.x tool calls (bash), DeepSeek models",
        "SWE-agent/mini-swe-agent",
        "3c7d1d7f",
        ("output/deepseek_bench1/",),
        "mini_swe_agent",
    ),
    Source(
        "mini-swe-agent-v1",
        "coding",
        "held-out",
        "mini-swe-agent 1.15 one ```bash block per message in the text, observations as user turns, Gemini 3 Pro",
        "gruckion/mini-swe-agent",
        "d12a71affd95403b036b2bdbd827349b77bfffb9",
        ("swebench_results/20251118_gemini-3-pro-74pct/trajs/",),
        "mini_swe_agent",
    ),
    Source(
        "openhands-codeact",
        "coding",
        "held-out",
        "OpenHands CodeAct <execute_bash>/<execute_ipython> blocks in the text (recorded GPT-4 integration-test "
        "conversations, every recorded version)",
        "All-Hands-AI/OpenHands",
        None,
        (
            "tests/integration/mock/CodeActAgent/",
            "tests/integration/mock/CodeActSWEAgent/",
            "tests/integration/mock/eventstream_runtime/CodeActAgent/",
            "tests/integration/mock/eventstream_runtime/CodeActSWEAgent/",
            "tests/integration/mock/server_runtime/CodeActAgent/",
            "tests/integration/mock/server_runtime/CodeActSWEAgent/",
        ),
        "openhands_mock",
    ),
    Source(
        "moatless",
        "coding",
        "held-out",
        "Moatless Tools state machine (SearchCode, IdentifyCode, DecideRelevance, PlanToCode, EditCode with "
        "<replace> blocks), Claude 3.5 Sonnet / GPT-4o on SWE-bench; recorded test trajectories",
        "aorwall/moatless-tools",
        "d70085d56745575c78f97ce55fbaaccdebe03c93",
        ("tests/trajectories/",),
        "moatless",
        "each action's request (its scratch_pad as the text) is a tool call named by its state, the response "
        "(output, or the retry message) its result",
    ),
)


# ---------------------------------------------------------------------------------------------
# git access
# ---------------------------------------------------------------------------------------------


def _git(mirror: Path, *args: str) -> bytes:
    result = subprocess.run(["git", "-C", str(mirror), *args], capture_output=True, timeout=GIT_TIMEOUT_S, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)} in {mirror}: {result.stderr.decode(errors='replace').strip()}")
    return result.stdout


def mirror_of(source: Source, mirrors: Path) -> Path:
    path = mirrors / source.repo.replace("/", "+") / "repo"
    if not path.exists():
        raise FileNotFoundError(f"{source.repo}: no mirror at {path} (bring it with the search tool's fetch)")
    return path


def _files(mirror: Path, commit: str, prefixes: tuple[str, ...]) -> list[str]:
    listed = _git(mirror, "ls-tree", "-r", "--name-only", commit).decode().splitlines()
    return [p for p in listed if any(p == q or (q.endswith("/") and p.startswith(q)) for q in prefixes)]


# ---------------------------------------------------------------------------------------------
# converters (each yields rollout records)
# ---------------------------------------------------------------------------------------------


def _text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list):  # content parts
        return "\n".join(p.get("text", "") if isinstance(p, dict) else str(p) for p in value)
    return json.dumps(value, default=str)


def tau2_records(data: dict[str, Any], tag: str) -> Iterator[dict[str, Any]]:
    """tau2 ``results.json`` -> records (the conversion of ``scripts/bench_rules_fidelity.py``)."""
    import sys

    scripts = str(Path(__file__).resolve().parent)
    if scripts not in sys.path:
        sys.path.insert(0, scripts)
    from bench_rules_fidelity import convert_simulation, domain_tools

    env = (data.get("info") or {}).get("environment_info") or {}
    domain = env.get("domain_name") or "?"
    tools = env.get("tool_defs") or domain_tools(domain)
    for sim in data.get("simulations") or []:
        record = convert_simulation(sim, env.get("policy") or "", tools, tag)
        record["domain"] = domain
        record["agent_llm"] = ((data.get("info") or {}).get("agent_info") or {}).get("llm")
        yield record


def tooltalk_record(data: dict[str, Any], tag: str) -> dict[str, Any]:
    """A ToolTalk conversation -> one record: each assistant turn's API calls become tool calls
    (results as tool messages), then its text as a separate assistant message."""
    metadata = data.get("metadata") or {}
    system = f"You are a helpful assistant. The current time is {metadata.get('timestamp')}."
    if metadata.get("location"):
        system += f" The user's location is {metadata['location']}."  # what ToolTalk tells the assistant
    if metadata.get("session_token"):  # a conversation that starts logged in: its session is context
        system += f" The user is logged in as {metadata.get('username')} (session token {metadata['session_token']})."
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}]
    calls = 0
    for turn in data.get("conversation") or []:
        if turn.get("role") == "user":
            messages.append({"role": "user", "content": turn.get("text") or ""})
            continue
        for api in turn.get("apis") or []:
            request = api.get("request") or {}
            call_id = f"call_{calls}"
            calls += 1
            messages.append(
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [
                        {
                            "id": call_id,
                            "type": "function",
                            "function": {
                                "name": request.get("api_name"),
                                "arguments": json.dumps(request.get("parameters") or {}),
                            },
                        }
                    ],
                }
            )
            response = api.get("response")
            exception = api.get("exception")
            tool = {
                "role": "tool",
                "tool_call_id": call_id,
                "content": _text(response if exception is None else {"error": exception}),
            }
            if exception is not None:
                tool["is_error"] = True
            messages.append(tool)
        if turn.get("text"):
            messages.append({"role": "assistant", "content": turn["text"]})
    return {"id": f"{tag}/{data.get('name')}", "uid": f"{tag}/{data.get('name')}", "reward": 1.0, "messages": messages}


def _literal(value: Any) -> Any:
    """SWE-agent 1.x writes some fields as Python reprs (``"[{'id': ...}]"``)."""
    if isinstance(value, str) and value[:1] in "[{":
        try:
            return ast.literal_eval(value)
        except (ValueError, SyntaxError):
            return None
    return value


def swe_agent_record(data: dict[str, Any], tag: str) -> dict[str, Any]:
    """A SWE-agent ``.traj`` -> one record from its ``history`` (demonstration turns dropped)."""
    messages: list[dict[str, Any]] = []
    for entry in data.get("history") or []:
        if entry.get("is_demo"):
            continue
        entry = {
            **entry,
            "tool_calls": _literal(entry.get("tool_calls")),
            "tool_call_ids": _literal(entry.get("tool_call_ids")),
        }
        role = entry.get("role")
        message: dict[str, Any] = {"role": role, "content": _text(entry.get("content"))}
        if role == "assistant" and entry.get("tool_calls"):
            message["tool_calls"] = [
                {
                    "id": c.get("id"),
                    "type": "function",
                    "function": {
                        "name": (c.get("function") or {}).get("name"),
                        "arguments": (c.get("function") or {}).get("arguments") or "{}",
                    },
                }
                for c in entry["tool_calls"]
            ]
        if role == "tool":
            ids = entry.get("tool_call_ids") or []
            message["tool_call_id"] = ids[0] if ids else entry.get("tool_call_id")
        if role not in ("system", "user", "assistant", "tool"):
            continue
        messages.append(message)
    return {"id": tag, "uid": tag, "reward": 0.0, "messages": messages}


def mini_swe_agent_record(data: dict[str, Any], tag: str) -> dict[str, Any]:
    """A mini-swe-agent ``.traj.json`` (1.x text or 2.x tool calls) -> one record."""
    messages: list[dict[str, Any]] = []
    for entry in data.get("messages") or []:
        role = entry.get("role")
        if role not in ("system", "user", "assistant", "tool"):
            continue
        message: dict[str, Any] = {"role": role, "content": _text(entry.get("content"))}
        if role == "assistant" and entry.get("tool_calls"):
            message["tool_calls"] = [
                {
                    "id": c.get("id"),
                    "type": "function",
                    "function": {
                        "name": (c.get("function") or {}).get("name"),
                        "arguments": (c.get("function") or {}).get("arguments") or "{}",
                    },
                }
                for c in entry["tool_calls"]
            ]
        if role == "tool":
            message["tool_call_id"] = entry.get("tool_call_id")
        messages.append(message)
    return {"id": tag, "uid": tag, "reward": 0.0, "messages": messages}


def moatless_record(data: dict[str, Any], tag: str) -> dict[str, Any] | None:
    """A Moatless Tools trajectory (``transitions`` of a state machine) -> one record: the issue is the
    user turn; each state's action is an assistant turn whose text is the request's ``scratch_pad``
    and whose one tool call is named by the state, with the rest of the request as its arguments;
    the response (its ``output``, or a ``retry_message``) is the tool result."""
    transitions = data.get("transitions")
    if not isinstance(transitions, list):
        return None
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "Moatless Tools agent (search, identify, plan and edit code states)."},
        {"role": "user", "content": _text(data.get("initial_message"))},
    ]
    calls = 0
    for transition in transitions:
        for action in transition.get("actions") or []:
            request = dict(action.get("request") or {})
            thought = _text(request.pop("scratch_pad", ""))
            call_id = f"call_{calls}"
            calls += 1
            # a state without a name is still a call (the loader refuses a nameless tool call)
            name = transition.get("name") if isinstance(transition.get("name"), str) else "unnamed_state"
            call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": ""}}
            call["function"]["arguments"] = json.dumps(request)
            messages.append({"role": "assistant", "content": thought, "tool_calls": [call]})
            response = action.get("response") or {}
            result = response.get("output") if response.get("output") is not None else response.get("retry_message")
            tool: dict[str, Any] = {"role": "tool", "tool_call_id": call_id, "content": _text(result)}
            if response.get("trigger") == "retry":
                tool["is_error"] = True
            messages.append(tool)
    if calls == 0:
        return None
    return {"id": tag, "uid": tag, "reward": 0.0, "messages": messages}


_SECTION = re.compile(r"\n*-{10}\n+")


def openhands_mock_record(prompt: str, response: str, tag: str) -> dict[str, Any] | None:
    """An OpenHands integration-test mock (the last ``prompt_N.log`` plus its ``response_N.log``)
    -> one record: the sections after the in-context example; a section starting with
    ``OBSERVATION:`` is the environment's reply (a user turn), the first one is the task."""
    sections = [s.strip() for s in _SECTION.split(prompt) if s.strip()]
    start = next((k for k, s in enumerate(sections) if "NOW, LET'S START!" in s), None)
    if start is None:
        return None
    body = sections[start + 1 :]
    if not body:
        return None
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "OpenHands CodeAct agent (<execute_bash>, <execute_ipython>, <execute_browse>)."},
        {"role": "user", "content": body[0]},
    ]
    for section in body[1:]:
        is_observation = section.startswith("OBSERVATION:") or section.startswith("Observation:")
        messages.append({"role": "user" if is_observation else "assistant", "content": section})
    messages.append({"role": "assistant", "content": response.strip()})
    return {"id": tag, "uid": tag, "reward": 0.0, "messages": messages}


def _openhands_records(mirror: Path, source: Source) -> Iterator[dict[str, Any]]:
    seen: set[str] = set()
    for prefix in source.paths:
        commits = _git(mirror, "log", "--all", "--format=%H", "--", prefix).decode().split()
        for commit in commits:
            try:
                files = _files(mirror, commit, (prefix,))
            except RuntimeError:
                continue
            by_test: dict[str, dict[str, str]] = {}
            for path in files:
                folder, name = path.rsplit("/", 1)
                by_test.setdefault(folder, {})[name] = path
            for folder, names in sorted(by_test.items()):
                numbers = sorted(int(m.group(1)) for n in names if (m := re.fullmatch(r"prompt_(\d+)\.log", n)))
                if not numbers or f"response_{numbers[-1]:03d}.log" not in names:
                    continue
                last = numbers[-1]
                prompt = _git(mirror, "show", f"{commit}:{names[f'prompt_{last:03d}.log']}").decode(errors="replace")
                response = _git(mirror, "show", f"{commit}:{names[f'response_{last:03d}.log']}").decode(
                    errors="replace"
                )
                tag = f"{source.name}/{folder.split('mock/', 1)[1]}@{commit[:8]}"
                record = openhands_mock_record(prompt, response, tag)
                if record is None:
                    continue
                key = json.dumps([m["content"] for m in record["messages"] if m["role"] == "assistant"])
                if key in seen:
                    continue  # the same recorded conversation under another prompt template
                seen.add(key)
                yield record


def load_source(source: Source, mirrors: Path) -> list[dict[str, Any]]:
    """The rollout records of one source, in a stable order."""
    mirror = mirror_of(source, mirrors)
    if source.loader == "openhands_mock":
        return list(_openhands_records(mirror, source))
    records: list[dict[str, Any]] = []
    if all(p.startswith("blob:") for p in source.paths):
        items = [(p[5:], p[5:]) for p in source.paths]
    else:
        items = [(f"{source.commit}:{p}", p) for p in _files(mirror, source.commit or "HEAD", source.paths)]
    for spec, path in items:
        if source.name == "tau2-activegraph" and not path.endswith("tau2_output/results.json"):
            continue
        if not (path.endswith(".json") or path.endswith(".traj") or spec == path):
            continue
        try:
            raw = _git(mirror, "show", spec) if ":" in spec else _git(mirror, "cat-file", "-p", spec)
            data = json.loads(raw)
        except (RuntimeError, json.JSONDecodeError):
            continue  # a file the snapshot lacks (4 MiB and more) or that is not JSON
        stem = Path(path).stem.replace(".traj", "")
        if source.loader == "moatless":  # "<instance>/trajectory", "<instance>/trajectory-correction", "<name>"
            stem = path.split("tests/trajectories/", 1)[1].removesuffix(".json")
        tag = f"{source.name}/{path.split('/')[1] if source.name == 'tau2-activegraph' else stem}"
        if source.loader == "tau2":
            records.extend(tau2_records(data, tag if spec != path else f"{source.name}/{spec}"))
        elif source.loader == "tooltalk":
            records.append(tooltalk_record(data, source.name))
        elif source.loader == "swe_agent":
            records.append(swe_agent_record(data, tag))
        elif source.loader == "mini_swe_agent":
            records.append(mini_swe_agent_record(data, tag))
        elif source.loader == "moatless":
            record = moatless_record(data, tag)
            if record is not None:
                records.append(record)
    for record in records:
        record["source"] = source.name
        record["split"] = source.split
        record["scaffold"] = source.name
    return records
