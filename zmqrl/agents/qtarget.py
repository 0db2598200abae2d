"""The learner's side that DQN's and IQN's agents share (torch): an online network ``q`` with a
target copy, Adam on ``q``, the batch stager, the target update, the state a resume needs, and the
update's run as a static program or CUDA graph (:class:`~zmqrl.agents.graphs.CompiledUpdates`)."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from torch import nn

from zmqrl.agents.graphs import Bindings, CompiledUpdates
from zmqrl.agents.staging import BatchStager
from zmqrl.agents.torch_util import Adam, load_module_params, update_target


class TargetQAgent(CompiledUpdates):
    """Mixed into an agent whose policy has ``q``, ``device``, ``cfg`` (a QLearningConfig) and ``rng``;
    the agent writes :meth:`update_step` and calls :meth:`init_updates` last in its constructor."""

    q: Any  # the online network (the policy's)
    device: torch.device
    cfg: Any
    rng: np.random.Generator

    def init_learner(self, target: nn.Module) -> None:
        """``target`` (a network like ``q``) becomes the target copy; Adam on ``q``; counters at 0."""
        self.target = target.to(self.device)
        self.target.load_state_dict(self.q.state_dict())
        self.target.requires_grad_(False)
        self.optimizer = Adam(self.q.parameters(), lr=self.cfg.lr, eps=self.cfg.adam_eps)
        self.opt_steps = 0
        self.stager = BatchStager(self.device)  # how batches reach the device (replaceable: pinned or not)

    def adopt_initial(self, params: Mapping[str, np.ndarray]) -> None:
        """Start from version-0 parameters; the target network starts as their copy."""
        load_module_params(self.q, params)
        self.target.load_state_dict(self.q.state_dict())

    def update_target(self) -> None:
        """Hard copy (tau = 1) or Polyak average into the target network."""
        update_target(self.target, self.q, self.cfg.tau)

    def optimizers(self) -> list[Adam]:
        return [self.optimizer]

    def graph_bindings(self) -> Bindings:
        """The networks with their gradients and Adam's state: what a captured update must find in place."""
        return Bindings((self.q, self.target), self.optimizers())

    def state_dict(self) -> dict[str, Any]:
        """Networks, optimiser, counters and the exploration RNG, for resuming."""
        return {"q": self.q.state_dict(), "target": self.target.state_dict(),
                "optimizer": self.optimizer.state_dict(), "opt_steps": self.opt_steps,
                "rng": self.rng.bit_generator.state}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.q.load_state_dict(state["q"])
        self.target.load_state_dict(state["target"])
        self.optimizer.load_state_dict(copy.deepcopy(state["optimizer"]))  # never share Adam moments
        self.opt_steps = int(state["opt_steps"])
        self.rng.bit_generator.state = state["rng"]
