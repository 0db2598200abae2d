"""R2D2's acting half for the MLP + LSTM network in plain numpy (float32), and what both policies share.

The LSTM step is torch's (gates i, f, g, o from ``x W_ih^T + b_ih + h W_hh^T + b_hh``;
``c' = sigma(f) c + sigma(i) tanh(g)``, ``h' = sigma(o) tanh(c')``) with the same parameter names
(:mod:`zmqrl.agents.r2d2.networks`), so the learner publishes one set of arrays for either backend.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np

from zmqrl.agents.base import epsilon_greedy
from zmqrl.agents.numpy_mlp import Layer, as_rows, check_params, linear, linear_stack_shapes, relu_stack, stack_layers
from zmqrl.agents.r2d2.config import R2D2Config
from zmqrl.agents.r2d2.sequences import Layout, sequence_priorities, sequence_targets, td_errors

# Added to the forget gate's initial bias, so the cell keeps what it holds (sigma(1) = 0.73 a step
# rather than about 0.5) until training says otherwise: what SEED RL's Keras LSTMCell
# (unit_forget_bias) and Acme's Haiku LSTM do, and torch's LSTM does not (Jozefowicz et al. 2015).
FORGET_BIAS = 1.0
_ZERO = np.float32(0.0)
_HALF = np.float32(0.5)
_ONE = np.float32(1.0)

NOT_FEED_FORWARD = ("R2D2's policy is recurrent: act with act_recurrent(obs, explore, state) or "
                    "greedy_recurrent(obs, state), one state per env (zmqrl.core.RecurrentPolicy)")


def mlp_param_shapes(cfg: R2D2Config, obs_dim: int, num_actions: int) -> dict[str, tuple[int, ...]]:
    """Names and shapes of the MLP :class:`~zmqrl.agents.r2d2.networks.R2D2Network`'s parameters."""
    shapes = linear_stack_shapes("torso", obs_dim, cfg.hidden)
    features = cfg.hidden[-1] if cfg.hidden else obs_dim
    size = cfg.lstm_size
    shapes.update({"lstm.weight_ih_l0": (4 * size, features), "lstm.weight_hh_l0": (4 * size, size),
                   "lstm.bias_ih_l0": (4 * size,), "lstm.bias_hh_l0": (4 * size,)})
    streams = {"advantage": num_actions, **({"value": 1} if cfg.dueling else {})}
    for stream, out in streams.items():
        if cfg.head_hidden:
            shapes.update(linear_stack_shapes(f"head.{stream}", size, [cfg.head_hidden]))
            shapes[f"head.{stream}.2.weight"] = (out, cfg.head_hidden)
            shapes[f"head.{stream}.2.bias"] = (out,)
        else:
            shapes[f"head.{stream}.weight"] = (out, size)
            shapes[f"head.{stream}.bias"] = (out,)
    return shapes


def initial_mlp_params(cfg: R2D2Config, obs_dim: int, num_actions: int, seed: int) -> dict[str, np.ndarray]:
    """The MLP network's parameters drawn like the torch network's: ``nn.Linear``'s uniform in
    ±1/sqrt(fan_in), ``nn.LSTM``'s uniform in ±1/sqrt(lstm_size), and the forget gate's bias raised by
    :data:`FORGET_BIAS` (1)."""
    shapes = mlp_param_shapes(cfg, obs_dim, num_actions)
    rng = np.random.default_rng(seed)
    params = {}
    for name, shape in shapes.items():
        fan_in = cfg.lstm_size if name.startswith("lstm.") else shapes[name.rsplit(".", 1)[0] + ".weight"][1]
        bound = 1.0 / math.sqrt(fan_in)
        params[name] = rng.uniform(-bound, bound, shape).astype(np.float32)
    params["lstm.bias_ih_l0"][cfg.lstm_size:2 * cfg.lstm_size] += np.float32(FORGET_BIAS)
    return params


def _sigmoid(x: np.ndarray) -> np.ndarray:
    """The logistic function through tanh (no overflow for large |x|), in place."""
    x *= _HALF
    np.tanh(x, out=x)
    x += _ONE
    x *= _HALF
    return x


def local_priorities(q: np.ndarray, batch: Mapping[str, np.ndarray], layout: Layout, cfg: R2D2Config) -> np.ndarray:
    """Initial priorities of sequence items from the Q-values ``(N, T, A)`` of one network, which stands in
    for both the online and the target network: the learner's formula (:mod:`zmqrl.agents.r2d2.agent`)
    with the bootstrap action's value its max."""
    b, length = layout.burn_in, layout.length
    targets = sequence_targets(batch["reward"], batch["discount"], batch["mask"], b, cfg.n_step)
    td = td_errors(q[:, b:b + length], q[:, b:].max(axis=2), np.asarray(batch["action"])[:, b:b + length], targets,
                   cfg.value_rescaling, cfg.rescale_eps)
    return sequence_priorities(td, targets.trainable, cfg.priority_eta)


class RecurrentActing:
    """The acting side of a recurrent policy (``RecurrentPolicy``) over its ``step(obs, state) -> (q, state)``:
    one state per env, epsilon-greedy or greedy actions; the feed-forward calls refuse. Shared by the
    numpy policy and the torch one."""

    lstm_size: int
    num_actions: int
    rng: np.random.Generator

    def step(self, obs: np.ndarray, state: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        raise NotImplementedError

    def initial_state(self, n: int) -> np.ndarray:
        """The state of ``n`` envs at an episode's start: zeros ``(n, 2, lstm_size)`` float32."""
        return np.zeros((n, 2, self.lstm_size), dtype=np.float32)

    def act_recurrent(self, obs: np.ndarray, explore: float | np.ndarray, state: np.ndarray
                      ) -> tuple[np.ndarray, np.ndarray]:
        """Epsilon-greedy actions (``explore`` is epsilon, a scalar or one per row) and the next state."""
        q, state = self.step(obs, state)
        return epsilon_greedy(q.argmax(axis=1), explore, self.rng, self.num_actions), state

    def greedy_recurrent(self, obs: np.ndarray, state: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Greedy actions and the next state."""
        q, state = self.step(obs, state)
        return q.argmax(axis=1), state

    def act(self, obs: np.ndarray, explore: Any) -> np.ndarray:
        raise TypeError(NOT_FEED_FORWARD)

    def greedy(self, obs: np.ndarray) -> np.ndarray:
        raise TypeError(NOT_FEED_FORWARD)


class NumpyR2D2Policy(RecurrentActing):
    """Epsilon-greedy acting over the MLP + LSTM network with a state per env (:class:`~zmqrl.core.RecurrentPolicy`)."""

    def __init__(self, cfg: R2D2Config, layout: Layout, obs_space: gym.spaces.Space,
                 action_space: gym.spaces.Discrete, seed: int = 0) -> None:
        self.cfg = cfg
        self.layout = layout
        self.num_actions = int(action_space.n)
        self.lstm_size = cfg.lstm_size
        self.shapes = mlp_param_shapes(cfg, int(np.prod(obs_space.shape or ())), self.num_actions)
        self.rng = np.random.default_rng(seed)
        self.load_params(initial_mlp_params(cfg, int(np.prod(obs_space.shape or ())), self.num_actions, seed))

    def load_params(self, params: Mapping[str, np.ndarray]) -> None:
        """Take named arrays from the learner; names and shapes must match exactly."""
        check_params(params, self.shapes)
        self.torso = stack_layers(params, "torso", len(self.cfg.hidden))
        w_ih = np.asarray(params["lstm.weight_ih_l0"], dtype=np.float32)
        w_hh = np.asarray(params["lstm.weight_hh_l0"], dtype=np.float32)
        self.w_x = np.array(w_ih.T, order="C")  # (F, 4H), a copy
        self.w_h = np.array(w_hh.T, order="C")  # (H, 4H), a copy
        self.bias = (np.asarray(params["lstm.bias_ih_l0"], dtype=np.float64)
                     + np.asarray(params["lstm.bias_hh_l0"], dtype=np.float64)).astype(np.float32)
        self.streams: dict[str, list[Layer]] = {}
        for stream in ("advantage", "value") if self.cfg.dueling else ("advantage",):
            if self.cfg.head_hidden:
                self.streams[stream] = [linear(params, f"head.{stream}.0"), linear(params, f"head.{stream}.2")]
            else:
                self.streams[stream] = [linear(params, f"head.{stream}")]

    # --- the network -------------------------------------------------------------------------
    def features(self, obs: np.ndarray) -> np.ndarray:
        """Torso features of a batch of observations, float32 ``(n, F)``."""
        return relu_stack(as_rows(obs), self.torso)

    def lstm_step(self, x: np.ndarray, h: np.ndarray, c: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """One LSTM step: features ``x`` (n, F) and the state ``h``, ``c`` (n, H) -> the next ``h``, ``c``."""
        size = self.lstm_size
        gates = x @ self.w_x
        gates += h @ self.w_h
        gates += self.bias
        i = _sigmoid(gates[:, :size])
        f = _sigmoid(gates[:, size:2 * size])
        g = np.tanh(gates[:, 2 * size:3 * size])
        o = _sigmoid(gates[:, 3 * size:])
        c_next = f * c + i * g
        return o * np.tanh(c_next), c_next

    def head(self, h: np.ndarray) -> np.ndarray:
        """Q-values ``(n, A)`` of LSTM outputs ``(n, H)``."""

        def stream(layers: list[Layer]) -> np.ndarray:
            x = relu_stack(h, layers[:-1])  # a new array after the first product: h stays as it is
            w, b = layers[-1]
            out = x @ w
            out += b
            return out

        adv = stream(self.streams["advantage"])
        if "value" not in self.streams:
            return adv
        return stream(self.streams["value"]) + adv - adv.mean(axis=1, keepdims=True)  # type: ignore[no-any-return]

    def step(self, obs: np.ndarray, state: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Q-values ``(n, A)`` of one step per env from ``state`` ``(n, 2, H)``, and the state after it."""
        state = np.asarray(state, dtype=np.float32)
        h, c = self.lstm_step(self.features(obs), state[:, 0], state[:, 1])
        return self.head(h), np.stack((h, c), axis=1)

    def sequence_q(self, obs: np.ndarray, state_h: np.ndarray, state_c: np.ndarray,
                   mask: np.ndarray | None = None) -> np.ndarray:
        """Q-values ``(N, T, A)`` of items ``(N, T, ...)`` from their stored states; padding (``mask`` 0)
        leaves the state as it was."""
        n, steps = obs.shape[:2]
        x = self.features(obs.reshape(n * steps, *obs.shape[2:])).reshape(n, steps, -1)
        h, c = np.asarray(state_h, dtype=np.float32), np.asarray(state_c, dtype=np.float32)
        out = np.empty((n, steps, self.lstm_size), dtype=np.float32)
        for t in range(steps):
            h_t, c_t = self.lstm_step(x[:, t], h, c)
            if mask is not None:
                hold = (np.asarray(mask)[:, t] == 0)[:, None]
                h_t, c_t = np.where(hold, h, h_t), np.where(hold, c, c_t)
            h, c = h_t, c_t
            out[:, t] = h
        return self.head(out.reshape(n * steps, -1)).reshape(n, steps, -1)

    def priorities(self, batch: Mapping[str, np.ndarray]) -> np.ndarray:
        """Initial priorities of sequence items, this network standing in for the target (:func:`local_priorities`)."""
        q = self.sequence_q(np.asarray(batch["obs"]), batch["state_h"], batch["state_c"], batch["mask"])
        return local_priorities(q, batch, self.layout, self.cfg)
