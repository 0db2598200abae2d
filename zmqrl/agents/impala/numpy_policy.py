"""IMPALA's and APPO's acting half in plain numpy, and what both policies share (torch-free).

The policy network is an MLP torso (``torso``: Linear and tanh or ReLU layers) and a head: for
Discrete actions ``logits`` (a categorical policy), for Box actions ``mean`` and a state-independent
``log_std`` (a Gaussian). A Gaussian's action is the sample itself, kept with its log-density (as SB3's
and CleanRL's PPO do); the acting loop clips it to the Box for the env alone. The log-density of a clipped
action would fall without bound as the mean leaves the Box (the mass beyond a bound all lands on it), and
the intake rightly refuses log-probabilities no policy should draw; a sample's log-density stays near
the policy's own entropy. The learner computes the same arithmetic on the same action, so importance
weights compare like with like. The value network lives on the learner alone. Parameters keep the torch modules' names
and shapes (:func:`policy_param_shapes`), so the learner publishes the same arrays to either backend.

With ``agent.normalize_observations`` (SB3's VecNormalize of observations, Sample Factory's normalised input)
the published parameters hold the running ``obs_mean`` and ``obs_var`` the learner keeps over the segments it
trains on; every backend maps an observation to ``clip((x - mean) / sqrt(var + 1e-8), +-agent.obs_clip)``
before the torso, so actors, the evaluator and the learner see the same inputs from one version.

Actions are drawn from the policy in every actor (no ε): an on-policy algorithm explores by the
entropy of its own policy. Each :meth:`NumpyActorCriticPolicy.act` call keeps the log-probability of
every action it drew (:class:`~zmqrl.core.RecordsLogProbs`), which the actor sends with the segment.

With ``agent.lstm_size`` an LSTM (torch's gate layout and names, as R2D2's,
:mod:`zmqrl.agents.r2d2.numpy_policy`) follows the torso: :class:`NumpyRecurrentActorCritic` acts with a
state per env (:class:`~zmqrl.core.RecurrentPolicy`), and the learner's value head reads the same LSTM.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import gymnasium as gym
import numpy as np

from zmqrl.agents.impala.config import ImpalaConfig
from zmqrl.agents.numpy_mlp import Layer, as_rows, check_params, linear, linear_stack_shapes
from zmqrl.agents.r2d2.numpy_policy import FORGET_BIAS, NOT_FEED_FORWARD

HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)
OBS_EPS = 1e-8  # added to the observations' running variance before its square root (SB3's VecNormalize)
LOGP_MIN = -1000.0  # no honest policy draws an action whose log-probability is below this (its chance: e^-1000)


def policy_param_shapes(cfg: ImpalaConfig, obs_dim: int, action_space: gym.spaces.Space) -> dict[str, tuple[int, ...]]:
    """Names and shapes of :class:`~zmqrl.agents.impala.agent.PolicyNet`'s parameters (its ``state_dict``):
    with ``agent.normalize_observations`` the running ``obs_mean`` and ``obs_var`` the learner keeps first."""
    shapes: dict[str, tuple[int, ...]] = {}
    if cfg.normalize_observations:
        shapes.update({"obs_mean": (obs_dim,), "obs_var": (obs_dim,)})
    shapes.update(linear_stack_shapes("torso", obs_dim, cfg.hidden))
    last = cfg.hidden[-1] if cfg.hidden else obs_dim
    if cfg.lstm_size:
        size = cfg.lstm_size
        shapes.update({"lstm.weight_ih_l0": (4 * size, last), "lstm.weight_hh_l0": (4 * size, size),
                       "lstm.bias_ih_l0": (4 * size,), "lstm.bias_hh_l0": (4 * size,)})
        last = size
    if isinstance(action_space, gym.spaces.Discrete):
        shapes["logits.weight"], shapes["logits.bias"] = (int(action_space.n), last), (int(action_space.n),)
    else:
        act_dim = int(np.prod(action_space.shape or ()))
        shapes["mean.weight"], shapes["mean.bias"] = (act_dim, last), (act_dim,)
        shapes["log_std"] = (act_dim,)
    return shapes


def orthogonal(shape: tuple[int, int], gain: float, rng: np.random.Generator) -> np.ndarray:
    """A (rows, cols) matrix with orthonormal rows or columns times ``gain`` (Saxe et al. 2014; torch's
    ``nn.init.orthogonal_``), drawn with numpy."""
    rows, cols = shape
    flat = rng.standard_normal((max(rows, cols), min(rows, cols)))
    q, r = np.linalg.qr(flat)
    q *= np.sign(np.diag(r))
    if rows < cols:
        q = q.T
    return (gain * q[:rows, :cols]).astype(np.float32)


def initial_policy_params(cfg: ImpalaConfig, obs_dim: int, action_space: gym.spaces.Space,
                          seed: int) -> dict[str, np.ndarray]:
    """Version-0 policy parameters: orthogonal weights, gain sqrt(2) in the torso and 0.01 in the head, zero
    biases and ``log_std`` at ``agent.log_std_init`` (the initialisation of OpenAI Baselines' and SB3's PPO,
    which keeps the first policy close to uniform); an LSTM's as torch draws them (uniform in
    ±1/sqrt(lstm_size)) with the forget gate's bias raised by 1, as R2D2's."""
    rng = np.random.default_rng(seed)
    params: dict[str, np.ndarray] = {}
    for name, shape in policy_param_shapes(cfg, obs_dim, action_space).items():
        if name.startswith("lstm."):
            bound = 1.0 / math.sqrt(cfg.lstm_size)
            params[name] = rng.uniform(-bound, bound, shape).astype(np.float32)
            if name == "lstm.bias_ih_l0":
                params[name][cfg.lstm_size:2 * cfg.lstm_size] += np.float32(FORGET_BIAS)
        elif name in ("obs_mean", "obs_var"):  # no observation seen yet: normalisation starts as the identity
            params[name] = np.full(shape, 0.0 if name == "obs_mean" else 1.0, dtype=np.float32)
        elif name == "log_std":
            params[name] = np.full(shape, cfg.log_std_init, dtype=np.float32)
        elif name.endswith(".bias"):
            params[name] = np.zeros(shape, dtype=np.float32)
        else:
            gain = 0.01 if name.startswith(("logits", "mean")) else math.sqrt(2.0)
            params[name] = orthogonal((shape[0], shape[1]), gain, rng)
    return params


def logp_bound(cfg: ImpalaConfig, action_space: gym.spaces.Space) -> float:
    """The largest log-probability an honest action can carry: 0 for a categorical policy; for a Gaussian the
    log-density at its mean with the smallest standard deviation allowed, ``-dim (log(2 pi)/2 + log_std_min)``."""
    if isinstance(action_space, gym.spaces.Discrete):
        return 0.0
    act_dim = int(np.prod(action_space.shape or ()))
    return float(act_dim * (-HALF_LOG_2PI - cfg.log_std_min))


def sigmoid(x: np.ndarray) -> np.ndarray:
    """The logistic function through tanh (no overflow for large |x|)."""
    return np.float32(0.5) * (np.tanh(np.float32(0.5) * x) + np.float32(1.0))  # type: ignore[no-any-return]


def log_softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max(axis=1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))  # type: ignore[no-any-return]


class NumpyActorCriticPolicy:
    """The policy network evaluated with numpy (float32): categorical for Discrete actions, Gaussian
    (clipped to the bounds) for Box actions."""

    def __init__(self, cfg: ImpalaConfig, obs_space: gym.spaces.Space, action_space: gym.spaces.Space,
                 seed: int = 0) -> None:
        self.cfg = cfg
        self.discrete = isinstance(action_space, gym.spaces.Discrete)
        self.shapes = policy_param_shapes(cfg, int(np.prod(obs_space.shape or ())), action_space)
        if not self.discrete:
            assert isinstance(action_space, gym.spaces.Box)
            self.low = np.asarray(action_space.low, dtype=np.float32).reshape(-1)
            self.high = np.asarray(action_space.high, dtype=np.float32).reshape(-1)
            self.dtype = np.dtype(action_space.dtype or np.float32)
        self.relu = cfg.activation == "relu"
        self.rng = np.random.default_rng(seed)
        self._logp = np.zeros(0, dtype=np.float32)
        self.load_params(initial_policy_params(cfg, int(np.prod(obs_space.shape or ())), action_space, seed))

    def load_params(self, params: Mapping[str, np.ndarray]) -> None:
        """Take named arrays from the learner; names and shapes must match exactly."""
        check_params(params, self.shapes)
        self.torso: list[Layer] = [linear(params, f"torso.{2 * i}") for i in range(len(self.cfg.hidden))]
        self.head = linear(params, "logits" if self.discrete else "mean")
        if not self.discrete:
            self.log_std = np.maximum(np.asarray(params["log_std"], dtype=np.float32), np.float32(self.cfg.log_std_min))
        self.obs_norm: tuple[np.ndarray, np.ndarray, np.float32] | None = None  # mean, 1/std, clip
        if self.cfg.normalize_observations:
            self.obs_norm = (np.array(params["obs_mean"], dtype=np.float32),
                             obs_scale(np.asarray(params["obs_var"], dtype=np.float32)),
                             np.float32(self.cfg.obs_clip))

    def _torso(self, obs: np.ndarray) -> np.ndarray:
        x = as_rows(obs)
        if self.obs_norm is not None:
            mean, scale, clip = self.obs_norm
            x = np.clip((x - mean) * scale, -clip, clip)
        for w, b in self.torso:
            x = x @ w
            x += b
            if self.relu:
                np.maximum(x, np.float32(0.0), out=x)
            else:
                np.tanh(x, out=x)
        return x

    def _out(self, x: np.ndarray) -> np.ndarray:
        out = x @ self.head[0]
        out += self.head[1]
        return out  # type: ignore[no-any-return]

    def _head(self, obs: np.ndarray) -> np.ndarray:
        return self._out(self._torso(obs))

    def greedy(self, obs: np.ndarray) -> np.ndarray:
        """The most likely action: the largest logit, or the Gaussian's mean clipped to the bounds."""
        return self._mode(self._head(obs))

    def _mode(self, out: np.ndarray) -> np.ndarray:
        if self.discrete:
            return out.argmax(axis=1).astype(np.int64)  # type: ignore[no-any-return]
        return np.clip(out, self.low, self.high).astype(self.dtype, copy=False)  # type: ignore[no-any-return]

    def act(self, obs: np.ndarray, explore: float | np.ndarray) -> np.ndarray:
        """Actions drawn from the policy (``explore`` is not used: the policy's own entropy explores); their
        log-probabilities are kept for :meth:`acted_log_probs`."""
        return self._sample(self._head(obs))

    def _sample(self, out: np.ndarray) -> np.ndarray:
        if self.discrete:
            logp_all = log_softmax(out.astype(np.float64))
            gumbel = -np.log(-np.log(self.rng.random(out.shape)))
            action = (logp_all + gumbel).argmax(axis=1)
            self._logp = np.take_along_axis(logp_all, action[:, None], axis=1)[:, 0].astype(np.float32)
            return action.astype(np.int64)  # type: ignore[no-any-return]
        std = np.exp(self.log_std)
        sample = (out + std * self.rng.standard_normal(out.shape, dtype=np.float32)).astype(np.float32)
        self._logp = gaussian_logp(sample, out, self.log_std)
        return sample.astype(self.dtype, copy=False)  # type: ignore[no-any-return]

    def acted_log_probs(self) -> np.ndarray:
        """The log-probability of each action the last :meth:`act` call drew (float32, one per row)."""
        return self._logp

    def priorities(self, batch: Mapping[str, np.ndarray]) -> None:
        """None: an on-policy store has no priorities."""
        return None


class NumpyRecurrentActorCritic(NumpyActorCriticPolicy):
    """The policy with an LSTM after its torso, acting with a state per env (:class:`~zmqrl.core.RecurrentPolicy`):
    ``(n, 2, lstm_size)``, h then c; the feed-forward calls refuse."""

    def __init__(self, cfg: ImpalaConfig, obs_space: gym.spaces.Space, action_space: gym.spaces.Space,
                 seed: int = 0) -> None:
        self.lstm_size = cfg.lstm_size
        super().__init__(cfg, obs_space, action_space, seed)

    def load_params(self, params: Mapping[str, np.ndarray]) -> None:
        super().load_params(params)
        self.w_x = np.array(np.asarray(params["lstm.weight_ih_l0"], dtype=np.float32).T, order="C")  # (F, 4H)
        self.w_h = np.array(np.asarray(params["lstm.weight_hh_l0"], dtype=np.float32).T, order="C")  # (H, 4H)
        self.bias = (np.asarray(params["lstm.bias_ih_l0"], dtype=np.float64)
                     + np.asarray(params["lstm.bias_hh_l0"], dtype=np.float64)).astype(np.float32)

    def initial_state(self, n: int) -> np.ndarray:
        """Zeros ``(n, 2, lstm_size)``: an episode's first step."""
        return np.zeros((n, 2, self.lstm_size), dtype=np.float32)

    def step(self, obs: np.ndarray, state: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The head's output for one step per env from ``state``, and the state after it (torch's LSTM step)."""
        state = np.asarray(state, dtype=np.float32)
        size, h, c = self.lstm_size, state[:, 0], state[:, 1]
        gates = self._torso(obs) @ self.w_x
        gates += h @ self.w_h
        gates += self.bias
        i, f = sigmoid(gates[:, :size]), sigmoid(gates[:, size:2 * size])
        g, o = np.tanh(gates[:, 2 * size:3 * size]), sigmoid(gates[:, 3 * size:])
        c_next = f * c + i * g
        h_next = o * np.tanh(c_next)
        return self._out(h_next), np.stack((h_next, c_next), axis=1)

    def act_recurrent(self, obs: np.ndarray, explore: float | np.ndarray,
                      state: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Actions drawn from the policy (log-probabilities kept) and the state after them."""
        out, state = self.step(obs, state)
        return self._sample(out), state

    def greedy_recurrent(self, obs: np.ndarray, state: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        out, state = self.step(obs, state)
        return self._mode(out), state

    def act(self, obs: np.ndarray, explore: float | np.ndarray) -> np.ndarray:
        raise TypeError(NOT_FEED_FORWARD.replace("R2D2's", "This"))

    def greedy(self, obs: np.ndarray) -> np.ndarray:
        raise TypeError(NOT_FEED_FORWARD.replace("R2D2's", "This"))


def obs_scale(var: np.ndarray) -> np.ndarray:
    """1 / sqrt(var + OBS_EPS): what a normalised observation's offset from the mean is multiplied by."""
    return (1.0 / np.sqrt(np.maximum(var, 0.0) + OBS_EPS)).astype(np.float32)  # type: ignore[no-any-return]


def gaussian_logp(action: np.ndarray, mean: np.ndarray, log_std: np.ndarray) -> np.ndarray:
    """log N(action; mean, exp(log_std)) summed over action dims (float32 rows)."""
    z = (np.asarray(action, np.float64) - mean) / np.exp(log_std.astype(np.float64))
    logp = (-0.5 * z * z - log_std - HALF_LOG_2PI).sum(axis=1)
    return logp.astype(np.float32)  # type: ignore[no-any-return]
