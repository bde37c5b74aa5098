"""The ``credit`` Hydra node as typed settings, validated before any worker starts.

``verl_credit/config/credit_trainer.yaml`` puts every verl-credit key under one top-level node
``credit`` (see that file for why not ``algorithm.credit``). This module turns the node into
frozen dataclasses:

* the credit math (``estimator``, ``norm_adv_by_std_in_grpo``, ``epsilon``, ``iapo.*``,
  ``call_credit.*`` including the optional parts ``call_credit.counterfactual.*``,
  ``.ig_downweight.*``, ``.adaptive_omega.*``, ``.dpo_export.*``) ->
  :class:`verl_credit.config.CreditConfig` (its own validation; the edit proposer's name is
  resolved here);
* the rollout/runtime parts (``layout``, ``annotator.*``, ``user.*``, ``env.*``) -> the classes
  below.

Every bad value raises ``ValueError`` whose message starts with the full key (``credit.layout``,
``credit.annotator.timeout`` ...). No verl import here: ``verl_credit.verl.main`` calls
:func:`load_settings` before Ray is started.

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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from verl_credit.annotate import defaults as annotator_defaults
from verl_credit.config import SECTIONS, CreditConfig, build_section
from verl_credit.estimators.registry import estimator_names

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
    "UserSettings",
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
_CREDIT_MATH_KEYS = ("estimator", "norm_adv_by_std_in_grpo", "epsilon", "call_credit", *SECTIONS)
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
    """``credit.annotator.*``: which annotator builds the IAPO graphs, and where it runs."""

    name: str = "rules"
    """Registered annotator: ``rules`` | ``llm`` | ``hybrid``."""
    in_rollout: bool = True
    """Annotate each trajectory in the agent loop as soon as it finishes (off the trainer's path)."""
    base_urls: tuple[str, ...] = ()
    """OpenAI-compatible endpoints of the LLM annotator (``llm``/``hybrid``)."""
    model: str | None = None
    """Served model name of the LLM annotator."""
    timeout: float = annotator_defaults.TIMEOUT_S
    """Seconds per LLM request."""
    concurrency: int = annotator_defaults.CONCURRENCY
    """Trajectories annotated at once per process."""
    max_retries: int = annotator_defaults.MAX_RETRIES
    """LLM retries (with backoff) before the fallback."""
    fallback: str = annotator_defaults.FALLBACK
    """After a final LLM failure: ``rules`` or ``uniform`` (counted in ``credit/fallback_rate``)."""
    cache_path: str | None = None
    """sqlite graph cache shared by the processes of one node (``null``: no cache). Use node-local
    disk: sqlite's WAL mode needs every process of a database on one host, so a path on a network
    filesystem is refused for ``trainer.nnodes > 1`` unless it contains ``{hostname}`` (one file
    per node; :func:`load_settings` fills it in)."""
    in_validation: bool = False
    """Annotate validation episodes too. Off: validation rollouts carry no graph (saves e.g. 100
    LLM-annotator calls per ``trainer.test_freq``)."""
    deadline: float | None = 300.0
    """Seconds one session's annotation may take in the rollout worker; on expiry the session gets
    the fallback (counted) instead of stalling the step. ``null``: no deadline."""
    max_model_len: int | None = None
    """``llm``/``hybrid``: the annotator server's context length, for the prompt's token budget
    (``null``: asked from the server's ``/v1/models`` once; ``0``: no budget). Over-long prompts
    are cut in the middle of long texts (never an action), counted in ``credit/truncated_prompts``."""
    max_prompt_tokens: int | None = None
    """``llm``/``hybrid``: a cap on the prompt's estimated tokens (``null``: only the context length)."""
    trust_env: bool = False
    """``llm``/``hybrid``: let the HTTP client read ``HTTP(S)_PROXY`` (off: in-cluster endpoints go direct)."""

    def __post_init__(self) -> None:
        _require(bool(self.name), "credit.annotator.name", "must be a registered annotator name", self.name)
        _require(self.timeout > 0, "credit.annotator.timeout", "must be > 0", self.timeout)
        _require(self.concurrency >= 1, "credit.annotator.concurrency", "must be >= 1", self.concurrency)
        _require(self.max_retries >= 0, "credit.annotator.max_retries", "must be >= 0", self.max_retries)
        _require(
            self.max_model_len is None or (_is_int(self.max_model_len) and self.max_model_len >= 0),
            "credit.annotator.max_model_len",
            "must be an integer >= 0 (0: no budget) or null (ask the server)",
            self.max_model_len,
        )
        _require(
            self.max_prompt_tokens is None or (_is_int(self.max_prompt_tokens) and self.max_prompt_tokens > 0),
            "credit.annotator.max_prompt_tokens",
            "must be an integer > 0 or null",
            self.max_prompt_tokens,
        )
        _require(
            isinstance(self.trust_env, bool), "credit.annotator.trust_env", "must be true or false", self.trust_env
        )
        _require(
            self.fallback in ANNOTATOR_FALLBACKS,
            "credit.annotator.fallback",
            f"must be one of {ANNOTATOR_FALLBACKS}",
            self.fallback,
        )
        _require(
            isinstance(self.in_validation, bool),
            "credit.annotator.in_validation",
            "must be true or false",
            self.in_validation,
        )
        _require(
            self.deadline is None
            or (isinstance(self.deadline, int | float) and not isinstance(self.deadline, bool) and self.deadline > 0),
            "credit.annotator.deadline",
            "must be > 0 seconds or null (no deadline)",
            self.deadline,
        )
        if self.name in ("llm", "hybrid"):
            _require(
                bool(self.base_urls),
                "credit.annotator.base_urls",
                f"must name at least one endpoint for annotator {self.name!r}",
                list(self.base_urls),
            )
            _require(bool(self.model), "credit.annotator.model", f"must be set for annotator {self.name!r}", self.model)

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

    name: str = "env"
    """``env`` (the environment's own user), ``llm`` (OpenAI-compatible endpoint), ``scripted``, ``none``."""
    base_url: str | None = None
    """Endpoint of the ``llm`` user, e.g. ``http://host:8001/v1``."""
    model: str | None = None
    """Served model name of the ``llm`` user."""
    api_key_env: str | None = None
    """Name of an environment variable holding the endpoint's API key (``null``: no key sent)."""
    instructions: str | None = None
    """Default user instructions (a row's ``extra_info.user_instructions`` wins)."""
    temperature: float = 0.0
    max_tokens: int = 512
    timeout: float = 60.0
    max_retries: int = 3
    max_turns: int = 10
    """Simulated user replies per episode; the episode ends after that many."""
    stop_token: str = "###STOP###"
    """The ``llm`` user ends the conversation by writing this token."""
    script: tuple[str, ...] = ()
    """Replies of the ``scripted`` user (a row's ``extra_info.user_script`` wins)."""
    trust_env: bool = False
    """Let the ``llm`` user's HTTP client read ``HTTP(S)_PROXY`` (off: in-cluster endpoints go direct)."""

    def __post_init__(self) -> None:
        _require(self.name in USER_KINDS, "credit.user.name", f"must be one of {USER_KINDS}", self.name)
        if self.name == "llm":
            _require(bool(self.base_url), "credit.user.base_url", "must be set for the llm user", self.base_url)
            _require(bool(self.model), "credit.user.model", "must be set for the llm user", self.model)
        _require(self.temperature >= 0, "credit.user.temperature", "must be >= 0", self.temperature)
        _require(self.max_tokens >= 1, "credit.user.max_tokens", "must be >= 1", self.max_tokens)
        _require(self.timeout > 0, "credit.user.timeout", "must be > 0", self.timeout)
        _require(self.max_retries >= 0, "credit.user.max_retries", "must be >= 0", self.max_retries)
        _require(self.max_turns >= 0, "credit.user.max_turns", "must be >= 0", self.max_turns)
        _require(bool(self.stop_token), "credit.user.stop_token", "must be a non-empty string", self.stop_token)
        _require(isinstance(self.trust_env, bool), "credit.user.trust_env", "must be true or false", self.trust_env)


@dataclass(frozen=True)
class EnvSettings:
    """``credit.env.*``: the environment that drives each episode (a row's ``extra_info.env`` wins)."""

    name: str | None = None
    """Registered environment (``service``, ``tau2``, ``coding``, ...); ``null``: verl's own tools."""
    options: Mapping[str, Any] = field(default_factory=dict)
    """Constructor options of the environment (merged under a row's ``extra_info.env_options``)."""


@dataclass(frozen=True)
class DebugSettings:
    """``credit.debug.*``: audit dumps of what the trainer computed (off by default)."""

    dump_dir: str | None = None
    """Folder the trainer writes one ``step_N.pt`` per training step into: every row's key, tags,
    rollout mask, rewards, ``extra_fields['credit']`` payload and the advantages the actor receives
    (``verl_credit.verl.cpu.check`` recomputes them offline with ``routing``). ``null``: no dump."""


@dataclass(frozen=True)
class CreditSettings:
    """Everything under ``credit``."""

    credit: CreditConfig
    layout: str = "merged"
    annotator: AnnotatorSettings = field(default_factory=AnnotatorSettings)
    user: UserSettings = field(default_factory=UserSettings)
    env: EnvSettings = field(default_factory=EnvSettings)
    debug: DebugSettings = field(default_factory=DebugSettings)

    def __post_init__(self) -> None:
        _require(self.layout in LAYOUTS, "credit.layout", f"must be one of {LAYOUTS}", self.layout)

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
    known = set(_CREDIT_MATH_KEYS) | {"layout", "annotator", "user", "env", "debug"}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ValueError(f"unknown key(s) {', '.join('credit.' + k for k in unknown)}; known: {sorted(known)}")
    credit = CreditConfig.from_mapping({k: values[k] for k in _CREDIT_MATH_KEYS if k in values})
    _check_edit_proposer(credit)
    if algorithm is not None:
        adv_estimator = algorithm.get("adv_estimator")
        if adv_estimator is not None and str(adv_estimator) != credit.estimator:
            raise ValueError(
                f"credit.estimator={credit.estimator!r} but algorithm.adv_estimator={adv_estimator!r}; "
                "set algorithm.adv_estimator (credit.estimator follows it by interpolation)"
            )
    annotator_values = dict(values.get("annotator") or {})
    if annotator_values.get("cache_path"):
        annotator_values["cache_path"] = expand_cache_path(str(annotator_values["cache_path"]))
    if "base_urls" in annotator_values:
        urls = annotator_values["base_urls"]
        annotator_values["base_urls"] = tuple([urls] if isinstance(urls, str) else (urls or ()))
    user_values = dict(values.get("user") or {})
    if "script" in user_values:
        user_values["script"] = tuple(str(s) for s in (user_values["script"] or ()))
    env_values = dict(values.get("env") or {})
    if "options" in env_values:
        env_values["options"] = dict(env_values["options"] or {})
    return CreditSettings(
        credit=credit,
        layout=str(values.get("layout", "merged")),
        annotator=build_section(AnnotatorSettings, annotator_values, "credit.annotator"),
        user=build_section(UserSettings, user_values, "credit.user"),
        env=build_section(EnvSettings, env_values, "credit.env"),
        debug=build_section(DebugSettings, dict(values.get("debug") or {}), "credit.debug"),
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
    from verl_credit.replay import edit_proposer_factory

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


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
