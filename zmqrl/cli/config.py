"""``zmqrl config [ALGO]``: every config key with its default, type and meaning, from the schema itself.

The descriptions are the one-line comments after each dataclass field in :mod:`zmqrl.config`
and in each algorithm's ``agent:`` dataclass, read from the source, so the schema stays the one
place a key is described. The listing is itself a valid YAML config of the defaults.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import io
import os
import sys
import textwrap
import tokenize
import typing
from functools import cache
from typing import Any

import yaml

from zmqrl.cli.common import Command
from zmqrl.config import AgentConfig, Config, ConfigError


@dataclasses.dataclass(frozen=True)
class Key:
    """One config key as the reference lists it."""

    name: str
    type: str
    default: Any
    description: str


@cache
def _own_comments(cls: type) -> dict[str, str]:
    """The ``# comment`` on the line(s) of each annotated assignment in ``cls``'s own body."""
    source = textwrap.dedent(inspect.getsource(cls))
    body = ast.parse(source).body[0]
    assert isinstance(body, ast.ClassDef)
    lines: dict[int, str] = {}
    for node in body.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            for line in range(node.lineno, (node.end_lineno or node.lineno) + 1):
                lines.setdefault(line, node.target.id)
    comments: dict[str, str] = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT and tok.start[0] in lines:
            comments.setdefault(lines[tok.start[0]], tok.string.lstrip("#").strip())
    return comments


def field_descriptions(cls: type) -> dict[str, str]:
    """One-line description of every field of the dataclass ``cls`` (inherited ones included;
    a subclass that redeclares a field describes it anew)."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if dataclasses.is_dataclass(klass) and klass is not object:
            docs.update(_own_comments(klass))
    return {f.name: docs.get(f.name, "") for f in dataclasses.fields(cls)}


def type_name(tp: Any) -> str:
    """``int``, ``list[int]``, ``float | None``: the annotation as a reader writes it."""
    if isinstance(tp, type) and not typing.get_args(tp):
        return tp.__name__
    return str(tp).replace("typing.", "").replace("NoneType", "None")


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None


def section_keys(cls: type) -> list[Key]:
    """Every field of one section's dataclass, in declaration order."""
    hints = typing.get_type_hints(cls)
    docs = field_descriptions(cls)
    return [Key(f.name, type_name(hints[f.name]), _default(f), docs[f.name]) for f in dataclasses.fields(cls)]


def sections(algo: str = "dqn") -> dict[str, type]:
    """Section name -> dataclass, with ``agent`` the section of ``algo``."""
    from zmqrl.agents.base import algorithm

    hints = typing.get_type_hints(Config)
    out: dict[str, type] = {}
    for f in dataclasses.fields(Config):
        out[f.name] = algorithm(algo).config_class if hints[f.name] is AgentConfig else hints[f.name]
    return out


def _yaml_value(value: Any) -> str:
    text = yaml.safe_dump(value, default_flow_style=True, width=10_000).strip()
    return text[:-3].rstrip() if text.endswith("...") else text


def _first_line(doc: str | None) -> str:
    return (doc or "").strip().splitlines()[0] if (doc or "").strip() else ""


def render(selected: dict[str, type]) -> str:
    """The listed sections as YAML: ``key: default  # type  description``."""
    rows: list[tuple[str, str, str]] = []  # (left part, type, description); type "" for a section header
    for name, cls in selected.items():
        rows.append((f"{name}:", "", _first_line(cls.__doc__)))
        for key in section_keys(cls):
            rows.append((f"  {key.name}: {_yaml_value(key.default)}", key.type, key.description))
    left = max(len(r[0]) for r in rows if r[1]) + 2
    width = max(len(r[1]) for r in rows) + 2
    lines = []
    for head, tp, desc in rows:
        if not tp:
            lines.append(f"{head}  # {desc}" if desc else head)
        else:
            lines.append(f"{head:<{left}}# {tp:<{width}}{desc}".rstrip())
    return "\n".join(lines)


def algorithms() -> list[tuple[str, str]]:
    """Every registered algorithm with the first line of its ``agent:`` docstring (or why it cannot load)."""
    from zmqrl.agents.base import algorithm
    from zmqrl.config.algorithms import ALGORITHMS

    out = []
    for name in ALGORITHMS:
        try:
            out.append((name, _first_line(algorithm(name).config_class.__doc__)))
        except ImportError as exc:
            out.append((name, f"(cannot be loaded here: {exc})"))
    return out


def reference(algo: str | None = None, everything: bool = False) -> str:
    """The text ``zmqrl config [ALGO] [--all]`` prints."""
    from zmqrl.config.algorithms import ALGORITHMS

    if algo is not None and algo not in ALGORITHMS:
        raise ConfigError(f"unknown algorithm {algo!r}; known: {', '.join(ALGORITHMS)}")
    try:
        selected = sections(algo or "dqn")
    except ImportError as exc:
        raise ConfigError(f"agent.algo: {algo} is registered but cannot be loaded: {exc}") from None
    if algo is not None and not everything:
        head = [f"# The agent: section of agent.algo={algo} (key: default  # type  meaning).",
                "# `zmqrl config` lists the other sections; override a key with --set agent.KEY=VALUE."]
        return "\n".join(head) + "\n" + render({"agent": selected["agent"]})
    head = [f"# Every zmqrl config key (key: default  # type  meaning); agent: is {algo or 'dqn'}'s section.",
            "# Set keys in a YAML file like this one, or with --set section.key=value."]
    tail = ["", "# Algorithms (agent.algo); `zmqrl config ALGO` lists the agent: section of one:"]
    names = algorithms()
    pad = max(len(n) for n, _ in names) + 2
    tail += [f"#   {name:<{pad}}{desc}" for name, desc in names]
    return "\n".join(head) + "\n" + render(selected) + "\n" + "\n".join(tail)


def cmd_config(args: argparse.Namespace) -> int:
    try:
        text = reference(args.algo, everything=args.all)
    except ConfigError as exc:
        print(f"zmqrl config: {exc}", file=sys.stderr)
        return 2
    try:
        print(text, flush=True)
    except BrokenPipeError:  # `zmqrl config | head`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


def config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("algo", nargs="?", metavar="ALGO", help="an algorithm (agent.algo): list its agent: section")
    p.add_argument("--all", action="store_true", help="with ALGO: every section, with that algorithm's agent:")


COMMANDS = [Command("config", "list every config key with its default, type and meaning", config_args, cmd_config,
                    "Print every config key with its default, type and one-line meaning, as YAML (the defaults); "
                    "with ALGO, the agent: section of that algorithm.")]
