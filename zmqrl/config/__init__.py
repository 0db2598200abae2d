"""The run configuration: one dataclass schema, YAML load/validate/dump and ``--set`` overrides.

Every section is a dataclass with a one-line docstring per field (the comment after it). The
same schema checks YAML files, command-line overrides, the resolved ``config.yaml`` written to
the run directory and the hyperparameter table in TensorBoard.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Union

import yaml


class ConfigError(ValueError):
    """A configuration problem, with a message that names the key and the file."""


@dataclass
class RunConfig:
    """What this run is and where it writes."""

    name: str = "run"  # a label for logs and the summary
    seed: int = 0  # base seed: envs, networks, replay sampling and actors derive theirs from it
    device: str = "cpu"  # torch device of the learner: cpu, cuda, cuda:1, or auto
    torch_threads: int = 1  # CPU threads of the learner's torch (and `zmqrl train`'s); 1 leaves other cores to actors
    run_dir: str = ""  # run directory; empty means runs/<name>-<timestamp>
    log_level: str = "info"  # debug, info, warning, error


@dataclass
class EnvConfig:
    """Which environment to build and how."""

    id: str = "CartPole-v1"  # gymnasium id
    kwargs: dict[str, Any] = field(default_factory=dict)  # passed to gymnasium.make
    wrappers: list[str] = field(default_factory=list)  # applied in order: atari, frame_stack, ...
    num_envs: int = 4  # envs stepped together, one batched forward per step
    max_episode_steps: int | None = None  # overrides the registered time limit
    frame_stack: int = 4  # frames stacked by the frame_stack wrapper


@dataclass
class AgentConfig:
    """Fields every algorithm has; each algorithm's section subclasses this (``agent.algo`` picks it).

    Class attributes ``CHOICES``, ``POSITIVE``, ``UNIT_INTERVAL`` and ``NON_NEGATIVE`` of a subclass
    name its own keys (without ``agent.``) for the range checks.
    """

    algo: str = "dqn"  # the algorithm: a name from `zmqrl config` (zmqrl.agents.ALGORITHMS)
    gamma: float = 0.99  # discount factor
    n_step: int = 3  # n-step returns
    batch_size: int = 64  # transitions per optimisation step

    CHOICES: ClassVar[dict[str, tuple[str, ...]]] = {}
    POSITIVE: ClassVar[tuple[str, ...]] = ()
    UNIT_INTERVAL: ClassVar[tuple[str, ...]] = ()
    NON_NEGATIVE: ClassVar[tuple[str, ...]] = ()


def agent_config_class(algo: str) -> type[AgentConfig]:
    """The ``agent:`` dataclass of an algorithm (looked up in the registry, torch-free)."""
    from zmqrl.agents import algorithm  # here: the registry imports this module

    return algorithm(algo).config_class


def _default_agent() -> AgentConfig:
    return agent_config_class("dqn")()


@dataclass
class ReplayConfig:
    """The replay buffer on the learner."""

    capacity: int = 100_000  # transitions kept
    prioritized: bool = True  # prioritized replay (sum-tree) instead of uniform
    alpha: float = 0.6  # priority exponent
    beta0: float = 0.4  # initial importance-sampling exponent
    beta_steps: int = 20_000  # optimisation steps over which beta anneals to 1
    priority_eps: float = 1e-6  # added to |td error| before the exponent
    dedup_frames: bool = True  # store each distinct uint8 image frame of obs/next_obs once


@dataclass
class TrainerConfig:
    """Intervals and limits shared by the single-process trainer and the learner."""

    warmup: int = 1000  # transitions in replay before optimisation starts
    opt_interval: int = 1  # env steps (transitions) per optimisation step, single-process only
    max_opts: int = 50_000  # optimisation steps, then stop
    max_seconds: float = 0.0  # wall-clock limit in seconds; 0 means none
    stop_return: float | None = None  # stop as soon as an evaluation mean reaches this
    eval_interval: int = 1000  # optimisation steps between evaluations
    eval_episodes: int = 10  # greedy episodes per evaluation
    record_interval: int = 100  # optimisation steps between TensorBoard records
    save_interval: int = 10_000  # optimisation steps between numbered checkpoints; 0 disables
    latest_interval_s: float = 60.0  # seconds between refreshes of checkpoints/latest; 0 = only at save_interval
    checkpoint_replay: bool = False  # also save replay contents (copied in memory, written off the training loop)
    sync_interval: int = 50  # optimisation steps between model publications (distributed)
    max_samples_per_insert: float = 0.0  # learner waits for data above this ratio; 0 = off
    min_samples_per_insert: float = 0.0  # learner stops taking data below this ratio (actors block); 0 = off


@dataclass
class ActorConfig:
    """Distributed actors (Ape-X style)."""

    n_buffer: int = 256  # transitions per message sent to the proxy
    eps: float = 0.4  # base exploration rate eps
    eps_alpha: float = 7.0  # actor i of N explores with eps ** (1 + eps_alpha * i / (N - 1))
    eps_decay_steps: int = 0  # each actor starts at agent.eps_start and reaches its eps above after this many
    #                           of its own env steps (linearly); 0 = its eps from the first step, as in Ape-X
    num_actors: int = 2  # N in the formula above; the local launcher sets it
    compute_priorities: bool = True  # send initial priorities computed with the local model
    send_hwm: int = 16  # batches queued towards the proxy before send blocks
    backend: str = "auto"  # policy forward in actors and the evaluator: auto (numpy for MLPs), numpy, torch
    nice: int = 0  # raise the actor process's niceness so the learner wins a shared CPU (0 = unchanged)


@dataclass
class NetConfig:
    """Addresses, ports and socket limits of a distributed run."""

    learner_host: str = "127.0.0.1"  # where actors, proxies and evaluators find the learner
    proxy_host: str = "127.0.0.1"  # where actors find their proxy
    bind_host: str = "127.0.0.1"  # interface the learner and proxy bind on (0.0.0.0 = all)
    data_port: int = 5555  # learner PULL (proxies connect here); 0 picks a free port
    model_port: int = 5556  # learner PUB of model versions; 0 picks a free port
    proxy_port: int = 5557  # proxy PULL (actors connect here); 0 picks a free port
    eval_port: int = 5558  # learner PULL for evaluator reports; 0 picks a free port
    max_message_mb: float = 256.0  # messages larger than this are refused
    heartbeat_ms: int = 500  # ZeroMQ heartbeat interval on model and evaluation links
    heartbeat_timeout_ms: int = 2000  # peer considered gone after this silence
    data_keepalive_s: int = 60  # data links (no heartbeats) drop a silent peer after about this many seconds
    republish_s: float = 2.0  # learner re-publishes the latest model at least this often
    stats_interval_s: float = 2.0  # roles report counters this often
    peer_wait_s: float = 0.0  # give up waiting for a peer after this; 0 waits forever
    max_peers: int = 1024  # senders a learner or proxy keeps counters for; newcomers beyond are refused and counted
    peer_idle_s: float = 600.0  # a sender silent this long may be forgotten to make room for a new one
    proxy_hold_ms: float = 10.0  # a proxy reads its actors' batches in bursts this far apart (0: each at once)
    proxy_merge: int = 32  # a proxy joins up to this many batches of a burst into one message (1: each as it came)
    security: str = "none"  # none, or curve: CurveZMQ encryption plus a client-key allow-list on every socket
    keys_dir: str = ""  # directory of key files made by `zmqrl keygen` (needed for curve)
    server_key: str = "server"  # key pair that sockets which bind (learner, proxy) use: KEYS_DIR/NAME.key(_secret)
    client_key: str = ""  # this process's key pair for sockets that connect; empty: the server_key pair
    allowed_clients_dir: str = ""  # public keys (*.key) servers admit; empty: KEYS_DIR/clients


@dataclass
class Config:
    """A whole run."""

    run: RunConfig = field(default_factory=RunConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    agent: AgentConfig = field(default_factory=_default_agent)
    replay: ReplayConfig = field(default_factory=ReplayConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    actor: ActorConfig = field(default_factory=ActorConfig)
    net: NetConfig = field(default_factory=NetConfig)


_CHOICES: dict[str, tuple[str, ...]] = {
    "run.log_level": ("debug", "info", "warning", "error"),
    "actor.backend": ("auto", "numpy", "torch"),
    "net.security": ("none", "curve"),
}
_POSITIVE = {
    "run.torch_threads", "env.num_envs", "env.frame_stack", "agent.gamma", "agent.n_step", "agent.batch_size",
    "replay.capacity", "replay.beta_steps",
    "trainer.opt_interval", "trainer.max_opts", "trainer.eval_interval", "trainer.eval_episodes",
    "trainer.record_interval", "trainer.sync_interval", "actor.n_buffer", "actor.num_actors",
    "actor.send_hwm", "net.max_message_mb", "net.heartbeat_ms", "net.heartbeat_timeout_ms",
    "net.republish_s", "net.stats_interval_s", "net.data_keepalive_s", "net.max_peers", "net.proxy_merge",
}
_UNIT_INTERVAL = {"agent.gamma", "replay.alpha", "replay.beta0", "actor.eps"}
_NON_NEGATIVE = {"trainer.warmup", "trainer.save_interval", "trainer.max_seconds", "trainer.max_samples_per_insert",
                 "trainer.min_samples_per_insert", "actor.nice", "trainer.latest_interval_s", "actor.eps_alpha",
                 "actor.eps_decay_steps",
                 "net.peer_wait_s", "net.peer_idle_s", "net.proxy_hold_ms"}


def _type_name(tp: Any) -> str:
    if isinstance(tp, type):
        return tp.__name__
    return str(tp).replace("typing.", "")


def _coerce(value: Any, tp: Any, where: str) -> Any:
    """Check ``value`` against the annotation ``tp``; return it (ints widen to float)."""
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        options = typing.get_args(tp)
        if value is None and type(None) in options:
            return None
        for option in options:
            if option is type(None):
                continue
            try:
                return _coerce(value, option, where)
            except ConfigError:
                continue
        raise ConfigError(f"{where}: expected {_type_name(tp)}, got {type(value).__name__} {value!r}")
    if tp is Any:
        return value
    if origin is list:
        (item_tp,) = typing.get_args(tp)
        if not isinstance(value, list):
            raise ConfigError(f"{where}: expected a list of {_type_name(item_tp)}, got {value!r}")
        return [_coerce(v, item_tp, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
            raise ConfigError(f"{where}: expected a mapping with string keys, got {value!r}")
        return dict(value)
    if tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
    elif tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # YAML 1.1 reads 3e-4 (no dot) as a string
            try:
                return float(value)
            except ValueError:
                pass
    elif tp is str:
        if isinstance(value, str):
            return value
    raise ConfigError(f"{where}: expected {_type_name(tp)}, got {type(value).__name__} {value!r}")


def _unknown_key(key: str, valid: list[str], where: str, listing: str = "zmqrl config") -> ConfigError:
    close = difflib.get_close_matches(key, valid, n=1, cutoff=0.5)
    hint = f"; did you mean '{close[0]}'? " if close else f"; valid keys: {', '.join(valid)}; "
    return ConfigError(f"{where}: unknown key '{key}'{hint}`{listing}` lists every key")


def _agent_class(data: Any, source: str) -> type[AgentConfig]:
    """The ``agent:`` dataclass that ``agent.algo`` (default dqn) names."""
    algo = data.get("algo", "dqn") if isinstance(data, dict) else "dqn"
    from zmqrl.agents import ALGORITHMS

    if algo not in ALGORITHMS:
        raise ConfigError(f"{source}: agent.algo must be one of {', '.join(ALGORITHMS)}, got {algo!r}")
    return agent_config_class(algo)


def _foreign_agent_key(key: str, cls: type[AgentConfig], names: list[str], where: str) -> ConfigError:
    """An unknown ``agent:`` key; when another algorithm has it, say which."""
    from zmqrl.agents import ALGORITHMS

    algo = next((a for a in ALGORITHMS if key in {f.name for f in dataclasses.fields(agent_config_class(a))}), None)
    current = next(a for a in ALGORITHMS if agent_config_class(a) is cls)
    if algo is None:
        return _unknown_key(key, names, where, f"zmqrl config {current}")
    return ConfigError(f"{where}: key '{key}' belongs to agent.algo={algo}, not {current}; "
                       f"`zmqrl config {current}` lists the keys of {current}")


def _build(cls: type, data: Any, prefix: str, source: str) -> Any:
    where = f"{source}: {prefix}" if prefix else source
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a mapping, got {type(data).__name__} {data!r}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        dotted = f"{prefix}.{key}" if prefix else str(key)
        if key not in names:
            if issubclass(cls, AgentConfig):
                raise _foreign_agent_key(str(key), cls, names, f"{source}: {prefix}")
            raise _unknown_key(str(key), names, f"{source}: {prefix or 'top level'}")
        tp = hints[key]
        if tp is AgentConfig:
            kwargs[key] = _build(_agent_class(value, source), value, dotted, source)
        elif dataclasses.is_dataclass(tp):
            kwargs[key] = _build(tp, value, dotted, source)  # type: ignore[arg-type]
        else:
            kwargs[key] = _coerce(value, tp, f"{source}: {dotted}")
    return cls(**kwargs)


def _check_ranges(cfg: Config, source: str) -> None:
    flat = to_flat_dict(cfg)
    ac = type(cfg.agent)
    choices_by_key = {**_CHOICES, **{f"agent.{k}": v for k, v in ac.CHOICES.items()}}
    positive = _POSITIVE | {f"agent.{k}" for k in ac.POSITIVE}
    unit_interval = _UNIT_INTERVAL | {f"agent.{k}" for k in ac.UNIT_INTERVAL}
    non_negative = _NON_NEGATIVE | {f"agent.{k}" for k in ac.NON_NEGATIVE}
    for key, choices in choices_by_key.items():
        if flat[key] not in choices:
            raise ConfigError(f"{source}: {key} must be one of {', '.join(choices)}, got {flat[key]!r}")
    for key in positive:
        if flat[key] <= 0:
            raise ConfigError(f"{source}: {key} must be > 0, got {flat[key]!r}")
    for key in unit_interval:
        if not 0.0 <= flat[key] <= 1.0:
            raise ConfigError(f"{source}: {key} must be within [0, 1], got {flat[key]!r}")
    for key in non_negative:
        if flat[key] < 0:
            raise ConfigError(f"{source}: {key} must be >= 0, got {flat[key]!r}")
    for key in ("net.data_port", "net.model_port", "net.proxy_port", "net.eval_port"):
        if not 0 <= flat[key] <= 65535:
            raise ConfigError(f"{source}: {key} must be a port number 0..65535, got {flat[key]!r}")
    if cfg.agent.batch_size > cfg.replay.capacity:
        raise ConfigError(f"{source}: agent.batch_size ({cfg.agent.batch_size}) exceeds "
                          f"replay.capacity ({cfg.replay.capacity})")
    if cfg.trainer.warmup < cfg.agent.batch_size:
        raise ConfigError(f"{source}: trainer.warmup ({cfg.trainer.warmup}) must be at least "
                          f"agent.batch_size ({cfg.agent.batch_size})")


def from_dict(data: Any, source: str = "<dict>") -> Config:
    """Build and validate a Config from nested plain data."""
    cfg = _build(Config, data, "", source)
    _check_ranges(cfg, source)
    return cfg


def parse_override(text: str) -> tuple[str, Any]:
    """Split ``key=value``; the value is read as YAML (so 3e-4, true, [64, 64] work)."""
    if "=" not in text:
        raise ConfigError(f"--set {text!r}: expected key=value, e.g. agent.lr=3e-4")
    key, raw = text.split("=", 1)
    key = key.strip()
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as exc:
        raise ConfigError(f"--set {key}: cannot read value {raw!r}: {exc}") from None
    return key, value


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``section.key=value`` overrides to nested plain data (validated later)."""
    sections = {f.name: f.type for f in dataclasses.fields(Config)}
    for text in overrides:
        key, value = parse_override(text)
        parts = key.split(".")
        if len(parts) != 2:
            raise ConfigError(f"--set {key}: expected section.key, e.g. agent.lr")
        section, name = parts
        if section not in sections:
            raise _unknown_key(section, list(sections), f"--set {key}")
        data.setdefault(section, {})
        if data[section] is None:
            data[section] = {}
        data[section][name] = value
    for text in overrides:  # names checked once every override is in, so --set agent.algo=... counts
        key = parse_override(text)[0]
        section, name = key.split(".")
        cls = _agent_class(data[section], f"--set {key}") if section == "agent" else \
            typing.get_type_hints(Config)[section]
        valid = [f.name for f in dataclasses.fields(cls)]
        if name not in valid:
            if section == "agent":
                raise _foreign_agent_key(name, cls, valid, f"--set {key}")
            raise _unknown_key(name, valid, f"--set {key}")
    return data


def load(path: str | Path | None, overrides: list[str] | None = None) -> Config:
    """Load a YAML config (or the defaults when ``path`` is None) and apply overrides."""
    data: Any = {}
    source = "<defaults>"
    if path is not None:
        source = str(path)
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"{source}: no such config file")
        try:
            data = yaml.safe_load(p.read_text()) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"{source}: not valid YAML: {exc}") from None
        if not isinstance(data, dict):
            raise ConfigError(f"{source}: expected a mapping at the top level")
    if overrides:
        data = apply_overrides(data, overrides)
        source += " (with --set)"
    return from_dict(data, source)


def to_dict(cfg: Config) -> dict[str, Any]:
    """Nested plain data, ready for YAML."""
    return dataclasses.asdict(cfg)


def to_flat_dict(cfg: Config) -> dict[str, Any]:
    """``{"section.key": value}`` for hyperparameter tables."""
    return {f"{s}.{k}": v for s, sec in to_dict(cfg).items() for k, v in sec.items()}


def dump(cfg: Config, path: str | Path) -> None:
    """Write the resolved config as YAML."""
    Path(path).write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))
