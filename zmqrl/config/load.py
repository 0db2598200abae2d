"""Loading a run configuration: YAML files and ``--set`` overrides checked against the schema
(:mod:`zmqrl.config.schema`), and the resolved config written back."""

from __future__ import annotations

import dataclasses
import difflib
import math
import types
import typing
from pathlib import Path
from typing import Any, Union

import yaml

from zmqrl.config.algorithms import ALGORITHMS
from zmqrl.config.schema import (
    CHOICE_KEYS,
    NON_NEGATIVE_KEYS,
    POSITIVE_KEYS,
    UNIT_INTERVAL_KEYS,
    AgentConfig,
    Config,
    ConfigError,
    agent_config_class,
)


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
    if algo not in ALGORITHMS:
        raise ConfigError(f"{source}: agent.algo must be one of {', '.join(ALGORITHMS)}, got {algo!r}")
    return agent_config_class(algo)


def _foreign_agent_key(key: str, cls: type[AgentConfig], names: list[str], where: str) -> ConfigError:
    """An unknown ``agent:`` key; when another algorithm has it, say which."""
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
    choices_by_key = {**CHOICE_KEYS, **{f"agent.{k}": v for k, v in ac.CHOICES.items()}}
    positive = POSITIVE_KEYS | {f"agent.{k}" for k in ac.POSITIVE}
    unit_interval = UNIT_INTERVAL_KEYS | {f"agent.{k}" for k in ac.UNIT_INTERVAL}
    non_negative = NON_NEGATIVE_KEYS | {f"agent.{k}" for k in ac.NON_NEGATIVE}
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
    for key in ("net.data_port", "net.model_port", "net.proxy_port", "net.eval_port", "net.snapshot_port"):
        if not 0 <= flat[key] <= 65535:
            raise ConfigError(f"{source}: {key} must be a port number 0..65535, got {flat[key]!r}")
    _check_rewards(cfg, source)
    if not 0 <= cfg.env.batch <= cfg.env.num_envs:
        raise ConfigError(f"{source}: env.batch must be within 0..env.num_envs ({cfg.env.num_envs}), "
                          f"got {cfg.env.batch}")
    if cfg.agent.compile == "graph" and cfg.run.device == "cpu":
        raise ConfigError(f"{source}: agent.compile: graph needs a CUDA device, but run.device is cpu "
                          "(set run.device to cuda or auto, or agent.compile to auto or none)")
    if cfg.replay.device == "cuda" and cfg.run.device == "cpu":
        raise ConfigError(f"{source}: replay.device: cuda keeps replay on the learner's CUDA device, but run.device is "
                          "cpu (set run.device to cuda or auto, or replay.device to auto or cpu)")
    if cfg.agent.batch_size > cfg.replay.capacity:
        raise ConfigError(f"{source}: agent.batch_size ({cfg.agent.batch_size}) exceeds "
                          f"replay.capacity ({cfg.replay.capacity})")
    known = ("tensorboard", "mlflow", "wandb")
    for name in cfg.run.trackers:
        if name not in known:
            raise ConfigError(f"{source}: run.trackers: unknown tracker {name!r}; choose from {', '.join(known)}")
    if len(set(cfg.run.trackers)) != len(cfg.run.trackers):
        raise ConfigError(f"{source}: run.trackers lists a tracker twice: {cfg.run.trackers}")
    seeds = cfg.trainer.eval_seeds
    if seeds and len(seeds) != cfg.trainer.eval_episodes:
        raise ConfigError(f"{source}: trainer.eval_seeds lists {len(seeds)} seeds; it needs one per evaluation episode "
                          f"(trainer.eval_episodes={cfg.trainer.eval_episodes}), or [] for fresh seeds every time")
    if cfg.trainer.warmup < cfg.agent.batch_size:
        raise ConfigError(f"{source}: trainer.warmup ({cfg.trainer.warmup}) must be at least "
                          f"agent.batch_size ({cfg.agent.batch_size})")
    low, high = cfg.trainer.min_samples_per_insert, cfg.trainer.max_samples_per_insert
    if high > 0 and low > high:
        # the learner would ask actors to pause below `low` and wait for data above `high`: both at once, a crawl
        raise ConfigError(f"{source}: trainer.min_samples_per_insert ({low:g}) exceeds "
                          f"trainer.max_samples_per_insert ({high:g}): the learner would pause the actors and wait "
                          "for their data at the same time; lower the first, raise the second, or set it to 0 (off)")
    _check_sequences(cfg, source)


def _check_rewards(cfg: Config, source: str) -> None:
    """``env.reward_scale`` a positive finite number or ``auto``; ``env.reward_rms`` positive and finite."""
    scale, rms = cfg.env.reward_scale, cfg.env.reward_rms
    if isinstance(scale, str):
        if scale != "auto":
            raise ConfigError(f"{source}: env.reward_scale must be a positive number or 'auto', got {scale!r}")
    elif not (math.isfinite(scale) and scale > 0):
        raise ConfigError(f"{source}: env.reward_scale must be a positive finite number or 'auto', got {scale!r}")
    if rms is not None and not (math.isfinite(rms) and rms > 0):
        raise ConfigError(f"{source}: env.reward_rms must be a positive finite number (the RMS of stored rewards this "
                          f"config was tuned at), got {rms!r}")


def _check_sequences(cfg: Config, source: str) -> None:
    """``replay.sequence_length`` > 0 exactly for an algorithm that trains on sequences, and an overlap
    that lets each sequence start after the one before."""
    rc, algo = cfg.replay, cfg.agent.algo
    if type(cfg.agent).SEQUENCES and rc.sequence_length == 0:
        raise ConfigError(f"{source}: replay.sequence_length: agent.algo={algo} trains on sequences; set the "
                          "trained steps per sequence (> 0; R2D2: 80, with replay.burn_in 40 and replay.overlap 40)")
    if not type(cfg.agent).SEQUENCES and rc.sequence_length > 0:
        raise ConfigError(f"{source}: replay.sequence_length: agent.algo={algo} trains on transitions, not "
                          f"sequences; leave it 0 (got {rc.sequence_length})")
    if type(cfg.agent).SEQUENCES and rc.device == "cuda":
        raise ConfigError(f"{source}: replay.device: agent.algo={algo} builds its sequences' targets from sampled "
                          "items on the host; set replay.device to auto or cpu (auto keeps them there)")
    if rc.sequence_length > 0 and rc.overlap >= rc.sequence_length:
        raise ConfigError(f"{source}: replay.overlap ({rc.overlap}) must be less than replay.sequence_length "
                          f"({rc.sequence_length}): a sequence starts every sequence_length - overlap steps")


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
