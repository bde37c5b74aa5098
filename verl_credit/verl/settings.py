"""The ``credit`` Hydra node as typed settings, validated before any worker starts.

``verl_credit/config/credit_trainer.yaml`` puts every verl-credit key under one top-level node
``credit`` (see that file for why not ``algorithm.credit``). This module turns the node into
frozen dataclasses:

* the credit math (``estimator``, ``norm_adv_by_std_in_grpo``, ``epsilon``, ``iapo.*``,
  ``call_credit.*`` including the optional parts ``call_credit.counterfactual.*``,
  ``.ig_downweight.*``, ``.adaptive_omega.*``, ``.dpo_export.*``) ->
  :class:`verl_credit.config.CreditConfig` (its own validation; the edit proposer's name is
  resolved here);
* the rollout/runtime parts (``layout``, ``annotator.*``, ``user.*``, ``env.*``, ``debug.*``,
  ``viz.*``, ``session.*``) -> the classes below.

Every field declares its type and allowed range (:mod:`verl_credit.config_rules`; the yaml's
comments state the same ranges): every bad value -- the wrong type (``'30'``, ``'false'``), not
finite, out of range -- raises ``ValueError`` whose message starts with the full key
(``credit.layout``, ``credit.annotator.timeout`` ...) and states the allowed range. A limit is
switched off only by its documented value (``credit.annotator.deadline: null``,
``credit.annotator.max_model_len: 0``), never by an infinite or huge number. No verl import
here: ``verl_credit.verl.main`` calls :func:`load_settings` before Ray is started.

``credit.annotator.cache_path`` may contain ``{hostname}``: :func:`load_settings` replaces it with
the host name of the process that loads the settings (every rollout worker and the trainer load
them on their own node), so a shared folder holds one sqlite file per node.
:func:`check_cache_location` (called by ``verl_credit.verl.main.validate``) refuses a cache on a
network filesystem shared by several nodes.
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from verl_credit.annotate import defaults as annotator_defaults
from verl_credit.config import CreditConfig, build_section, credit_keys, mapping_of
from verl_credit.config_rules import (
    MAX_COUNT,
    MAX_RETRIES,
    MAX_SECONDS,
    MAX_TOKENS,
    Choice,
    Number,
    Section,
    Switch,
    Table,
    Text,
    Texts,
    check_fields,
    setting,
)
from verl_credit.estimators.registry import RESERVED_KEYS, estimator_names

__all__ = [
    "CREDIT_TRAINER_MODE",
    "HOSTNAME_PLACEHOLDER",
    "LAYOUTS",
    "MOUNTS_PATH",
    "NETWORK_FS_TYPES",
    "VERL_ESTIMATORS",
    "AnnotatorSettings",
    "CreditSettings",
    "DebugSettings",
    "EnvSettings",
    "SessionSettings",
    "UserSettings",
    "VizSettings",
    "check_cache_location",
    "check_trainer_selection",
    "credit_estimators",
    "estimator_needs_credit_trainer",
    "expand_cache_path",
    "filesystem_of",
    "is_network_filesystem",
    "load_settings",
    "wrong_trainer_message",
]

#: estimators of verl's own registry that the credit trainer also runs (every other registered
#: credit estimator needs the credit trainer: its inputs travel in ``extra_fields``)
VERL_ESTIMATORS: tuple[str, ...] = ("grpo",)


def credit_estimators() -> tuple[str, ...]:
    """Registered credit estimators that only the credit trainer can run (``iapo``, ...)."""
    return tuple(name for name in estimator_names() if name not in VERL_ESTIMATORS)


#: the trainer mode registered by verl_credit.verl.trainer
CREDIT_TRAINER_MODE = "credit_sync"
#: ``merged``: one training row per session; ``per_request``: one row per model request
LAYOUTS: tuple[str, ...] = ("merged", "per_request")
ANNOTATOR_FALLBACKS: tuple[str, ...] = ("rules", "uniform")
USER_KINDS: tuple[str, ...] = ("env", "llm", "scripted", "none")
#: a timeout in seconds: positive and at most a day (a larger one is no limit)
SECONDS = Number(0.0, MAX_SECONDS, low_open=True)
#: retries of one request
RETRIES = Number(0, MAX_RETRIES, integer=True)
#: the highest sampling temperature of the simulated user
MAX_TEMPERATURE = 10.0
#: the longest period in training steps (``credit.viz.every_n_steps``)
MAX_STEPS = 10**9
#: replaced in ``credit.annotator.cache_path`` by the loading process's host name (one file per node)
HOSTNAME_PLACEHOLDER = "{hostname}"
#: mount table read by :func:`check_cache_location` (tests pass a fake one)
MOUNTS_PATH = "/proc/mounts"
#: filesystem types (``/proc/mounts`` third field) treated as network/cluster filesystems; also
#: every FUSE filesystem (``fuse`` / ``fuse.*``: sshfs, s3fs, gcsfuse, rclone, juicefs, ... -- we
#: cannot vouch for their locking), but not ``fuseblk`` (a local block device, e.g. ntfs-3g)
NETWORK_FS_TYPES: frozenset[str] = frozenset(
    {
        "nfs",
        "nfs4",
        "cifs",
        "smb3",
        "smbfs",
        "lustre",
        "gpfs",
        "beegfs",
        "ceph",
        "glusterfs",
        "gfs2",
        "ocfs2",
        "afs",
        "9p",
        "panfs",
        "wekafs",
        "orangefs",
        "pvfs2",
        "davfs",
        "ncpfs",
        "coda",
    }
)


@dataclass(frozen=True)
class AnnotatorSettings:
    """``credit.annotator.*``: which annotator builds the IAPO graphs, and where it runs.

    The keys only an LLM reads (``annotate.defaults.LLM_ONLY_SETTINGS``: ``base_urls``, ``model``,
    ``timeout``, ``max_retries``, ``max_model_len``, ``max_prompt_tokens``, ``trust_env``) are
    refused off their defaults unless ``name`` is ``llm`` or ``hybrid``, as the CLI refuses the flags.
    """

    name: str = setting("rules", Text())
    """Registered annotator: ``rules`` | ``llm`` | ``hybrid``."""
    in_rollout: bool = setting(True, Switch())
    """Annotate each trajectory in the agent loop as soon as it finishes (off the trainer's path)."""
    base_urls: tuple[str, ...] = setting((), Texts())
    """OpenAI-compatible endpoints of the LLM annotator (``llm``/``hybrid``)."""
    model: str | None = setting(None, Text(null="unset"))
    """Served model name of the LLM annotator."""
    timeout: float = setting(annotator_defaults.TIMEOUT_S, SECONDS)
    """Seconds per LLM request."""
    concurrency: int = setting(annotator_defaults.CONCURRENCY, Number(1, MAX_COUNT, integer=True))
    """Trajectories annotated at once per process."""
    max_retries: int = setting(annotator_defaults.MAX_RETRIES, RETRIES)
    """LLM retries (with backoff) before the fallback."""
    fallback: str = setting(annotator_defaults.FALLBACK, Choice(ANNOTATOR_FALLBACKS))
    """After a final LLM failure: ``rules`` or ``uniform`` (counted in ``credit/fallback_rate``)."""
    cache_path: str | None = setting(None, Text(null="no cache"))
    """sqlite graph cache shared by the processes of one node (``null``: no cache). Use node-local
    disk: sqlite's WAL mode needs every process of a database on one host, so a path on a network
    filesystem is refused for ``trainer.nnodes > 1`` unless it contains ``{hostname}`` (one file
    per node; :func:`load_settings` fills it in)."""
    in_validation: bool = setting(False, Switch())
    """Annotate validation episodes too. Off: validation rollouts carry no graph (saves e.g. 100
    LLM-annotator calls per ``trainer.test_freq``)."""
    deadline: float | None = setting(300.0, Number(0.0, MAX_SECONDS, low_open=True, null="no deadline"))
    """Seconds one session's annotation may take in the rollout worker; on expiry the session gets
    the fallback (counted) instead of stalling the step. ``null``: no deadline."""
    max_fallback_rate: float = setting(0.2, Number(0.0, 1.0))
    """The highest share of sessions given a fallback graph (``credit/fallback_rate``) over the last
    ``fallback_window`` steps before the trainer warns every step (``credit/fallback_rate_window``):
    past it the run is rule-graph (or uniform) IAPO, not what was asked for."""
    fallback_window: int = setting(5, Number(1, MAX_STEPS, integer=True))
    """Training steps the fallback rate is measured over (``max_fallback_rate``)."""
    stop_on_fallback: bool = setting(False, Switch())
    """Stop the run (after a checkpoint) once the window is full and its fallback rate passes
    ``max_fallback_rate``; off: warn every step."""
    max_model_len: int | None = setting(
        None, Number(0, MAX_TOKENS, integer=True, zero="no context budget", null="ask the server's /v1/models")
    )
    """``llm``/``hybrid``: the annotator server's context length, for the prompt's token budget
    (``null``: asked from the server's ``/v1/models`` once; ``0``: no budget). Over-long prompts
    are cut in the middle of long texts (never an action), counted in ``credit/truncated_prompts``."""
    max_prompt_tokens: int | None = setting(None, Number(1, MAX_TOKENS, integer=True, null="only the context length"))
    """``llm``/``hybrid``: a cap on the prompt's estimated tokens (``null``: only the context length)."""
    trust_env: bool = setting(False, Switch())
    """``llm``/``hybrid``: let the HTTP client read ``HTTP(S)_PROXY`` (off: in-cluster endpoints go direct)."""

    def __post_init__(self) -> None:
        check_fields(self, "credit.annotator")
        if self.name not in annotator_defaults.LLM_ANNOTATORS:
            defaults = {item.name: item.default for item in fields(self)}
            for key in annotator_defaults.LLM_ONLY_SETTINGS:
                if getattr(self, key) != defaults[key]:
                    raise ValueError(
                        f"credit.annotator.{key} applies to the llm and hybrid annotators, not {self.name!r} "
                        f"(got {getattr(self, key)!r}; leave it at {defaults[key]!r} or set credit.annotator.name)"
                    )
        if self.name in annotator_defaults.LLM_ANNOTATORS:
            _require(
                bool(self.base_urls),
                "credit.annotator.base_urls",
                f"must name at least one endpoint for annotator {self.name!r}",
                list(self.base_urls),
            )
            _require(bool(self.model), "credit.annotator.model", f"must be set for annotator {self.name!r}", self.model)

    def rule_fallback(self) -> AnnotatorSettings:
        """These settings for the rule annotator a fallback runs: ``name`` rules, no cache, the
        LLM-only keys back at their defaults (a rule annotator refuses them)."""
        defaults = {
            item.name: item.default for item in fields(self) if item.name in annotator_defaults.LLM_ONLY_SETTINGS
        }
        return replace(self, name="rules", cache_path=None, **defaults)

    def annotator_options(self) -> dict[str, Any]:
        """Constructor options for ``build_annotator`` (the set ones; ``cache_path`` is passed by
        ``verl_credit.verl.annotation.make_annotator``; ``in_rollout``, ``in_validation`` and
        ``deadline`` are read by the agent loop, not by the annotator)."""
        options: dict[str, Any] = {
            "base_urls": list(self.base_urls),
            "model": self.model,
            "timeout": self.timeout,
            "concurrency": self.concurrency,
            "max_retries": self.max_retries,
            "fallback": self.fallback,
            "max_model_len": self.max_model_len,  # 0 (no budget) is a set value: kept
            "max_prompt_tokens": self.max_prompt_tokens,
            "trust_env": self.trust_env,
        }
        return {key: value for key, value in options.items() if value is not None and value != []}


@dataclass(frozen=True)
class UserSettings:
    """``credit.user.*``: the simulated user that answers assistant turns without tool calls."""

    name: str = setting("env", Choice(USER_KINDS))
    """``env`` (the environment's own user), ``llm`` (OpenAI-compatible endpoint), ``scripted``, ``none``."""
    base_url: str | None = setting(None, Text(null="unset"))
    """Endpoint of the ``llm`` user, e.g. ``http://host:8001/v1``."""
    model: str | None = setting(None, Text(null="unset"))
    """Served model name of the ``llm`` user."""
    api_key_env: str | None = setting(None, Text(null="no key sent"))
    """Name of an environment variable holding the endpoint's API key (``null``: no key sent)."""
    instructions: str | None = setting(None, Text(null="none", empty=True))
    """Default user instructions (a row's ``extra_info.user_instructions`` wins)."""
    temperature: float = setting(0.0, Number(0.0, MAX_TEMPERATURE))
    max_tokens: int = setting(512, Number(1, MAX_TOKENS, integer=True))
    timeout: float = setting(60.0, SECONDS)
    max_retries: int = setting(3, RETRIES)
    max_turns: int = setting(10, Number(0, MAX_COUNT, integer=True))
    """Simulated user replies per episode; the episode ends after that many."""
    stop_token: str = setting("###STOP###", Text())
    """The ``llm`` user ends the conversation by writing this token."""
    script: tuple[str, ...] = setting((), Texts())
    """Replies of the ``scripted`` user (a row's ``extra_info.user_script`` wins)."""
    trust_env: bool = setting(False, Switch())
    """Let the ``llm`` user's HTTP client read ``HTTP(S)_PROXY`` (off: in-cluster endpoints go direct)."""

    def __post_init__(self) -> None:
        check_fields(self, "credit.user")
        if self.name == "llm":
            _require(bool(self.base_url), "credit.user.base_url", "must be set for the llm user", self.base_url)
            _require(bool(self.model), "credit.user.model", "must be set for the llm user", self.model)


@dataclass(frozen=True)
class EnvSettings:
    """``credit.env.*``: the environment that drives each episode (a row's ``extra_info.env`` wins)."""

    name: str | None = setting(None, Text(null="verl's own tools"))
    """Registered environment (``service``, ``tau2``, ``coding``, ...); ``null``: verl's own tools."""
    options: Mapping[str, Any] = setting(rule=Table(), factory=dict)
    """Constructor options of the environment (merged under a row's ``extra_info.env_options``;
    each environment checks its own)."""

    def __post_init__(self) -> None:
        check_fields(self, "credit.env")


@dataclass(frozen=True)
class SessionSettings:
    """``credit.session.*``: how long one rollout session may take, how many may fail, and the
    start-up probe of the endpoints sessions call (:mod:`verl_credit.verl.session_failures`,
    :mod:`verl_credit.verl.cluster_checks`)."""

    deadline: float | None = setting(900.0, Number(0.0, MAX_SECONDS, low_open=True, null="no deadline"))
    """Seconds one training episode may take, whatever it waits on (the rollout server, the
    simulated user and all their retries): one deadline per session, not per request. Past it, or
    when the user simulator or the rollout server fails, the session's group is dropped from the
    step (counted in ``credit/failed_sessions``). ``null``: no deadline. The default, 900 s, is 30
    rounds (policy turn and simulated-user reply) of 30 s each: a step waits at most that long for
    a hung server, well below the 300 s x 5 attempts of tau2's user client by default (the recipes
    give that client a timeout x attempts below the deadline, so a dead user is reported as one)."""
    max_failed_share: float = setting(0.25, Number(0.0, 1.0, high_open=True))
    """Stop the run (after a checkpoint of the last trained step) when more than this share of a
    step's sessions failed (``credit/failed_session_share``); below it their groups are dropped."""
    probe_endpoints: bool = setting(True, Switch())
    """At start-up, GET ``/models`` of every endpoint the sessions call from every Ray node, refuse
    a loopback URL on nodes with several addresses, and (``trainer.nnodes > 1``) check that every
    node sees ``trainer.default_local_dir``."""
    probe_timeout: float = setting(10.0, SECONDS)
    """Seconds per probe request."""

    def __post_init__(self) -> None:
        check_fields(self, "credit.session")


@dataclass(frozen=True)
class DebugSettings:
    """``credit.debug.*``: audit dumps of what the trainer computed (off by default)."""

    dump_dir: str | None = setting(None, Text(null="no dump"))
    """Folder the trainer writes one ``step_N.pt`` per training step into: every row's key, tags,
    rollout mask, rewards, ``extra_fields['credit']`` payload and the advantages the actor receives
    (``verl_credit.verl.cpu.check`` recomputes them offline with ``batch_credit``). ``null``: no dump."""

    def __post_init__(self) -> None:
        check_fields(self, "credit.debug")


@dataclass(frozen=True)
class VizSettings:
    """``credit.viz.*``: pictures of the credit while it trains (``verl_credit.verl.viz``)."""

    every_n_steps: int = setting(10, Number(0, MAX_STEPS, integer=True, zero="off"))
    """Draw every N-th training step (``global_step % N == 0``, as ``trainer.test_freq``); 0: off."""
    rollouts: int = setting(4, Number(1, MAX_COUNT, integer=True))
    """Rollouts pictured per drawn step: a success and a failure of the same task where the step has one."""
    dir: str | None = setting(None, Text(null="credit_viz/<project_name>/<experiment_name>"))
    """Folder of the PNGs and HTML pages (``null``: ``credit_viz/<project_name>/<experiment_name>`` in
    the trainer's working directory, like verl's ``tensorboard_log``)."""

    def __post_init__(self) -> None:
        check_fields(self, "credit.viz")


@dataclass(frozen=True)
class CreditSettings:
    """Everything under ``credit``."""

    credit: CreditConfig = field(metadata={"rule": Section(CreditConfig)})
    layout: str = setting("merged", Choice(LAYOUTS))
    annotator: AnnotatorSettings = field(
        default_factory=AnnotatorSettings, metadata={"rule": Section(AnnotatorSettings)}
    )
    user: UserSettings = field(default_factory=UserSettings, metadata={"rule": Section(UserSettings)})
    env: EnvSettings = field(default_factory=EnvSettings, metadata={"rule": Section(EnvSettings)})
    debug: DebugSettings = field(default_factory=DebugSettings, metadata={"rule": Section(DebugSettings)})
    viz: VizSettings = field(default_factory=VizSettings, metadata={"rule": Section(VizSettings)})
    session: SessionSettings = field(default_factory=SessionSettings, metadata={"rule": Section(SessionSettings)})

    def __post_init__(self) -> None:
        check_fields(self, "credit")

    @property
    def estimator(self) -> str:
        return self.credit.estimator


def load_settings(config: Any) -> CreditSettings:
    """Build and validate the settings from a whole trainer config (``config.credit``) or from the
    ``credit`` mapping itself. Also checks that ``credit.estimator`` and
    ``algorithm.adv_estimator`` agree when both are present.

    Raises:
        ValueError: naming the offending key.
    """
    node, algorithm = _split(config)
    values = _to_plain(node)
    if not isinstance(values, dict):
        raise ValueError(f"credit: expected a mapping, got {type(values).__name__}")
    if algorithm is not None:
        _check_shared_normalization(values, algorithm)
    # the credit math's keys: its scalars and every registered estimator's section (a plug-in's too)
    math_keys = credit_keys()
    known = set(math_keys) | RESERVED_KEYS  # RESERVED_KEYS: the scalars and the trainer's own sections
    unknown = sorted(set(values) - known)
    if unknown:
        raise ValueError(f"unknown key(s) {', '.join('credit.' + k for k in unknown)}; known: {sorted(known)}")
    credit = CreditConfig.from_mapping({k: values[k] for k in math_keys if k in values})
    _check_edit_proposer(credit)
    if algorithm is not None:
        adv_estimator = algorithm.get("adv_estimator")
        if adv_estimator is not None and str(adv_estimator) != credit.estimator:
            raise ValueError(
                f"credit.estimator={credit.estimator!r} but algorithm.adv_estimator={adv_estimator!r}; "
                "set algorithm.adv_estimator (credit.estimator follows it by interpolation)"
            )
    annotator_values = mapping_of(values.get("annotator"), "credit.annotator")
    if isinstance(annotator_values.get("cache_path"), str) and annotator_values["cache_path"]:
        annotator_values["cache_path"] = expand_cache_path(annotator_values["cache_path"])
    if "base_urls" in annotator_values:
        urls = annotator_values["base_urls"]
        if urls is None or isinstance(urls, str):  # one endpoint given as a string
            annotator_values["base_urls"] = (urls,) if urls else ()
        elif isinstance(urls, list | tuple):
            annotator_values["base_urls"] = tuple(urls)
    user_values = mapping_of(values.get("user"), "credit.user")
    script = user_values.get("script")
    if script is None and "script" in user_values:
        user_values["script"] = ()
    elif isinstance(script, list | tuple):  # a reply such as 1 or yes is text to the user
        user_values["script"] = tuple(str(s) for s in script)
    env_values = mapping_of(values.get("env"), "credit.env")
    if env_values.get("options") is None and "options" in env_values:
        env_values["options"] = {}
    elif isinstance(env_values.get("options"), Mapping):
        env_values["options"] = dict(env_values["options"])
    return CreditSettings(
        credit=credit,
        layout=values.get("layout", "merged"),
        annotator=build_section(AnnotatorSettings, annotator_values, "credit.annotator"),
        user=build_section(UserSettings, user_values, "credit.user"),
        env=build_section(EnvSettings, env_values, "credit.env"),
        debug=build_section(DebugSettings, values.get("debug"), "credit.debug"),
        viz=build_section(VizSettings, values.get("viz"), "credit.viz"),
        session=build_section(SessionSettings, values.get("session"), "credit.session"),
    )


def _check_shared_normalization(values: Mapping[str, Any], algorithm: Mapping[str, Any]) -> None:
    """``algorithm.norm_adv_by_std_in_grpo`` (verl's key, which ``credit.norm_adv_by_std_in_grpo``
    follows by interpolation) must be a real boolean -- ``'false'`` is truthy -- and the two must
    agree: the credit math reads one, verl's own code and the trainer's audit dump the other."""
    if "norm_adv_by_std_in_grpo" not in algorithm:
        return
    verl_value = algorithm.get("norm_adv_by_std_in_grpo")
    if not isinstance(verl_value, bool):
        raise ValueError(f"algorithm.norm_adv_by_std_in_grpo must be true or false, got {verl_value!r}")
    ours = values.get("norm_adv_by_std_in_grpo", verl_value)
    if isinstance(ours, bool) and ours != verl_value:
        raise ValueError(
            f"credit.norm_adv_by_std_in_grpo={ours} but algorithm.norm_adv_by_std_in_grpo={verl_value}; set "
            "algorithm.norm_adv_by_std_in_grpo (credit.norm_adv_by_std_in_grpo follows it by interpolation)"
        )


def expand_cache_path(path: str, hostname: str | None = None) -> str:
    """``path`` with ``~`` expanded and every ``{hostname}`` replaced by ``hostname`` (default: this
    process's host name, ``socket.gethostname()``)."""
    if HOSTNAME_PLACEHOLDER in path:
        host = hostname if hostname is not None else socket.gethostname()
        path = path.replace(HOSTNAME_PLACEHOLDER, host.replace(os.sep, "_") or "localhost")
    return os.path.expanduser(path)


def is_network_filesystem(fs_type: str) -> bool:
    """Whether a ``/proc/mounts`` filesystem type is a network/cluster filesystem (see
    :data:`NETWORK_FS_TYPES`; every ``fuse``/``fuse.*`` counts, ``fuseblk`` does not)."""
    fs_type = fs_type.lower()
    return fs_type in NETWORK_FS_TYPES or fs_type == "fuse" or fs_type.startswith("fuse.")


_MOUNT_ESCAPE = re.compile(r"\\([0-7]{3})")


def filesystem_of(
    path: str | os.PathLike[str], mounts_path: str | os.PathLike[str] = MOUNTS_PATH
) -> tuple[str, str] | None:
    """``(mount point, filesystem type)`` of the mount holding ``path`` (which need not exist yet:
    symlinks of its existing part are resolved), from a ``/proc/mounts``-format table; the longest
    matching mount point wins, and of equal ones the last (the one mounted on top). ``None`` when
    the table cannot be read (not Linux) or has no match."""
    try:
        lines = Path(mounts_path).read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return None
    target = os.path.realpath(os.path.expanduser(os.fspath(path)))
    best: tuple[str, str] | None = None
    for line in lines:
        parts = line.split()
        if len(parts) < 3:
            continue
        mount_point = _MOUNT_ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), parts[1])
        prefix = mount_point.rstrip("/")
        if target != mount_point and not target.startswith(prefix + "/"):
            continue
        if best is None or len(mount_point) >= len(best[0]):
            best = (mount_point, parts[2])
    return best


def check_cache_location(
    config: Any, *, mounts_path: str | os.PathLike[str] = MOUNTS_PATH, hostname: str | None = None
) -> str | None:
    """Start-up check of ``credit.annotator.cache_path`` against this node's mount table.

    The graph cache is sqlite in WAL mode, which needs all processes of one database on one host
    (its ``-shm`` index is shared memory) and file locks a network filesystem may not honour.

    Raises:
        ValueError: the path is on a network filesystem (:func:`is_network_filesystem`) while
            ``trainer.nnodes > 1`` and it has no ``{hostname}`` part, so every node would open the
            same file.

    Returns:
        a warning for any other path on a network filesystem (one node, or one file per node),
        else ``None`` (no cache, a local filesystem, or no readable mount table). Only this node's
        mounts are seen: a path that is local here is trusted to be local on every node.
    """
    node, _ = _split(config)
    annotator = _to_plain((node or {}).get("annotator")) or {}
    raw = annotator.get("cache_path") if isinstance(annotator, Mapping) else None
    if not raw:
        return None
    raw = str(raw)
    trainer = config.get("trainer") if hasattr(config, "get") and "trainer" in config else None
    nnodes = int((trainer or {}).get("nnodes", 1) or 1)
    found = filesystem_of(expand_cache_path(raw, hostname), mounts_path)
    if found is None or not is_network_filesystem(found[1]):
        return None
    mount_point, fs_type = found
    where = f"credit.annotator.cache_path={raw!r} is on a network filesystem ({fs_type} mounted at {mount_point})"
    if nnodes > 1 and HOSTNAME_PLACEHOLDER not in raw:
        raise ValueError(
            f"{where} and trainer.nnodes={nnodes}: the sqlite graph cache runs in WAL mode, which cannot be "
            f"shared by processes on several hosts (nor safely over a network filesystem). Use node-local disk "
            f"(the recipes' CACHE_DIR, default ${{TMPDIR:-/tmp}}/verl_credit/<project>/<experiment>), one file per "
            f"node with the {HOSTNAME_PLACEHOLDER} placeholder (quoted for Hydra: "
            f"credit.annotator.cache_path='{mount_point.rstrip('/')}/.../{HOSTNAME_PLACEHOLDER}/graphs.sqlite'), "
            f"or credit.annotator.cache_path=null (no cache)"
        )
    return (
        f"{where}: sqlite's WAL mode over a network filesystem is slow and its locking may be unreliable; "
        f"prefer node-local disk (e.g. ${{TMPDIR:-/tmp}})"
    )


def _check_edit_proposer(credit: CreditConfig) -> None:
    """The edit proposer must resolve (a registered name or ``module:Class``), switched on or not."""
    from verl_credit.counterfactual_replay import edit_proposer_factory

    try:
        edit_proposer_factory(credit.call_credit.counterfactual.proposer)
    except ValueError as exc:
        raise ValueError(f"credit.call_credit.counterfactual.proposer: {exc}") from None


def _split(config: Any) -> tuple[Any, Mapping[str, Any] | None]:
    """(credit node, algorithm node or None) from a whole config or a bare credit mapping."""
    getter = getattr(config, "get", None)
    if getter is not None and getter("credit") is not None:
        return getter("credit"), getter("algorithm")
    if getter is not None and ("trainer" in config or "algorithm" in config):
        raise ValueError("credit: the config has no 'credit' node; launch with --config-name=credit_trainer")
    return config, None


def _to_plain(node: Any) -> Any:
    try:
        from omegaconf import DictConfig, ListConfig, OmegaConf
    except ImportError:  # pragma: no cover - hydra is a dependency
        return node
    if isinstance(node, DictConfig | ListConfig):
        return OmegaConf.to_container(node, resolve=True)
    return node


def _require(ok: bool, key: str, message: str, value: Any) -> None:
    if not ok:
        raise ValueError(f"{key} {message}, got {value!r}")


def estimator_needs_credit_trainer(estimator: Any) -> bool:
    """True for a credit estimator (``iapo``, ``call_credit``, ``gigpo``, ...; plain str or a
    str-Enum member)."""
    return str(getattr(estimator, "value", estimator)) in credit_estimators()


def wrong_trainer_message(estimator: str) -> str:
    """What to tell a user who selected a credit estimator without the credit trainer."""
    return (
        f"algorithm.adv_estimator={estimator} needs the verl-credit trainer, which reads the influence/call "
        f"graphs carried in extra_fields; a plain advantage estimator never receives them. "
        f"Set trainer.use_v1=true trainer.v1.trainer_mode={CREDIT_TRAINER_MODE} "
        f"actor_rollout_ref.rollout.agent.default_agent_loop=credit_agent "
        f"(or launch `python -m verl_credit.main`, whose config sets all three), "
        f"or use algorithm.adv_estimator=grpo."
    )


def check_trainer_selection(config: Any) -> None:
    """Raise ``ValueError`` when ``algorithm.adv_estimator`` is ``iapo``/``call_credit`` but the
    selected trainer cannot supply graphs (legacy trainer, or a V1 mode that is not the credit
    trainer). Imports verl only for a mode other than ``credit_sync``."""
    estimator = config.algorithm.get("adv_estimator")
    if not estimator_needs_credit_trainer(estimator):
        return
    trainer = config.get("trainer") or {}
    mode = (trainer.get("v1") or {}).get("trainer_mode")
    if not trainer.get("use_v1", True) or not _is_credit_trainer(mode):
        raise ValueError(wrong_trainer_message(str(estimator)))


def _is_credit_trainer(mode: Any) -> bool:
    """``credit_sync``, or any registered subclass of the credit trainer (it inherits the class
    attribute ``is_credit_trainer``; read by name so that this module does not import the trainer)."""
    if mode == CREDIT_TRAINER_MODE:
        return True
    from verl.trainer.ppo.v1.trainer_base import TRAINER_REGISTRY

    cls = TRAINER_REGISTRY.get(str(mode))
    return isinstance(cls, type) and getattr(cls, "is_credit_trainer", False) is True
