"""Learning agents (torch only; nothing here knows about sockets)."""

from zmqrl.agents.dqn import DQNAgent, DQNPolicy, make_agent, make_policy, resolve_device

__all__ = ["DQNAgent", "DQNPolicy", "make_agent", "make_policy", "resolve_device"]
