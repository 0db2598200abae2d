"""IQN's acting half for MLP networks in plain numpy, and the quantile arithmetic both policies share.

The network maps an observation ``x`` and a fraction ``tau`` in (0, 1) to the tau-quantile of the
return of every action: ``head(torso(x) * relu(embed(cos(pi * i * tau))))`` with ``i = 0 .. 63``
(Dabney et al. 2018, eq. 4). Q is the mean over fractions:

- acting (``act``) draws ``K`` fractions per row uniformly from the policy's numpy RNG, as the
  paper does; the torch policy draws them from the same RNG in the same order, so with the same
  seed and parameters the two act alike;
- ``greedy`` (evaluation, ``zmqrl enjoy``) must be deterministic: it averages over the ``K``
  midpoints ``(k + 0.5) / K``, the midpoint rule for the integral over tau.

Parameters keep the torch module's ``state_dict`` names (see
:class:`~zmqrl.agents.iqn.networks.IQNNetwork`), so the learner publishes the same arrays for
either backend.
"""

from __future__ import annotations

from collections.abc import Mapping

import gymnasium as gym
import numpy as np

from zmqrl.agents.base import epsilon_greedy
from zmqrl.agents.iqn.config import IQNConfig
from zmqrl.agents.numpy_mlp import (
    Layer,
    as_rows,
    check_params,
    linear,
    linear_stack_shapes,
    relu_stack,
    stack_layers,
    torch_default_init,
)

_PI = np.float32(np.pi)
_ZERO = np.float32(0.0)


def midpoint_taus(k: int) -> np.ndarray:
    """The ``k`` fractions ``(j + 0.5) / k``: a deterministic stand-in for ``k`` uniform draws."""
    return ((np.arange(k, dtype=np.float64) + 0.5) / k).astype(np.float32)


def draw_taus(rng: np.random.Generator, rows: int, k: int) -> np.ndarray:
    """``k`` fractions per row, uniform in [0, 1), float32 (what both policies act with)."""
    return rng.random((rows, k), dtype=np.float32)


def cosine_features(taus: np.ndarray, embed_dim: int) -> np.ndarray:
    """``cos(pi * i * tau)`` for ``i = 0 .. embed_dim - 1``: shape ``taus.shape + (embed_dim,)``."""
    i = _PI * np.arange(embed_dim, dtype=np.float32)
    return np.cos(np.asarray(taus, dtype=np.float32)[..., None] * i)  # type: ignore[no-any-return]


def quantile_huber(u: np.ndarray, taus: np.ndarray, kappa: float) -> np.ndarray:
    """``|tau - 1{u < 0}| * huber_kappa(u) / kappa`` elementwise (Dabney et al. 2018, eq. 10).

    ``u`` is target minus prediction, with the prediction's fraction ``taus`` broadcast against it.
    """
    a = np.abs(u)
    huber = np.where(a <= kappa, 0.5 * u * u, kappa * (a - 0.5 * kappa))
    return np.abs(taus - (u < 0)) * huber / kappa  # type: ignore[no-any-return]


def pairwise_priority(target: np.ndarray, pred: np.ndarray, pred_taus: np.ndarray, kappa: float) -> np.ndarray:
    """Each row's quantile Huber loss averaged over its (target, prediction) pairs.

    ``target`` (n, N'), ``pred`` (n, N) with fractions ``pred_taus`` (N,) or (n, N). This is the
    per-transition loss divided by N (the loss sums over predictions): replay only compares
    priorities, and this scale does not depend on how many fractions were drawn.
    """
    u = target[:, :, None] - pred[:, None, :]
    taus = np.broadcast_to(pred_taus, pred.shape)[:, None, :]
    return quantile_huber(u, taus, kappa).mean(axis=(1, 2)).astype(np.float32)  # type: ignore[no-any-return]


def feature_dim(cfg: IQNConfig, obs_dim: int) -> int:
    return cfg.hidden[-1] if cfg.hidden else obs_dim


def mlp_param_shapes(cfg: IQNConfig, obs_dim: int, num_actions: int) -> dict[str, tuple[int, ...]]:
    """Names and shapes of the MLP :class:`~zmqrl.agents.iqn.networks.IQNNetwork`'s parameters."""
    shapes = linear_stack_shapes("torso", obs_dim, cfg.hidden)
    features = feature_dim(cfg, obs_dim)
    shapes["embed.weight"] = (features, cfg.embed_dim)
    shapes["embed.bias"] = (features,)
    shapes.update(linear_stack_shapes("head", features, cfg.head_hidden))
    last = cfg.head_hidden[-1] if cfg.head_hidden else features
    out = f"head.{2 * len(cfg.head_hidden)}"
    shapes[f"{out}.weight"] = (num_actions, last)
    shapes[f"{out}.bias"] = (num_actions,)
    return shapes


def initial_mlp_params(cfg: IQNConfig, obs_dim: int, num_actions: int, seed: int) -> dict[str, np.ndarray]:
    """The MLP network's parameters drawn like torch's default ``nn.Linear`` init."""
    return torch_default_init(mlp_param_shapes(cfg, obs_dim, num_actions), seed)


class NumpyIQNPolicy:
    """Epsilon-greedy policy over an MLP implicit quantile network, evaluated with numpy (float32)."""

    def __init__(self, cfg: IQNConfig, obs_space: gym.spaces.Space, action_space: gym.spaces.Discrete,
                 seed: int = 0) -> None:
        self.cfg = cfg
        self.num_actions = int(action_space.n)
        obs_dim = int(np.prod(obs_space.shape or ()))
        self.shapes = mlp_param_shapes(cfg, obs_dim, self.num_actions)
        self.rng = np.random.default_rng(seed)
        self.act_taus = midpoint_taus(cfg.n_act_quantiles)
        self.load_params(torch_default_init(self.shapes, seed))

    def load_params(self, params: Mapping[str, np.ndarray]) -> None:
        """Take named arrays from the learner; names and shapes must match exactly."""
        check_params(params, self.shapes)
        depth = len(self.cfg.head_hidden)
        self.torso = stack_layers(params, "torso", len(self.cfg.hidden))
        self.embed = linear(params, "embed")
        self.head: list[Layer] = stack_layers(params, "head", depth)
        self.out = linear(params, f"head.{2 * depth}")
        # the embedding of the fixed greedy fractions depends on the parameters only
        self._greedy_embedding = self._embedding(self.act_taus)

    def _embedding(self, taus: np.ndarray) -> np.ndarray:
        """``relu(embed(cos(pi * i * tau)))``: shape ``taus.shape + (features,)``."""
        e = cosine_features(taus, self.cfg.embed_dim) @ self.embed[0]
        e += self.embed[1]
        return np.maximum(e, _ZERO, out=e)

    def _quantiles(self, features: np.ndarray, embedding: np.ndarray) -> np.ndarray:
        """Quantile values ``(n, T, A)`` from state features ``(n, d)`` and an embedding ``(n or 1, T, d)``."""
        n, t = len(features), embedding.shape[-2]
        x = features[:, None, :] * embedding
        x = relu_stack(x.reshape(n * t, -1), self.head) @ self.out[0]
        x += self.out[1]
        return x.reshape(n, t, self.num_actions)

    def quantile_values(self, obs: np.ndarray, taus: np.ndarray) -> np.ndarray:
        """The ``taus`` quantiles of every action's return: ``taus`` (n, T) or (T,) -> (n, T, A)."""
        taus = np.asarray(taus, dtype=np.float32)
        embedding = self._embedding(taus if taus.ndim == 2 else taus[None])
        return self._quantiles(relu_stack(as_rows(obs), self.torso), embedding)

    def q_values(self, obs: np.ndarray, taus: np.ndarray | None = None) -> np.ndarray:
        """Q: the mean of the quantiles at ``taus`` (default: the greedy midpoints), shape (n, A)."""
        if taus is None:
            q = self._quantiles(relu_stack(as_rows(obs), self.torso), self._greedy_embedding[None])
        else:
            q = self.quantile_values(obs, taus)
        return q.mean(axis=1)  # type: ignore[no-any-return]

    def greedy(self, obs: np.ndarray) -> np.ndarray:
        """Deterministic actions: argmax of Q over the ``K`` midpoint fractions."""
        return self.q_values(obs).argmax(axis=1)  # type: ignore[no-any-return]

    def act(self, obs: np.ndarray, explore: float | np.ndarray) -> np.ndarray:
        """Epsilon-greedy over Q averaged on ``K`` fresh uniform fractions per row; ``explore`` is epsilon."""
        taus = draw_taus(self.rng, len(obs), self.cfg.n_act_quantiles)
        return epsilon_greedy(self.q_values(obs, taus).argmax(axis=1), explore, self.rng, self.num_actions)

    def priorities(self, batch: Mapping[str, np.ndarray]) -> np.ndarray:
        """Initial priorities on the learner's scale (:func:`pairwise_priority`), with the local network
        standing in for the target and the ``K`` midpoints as both the predicted and the target fractions.

        ``obs`` and ``next_obs`` go through the network in one forward pass of ``2n`` rows.
        """
        obs, next_obs = np.asarray(batch["obs"]), np.asarray(batch["next_obs"])
        n = len(obs)
        features = relu_stack(as_rows(np.concatenate((obs.reshape(n, -1), next_obs.reshape(n, -1)))), self.torso)
        z = self._quantiles(features, self._greedy_embedding[None])  # (2n, K, A)
        pred = z[np.arange(n), :, np.asarray(batch["action"], dtype=np.intp)]  # (n, K)
        nxt = z[n:]
        best = nxt.mean(axis=1).argmax(axis=1)
        target = nxt[np.arange(n), :, best]
        target *= np.asarray(batch["discount"], dtype=np.float32)[:, None]
        target += np.asarray(batch["reward"], dtype=np.float32)[:, None]
        return pairwise_priority(target, pred, self.act_taus, self.cfg.kappa)
