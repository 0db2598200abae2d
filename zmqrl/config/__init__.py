"""The run configuration: one dataclass schema (:mod:`~zmqrl.config.schema`), YAML load, validation,
``--set`` overrides and dump (:mod:`~zmqrl.config.load`)."""

from zmqrl.config.load import apply_overrides, dump, from_dict, load, parse_override, to_dict, to_flat_dict
from zmqrl.config.schema import (
    ActorConfig,
    AgentConfig,
    Config,
    ConfigError,
    EnvConfig,
    NetConfig,
    ReplayConfig,
    RunConfig,
    TrainerConfig,
    agent_config_class,
)

__all__ = [
    "ActorConfig", "AgentConfig", "Config", "ConfigError", "EnvConfig", "NetConfig", "ReplayConfig", "RunConfig",
    "TrainerConfig", "agent_config_class", "apply_overrides", "dump", "from_dict", "load", "parse_override",
    "to_dict", "to_flat_dict",
]
