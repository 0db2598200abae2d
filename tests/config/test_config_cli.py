"""``zmqrl config``: every key of every section with its type, default and description, from the schema."""

from __future__ import annotations

import dataclasses
import importlib.util
import re
import typing

import pytest
import yaml

from zmqrl import cli, config
from zmqrl.agents.base import algorithm
from zmqrl.cli.config import field_descriptions, type_name
from zmqrl.config import AgentConfig, Config
from zmqrl.config.algorithms import ALGORITHMS

LINE = re.compile(r"^  (\w+): (.*?)  +# (\S.*?)  +(\S.*)$")  # key: default  # type  description
SAC = importlib.util.find_spec("zmqrl.agents.sac") is not None


def sections_of(algo: str) -> dict[str, type]:
    hints = typing.get_type_hints(Config)
    return {f.name: algorithm(algo).config_class if hints[f.name] is AgentConfig else hints[f.name]
            for f in dataclasses.fields(Config)}


def listed(text: str) -> dict[str, dict[str, tuple[str, str]]]:
    """``section -> key -> (type, description)`` from the printed reference."""
    out: dict[str, dict[str, tuple[str, str]]] = {}
    section = ""
    for line in text.splitlines():
        if re.match(r"^\w+:", line):
            section = line.split(":")[0]
            out[section] = {}
        elif line.startswith("  "):
            m = LINE.match(line)
            assert m, f"cannot read {line!r}"
            out[section][m.group(1)] = (m.group(3), m.group(4))
    return out


def test_config_lists_every_field_of_every_section(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["config"]) == 0
    text = capsys.readouterr().out
    assert yaml.safe_load(text) == config.to_dict(Config())  # the listing is a YAML config of the defaults
    got = listed(text)
    want = sections_of("dqn")
    assert list(got) == list(want)
    for name, cls in want.items():
        hints = typing.get_type_hints(cls)
        fields = dataclasses.fields(cls)
        assert list(got[name]) == [f.name for f in fields], name
        for f in fields:
            tp, desc = got[name][f.name]
            assert tp == type_name(hints[f.name])
            assert desc == field_descriptions(cls)[f.name] and len(desc) > 5, f"{name}.{f.name}"
    for algo in ALGORITHMS:
        assert re.search(rf"^#   {algo} ", text, re.M), f"algorithm {algo} not listed"


def test_types_read_as_written() -> None:
    assert type_name(typing.get_type_hints(config.TrainerConfig)["stop_return"]) == "float | None"
    assert type_name(typing.get_type_hints(config.EnvConfig)["wrappers"]) == "list[str]"
    assert type_name(typing.get_type_hints(config.EnvConfig)["kwargs"]) == "dict[str, Any]"
    assert type_name(int) == "int"


def loadable_algorithms() -> list[str]:
    return [a for a in ALGORITHMS if importlib.util.find_spec(ALGORITHMS[a]) is not None]


@pytest.mark.parametrize("algo", loadable_algorithms())
def test_every_field_of_every_algorithm_has_a_description(algo: str) -> None:
    for name, cls in sections_of(algo).items():
        docs = field_descriptions(cls)
        missing = [k for k, v in docs.items() if not v]
        assert not missing, f"{name} fields without a '# comment' in the schema: {missing}"


def test_config_dqn_lists_the_agent_section(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["config", "dqn"]) == 0
    text = capsys.readouterr().out
    assert yaml.safe_load(text) == {"agent": dataclasses.asdict(algorithm("dqn").config_class())}
    assert list(listed(text)["agent"])[:4] == ["algo", "gamma", "n_step", "batch_size"]
    assert cli.main(["config", "dqn", "--all"]) == 0
    assert yaml.safe_load(capsys.readouterr().out) == config.to_dict(Config())


@pytest.mark.skipif(not SAC, reason="SAC (zmqrl/agents/sac) is not in this tree")
def test_config_sac_lists_sacs_agent_section(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["config", "sac"]) == 0
    text = capsys.readouterr().out
    sac = algorithm("sac").config_class
    assert yaml.safe_load(text) == {"agent": dataclasses.asdict(sac())}
    assert list(listed(text)["agent"]) == [f.name for f in dataclasses.fields(sac)]
    assert "agent.algo=sac" in text


def test_unknown_algorithm_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["config", "ppo"]) == 2
    err = capsys.readouterr().err
    assert err.strip() == f"zmqrl config: unknown algorithm 'ppo'; known: {', '.join(ALGORITHMS)}"


def test_set_errors_point_to_zmqrl_config(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["train", "--set", "replay.capacty=10"]) == 2
    err = capsys.readouterr().err
    assert "did you mean 'capacity'? `zmqrl config` lists every key" in err
    assert cli.main(["train", "--set", "trainr.max_opts=10"]) == 2
    assert "did you mean 'trainer'? `zmqrl config` lists every key" in capsys.readouterr().err
    with pytest.raises(config.ConfigError, match="valid keys: .*; `zmqrl config` lists every key"):
        config.load(None, ["replay.zzzzzzzz=1"])
