"""IMPALA (Espeholt et al. 2018) and APPO (Sample Factory, RLlib): an actor-critic trained on segments.

:class:`ActorCriticPolicy` is what an actor runs in torch (the numpy one,
:class:`~zmqrl.agents.impala.numpy_policy.NumpyActorCriticPolicy`, is the usual choice for an MLP);
:class:`ImpalaAgent` adds the value network, the losses and the optimiser. One update takes a batch of
segments (:mod:`zmqrl.agents.impala.segments`), computes the policy's log-probabilities of the actions
taken and the values of every step, V-trace's targets and advantages from them
(:mod:`zmqrl.agents.impala.vtrace`), and one gradient step on

    pg_loss + vf_coef * 0.5 * (v_s - V(x_s))^2 - ent_coef * entropy,

each a mean over the batch's trained steps. The policy gradient is IMPALA's
``-min(rho_bar, rho_s) * A_s * log pi(a_s | x_s)`` or, with ``agent.clip_ratio`` > 0 (APPO), PPO's clipped
surrogate ``-min(r_s A_s, clip(r_s, 1 - eps, 1 + eps) A_s)`` with ``r_s = pi / mu``; ``A_s`` the V-trace
advantage, normalised over the batch where ``agent.normalize_advantages`` says so. Gradients are
clipped by their global norm; a step whose loss or gradients are not finite is not applied.
The learning rate and the entropy weight follow their schedules over ``trainer.max_opts`` steps.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from zmqrl.agents.dqn.networks import NATURE_CNN_FEATURES, nature_cnn_torso
from zmqrl.agents.impala.config import ImpalaConfig
from zmqrl.agents.impala.numpy_policy import HALF_LOG_2PI, OBS_EPS, policy_param_shapes
from zmqrl.agents.impala.segments import trained_steps
from zmqrl.agents.impala.vtrace import vtrace
from zmqrl.agents.r2d2.numpy_policy import NOT_FEED_FORWARD
from zmqrl.agents.torch_util import clip_gradients, load_module_params, module_params, nonfinite


def mlp(in_dim: int, hidden: list[int], activation: str) -> nn.Sequential:
    """Linear layers with ``activation`` after each (Linear at even indices, as the numpy policy reads them)."""
    layers: list[nn.Module] = []
    last = in_dim
    for size in hidden:
        layers += [nn.Linear(last, size), nn.Tanh() if activation == "tanh" else nn.ReLU()]
        last = size
    return nn.Sequential(*layers)


def make_torso(cfg: ImpalaConfig, obs_shape: tuple[int, ...]) -> tuple[nn.Sequential, int]:
    """The torso ``agent.network`` names and its number of features: an MLP over flattened observations, or
    the Nature CNN over (C, 84, 84) frames then ``agent.hidden`` (ReLU)."""
    if cfg.network == "nature_cnn":
        layers = [*nature_cnn_torso(obs_shape[0]), *mlp(NATURE_CNN_FEATURES, cfg.hidden, "relu")]
        return nn.Sequential(*layers), cfg.hidden[-1] if cfg.hidden else NATURE_CNN_FEATURES
    obs_dim = int(np.prod(obs_shape))
    return mlp(obs_dim, cfg.hidden, cfg.activation), cfg.hidden[-1] if cfg.hidden else obs_dim


def orthogonal_init(module: nn.Module, gain: float) -> None:
    """Orthogonal weights times ``gain`` and zero biases in every Linear and Conv2d layer of ``module``."""
    for layer in module.modules():
        if isinstance(layer, (nn.Linear, nn.Conv2d)):
            nn.init.orthogonal_(layer.weight, gain=gain)
            if layer.bias is not None:
                nn.init.zeros_(layer.bias)


class PolicyNet(nn.Module):
    """The policy: a torso and a categorical (``logits``) or Gaussian (``mean``, ``log_std``) head."""

    obs_mean: torch.Tensor  # (buffers, with agent.normalize_observations: the running statistics)
    obs_var: torch.Tensor

    def __init__(self, cfg: ImpalaConfig, obs_shape: tuple[int, ...], action_space: gym.spaces.Space) -> None:
        super().__init__()
        self.discrete = isinstance(action_space, gym.spaces.Discrete)
        self.normalizes = bool(cfg.normalize_observations)
        self.obs_clip = float(cfg.obs_clip)
        if self.normalizes:  # (first in the state_dict, as policy_param_shapes names them)
            obs_dim = int(np.prod(obs_shape))
            self.register_buffer("obs_mean", torch.zeros(obs_dim))
            self.register_buffer("obs_var", torch.ones(obs_dim))
        self.torso, last = make_torso(cfg, obs_shape)
        if cfg.network == "nature_cnn":  # the initialisation of Baselines' and SB3's CNN policies
            orthogonal_init(self.torso, float(np.sqrt(2.0)))
        self.lstm: nn.LSTM | None = None
        if cfg.lstm_size:  # (its parameters come from the numpy draw the agent adopts: torch's, forget bias + 1)
            self.lstm = nn.LSTM(last, cfg.lstm_size, batch_first=True)
            last = cfg.lstm_size
        if isinstance(action_space, gym.spaces.Discrete):
            self.logits = nn.Linear(last, int(action_space.n))
        else:
            act_dim = int(np.prod(action_space.shape or ()))
            self.mean = nn.Linear(last, act_dim)
            self.log_std = nn.Parameter(torch.full((act_dim,), float(cfg.log_std_init)))
        if cfg.network == "nature_cnn":
            head = self.logits if self.discrete else self.mean
            nn.init.orthogonal_(head.weight, gain=0.01)
            nn.init.zeros_(head.bias)
        self.log_std_min = cfg.log_std_min

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.head_of(self.torso(obs))

    def normalize(self, rows: torch.Tensor) -> torch.Tensor:
        """Float observation rows to the running mean 0 and std 1, clipped to ``agent.obs_clip`` (the numpy
        policy's arithmetic)."""
        scale = torch.rsqrt(self.obs_var.clamp(min=0.0) + OBS_EPS)
        return ((rows - self.obs_mean) * scale).clamp(-self.obs_clip, self.obs_clip)

    def unroll(self, obs: torch.Tensor, state_h: torch.Tensor, state_c: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The LSTM's outputs ``(n, T, H)`` over observations ``(n, T, D)`` from the states ``(n, H)``, and the
        states after them."""
        assert self.lstm is not None
        n, steps = obs.shape[:2]
        features = self.torso(obs.reshape(n * steps, -1)).view(n, steps, -1)
        out, (h, c) = self.lstm(features, (state_h.unsqueeze(0).contiguous(), state_c.unsqueeze(0).contiguous()))
        return out, h[0], c[0]

    def head_of(self, features: torch.Tensor) -> torch.Tensor:
        """The head's output (logits, or the Gaussian's mean) from the torso's features."""
        return self.logits(features) if self.discrete else self.mean(features)  # type: ignore[no-any-return]

    def clamped_log_std(self) -> torch.Tensor:
        return self.log_std.clamp(min=self.log_std_min)


class ValueNet(nn.Module):
    """The learner's state-value estimate: a torso and one output, orthogonally initialised (gain 1 at the
    output). With ``shared_features`` it has no torso of its own and reads the policy's features, that many
    (the Nature CNN's: IMPALA's and PPO's Atari networks share it; an LSTM's outputs, which hold the
    memory); an MLP has its own (SB3's MlpPolicy for PPO)."""

    def __init__(self, cfg: ImpalaConfig, obs_shape: tuple[int, ...], shared_features: int | None = None) -> None:
        super().__init__()
        self.torso: nn.Sequential | None = None
        if shared_features is None:
            self.torso, last = make_torso(cfg, obs_shape)
            orthogonal_init(self.torso, float(np.sqrt(2.0)))
        else:
            last = shared_features
        self.out = nn.Linear(last, 1)
        nn.init.orthogonal_(self.out.weight, gain=1.0)
        nn.init.zeros_(self.out.bias)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        assert self.torso is not None, "a value head on the policy's features: call out() on them"
        return self.out(self.torso(obs)).squeeze(-1)  # type: ignore[no-any-return]


class ActorCriticPolicy:
    """The policy network on a torch device, acting for actors, the evaluator and ``zmqrl train``."""

    def __init__(self, cfg: ImpalaConfig, obs_space: gym.spaces.Space, action_space: gym.spaces.Space,
                 device: torch.device | str = "cpu", seed: int = 0) -> None:
        self.cfg = cfg
        self.device = torch.device(device)
        self.obs_shape = tuple(int(d) for d in (obs_space.shape or ()))
        self.obs_dim = int(np.prod(self.obs_shape))
        self.pixels = cfg.network == "nature_cnn"
        self.discrete = isinstance(action_space, gym.spaces.Discrete)
        if not self.discrete:
            assert isinstance(action_space, gym.spaces.Box)
            self.low = torch.as_tensor(np.asarray(action_space.low, np.float32).reshape(-1), device=self.device)
            self.high = torch.as_tensor(np.asarray(action_space.high, np.float32).reshape(-1), device=self.device)
            self.action_dtype = np.dtype(action_space.dtype or np.float32)
        self.shapes = policy_param_shapes(cfg, self.obs_dim, action_space)
        torch.manual_seed(seed)
        self.policy = PolicyNet(cfg, self.obs_shape, action_space).to(self.device)
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(seed)
        self._logp = np.zeros(0, dtype=np.float32)

    def _rows(self, obs: np.ndarray | torch.Tensor) -> torch.Tensor:
        """Observations as the torso takes them: float rows for the MLP, (N, C, H, W) frames scaled to [0, 1]."""
        x = torch.as_tensor(np.asarray(obs) if not isinstance(obs, torch.Tensor) else obs, device=self.device)
        if self.pixels:
            return x.float() / 255.0
        rows = x.reshape(len(x), -1).float()
        return self.policy.normalize(rows) if self.policy.normalizes else rows

    def log_probs(self, head: torch.Tensor, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """log pi(action) and the entropy, per row, from the policy head's output."""
        if self.discrete:
            logp_all = torch.log_softmax(head, dim=-1)
            logp = logp_all.gather(-1, action.long().unsqueeze(-1)).squeeze(-1)
            entropy = -(logp_all.exp() * logp_all).sum(-1)
            return logp, entropy
        log_std = self.policy.clamped_log_std()
        z = (action - head) / log_std.exp()
        logp = (-0.5 * z * z - log_std - HALF_LOG_2PI).sum(-1)
        entropy = (log_std + 0.5 + HALF_LOG_2PI).sum().expand(logp.shape)
        return logp, entropy

    @torch.no_grad()
    def act(self, obs: np.ndarray, explore: float | np.ndarray) -> np.ndarray:
        """Actions drawn from the policy (``explore`` is not used); their log-probabilities kept."""
        return self._sample(self.policy(self._rows(obs)))

    @torch.no_grad()
    def _sample(self, head: torch.Tensor) -> np.ndarray:
        if self.discrete:
            u = torch.rand(head.shape, generator=self.generator, device=self.device).clamp_min(1e-12)
            action = (torch.log_softmax(head, -1) - torch.log(-torch.log(u))).argmax(-1)
        else:
            noise = torch.randn(head.shape, generator=self.generator, device=self.device)
            action = head + self.policy.clamped_log_std().exp() * noise  # the sample: the loop clips it for the env
        logp, _ = self.log_probs(head, action)
        self._logp = logp.float().cpu().numpy()
        if self.discrete:
            return action.cpu().numpy().astype(np.int64)  # type: ignore[no-any-return]
        return action.cpu().numpy().astype(self.action_dtype)  # type: ignore[no-any-return]

    @torch.no_grad()
    def greedy(self, obs: np.ndarray) -> np.ndarray:
        return self._mode(self.policy(self._rows(obs)))

    @torch.no_grad()
    def _mode(self, head: torch.Tensor) -> np.ndarray:
        if self.discrete:
            return head.argmax(-1).cpu().numpy().astype(np.int64)  # type: ignore[no-any-return]
        action = torch.minimum(torch.maximum(head, self.low), self.high)
        return action.cpu().numpy().astype(self.action_dtype)  # type: ignore[no-any-return]

    def acted_log_probs(self) -> np.ndarray:
        return self._logp

    def params(self) -> dict[str, np.ndarray]:
        return module_params(self.policy)

    def load_params(self, params: Mapping[str, np.ndarray]) -> None:
        load_module_params(self.policy, params)

    def priorities(self, batch: Mapping[str, np.ndarray]) -> None:
        return None


class ImpalaAgent(ActorCriticPolicy):
    """The learner's actor-critic (module docstring)."""

    METRICS = ("loss", "pg_loss", "value_loss", "entropy", "value_mean", "advantage_mean", "rho_mean",
               "clip_fraction", "grad_norm", "lr", "ent_coef", "skipped")

    def __init__(self, cfg: ImpalaConfig, obs_space: gym.spaces.Space, action_space: gym.spaces.Space,
                 device: torch.device | str = "cpu", seed: int = 0, max_opts: int = 0) -> None:
        super().__init__(cfg, obs_space, action_space, device, seed)
        self.recurrent = bool(cfg.lstm_size)
        shared = None  # the value head's own torso (an MLP), or the policy's features it reads, that many
        if self.recurrent:
            shared = cfg.lstm_size
        elif self.pixels:
            shared = cfg.hidden[-1] if cfg.hidden else NATURE_CNN_FEATURES
        self.value = ValueNet(cfg, self.obs_shape, shared).to(self.device)
        self.max_opts = max_opts
        params = list({id(p): p for p in [*self.policy.parameters(), *self.value.parameters()]}.values())
        self.optimizer: torch.optim.Optimizer
        if cfg.optimizer == "adam":
            self.optimizer = torch.optim.Adam(params, lr=cfg.lr, eps=cfg.adam_eps)
        else:
            self.optimizer = torch.optim.RMSprop(params, lr=cfg.lr, alpha=cfg.rmsprop_alpha, eps=cfg.rmsprop_eps)
        self.opt_steps = 0
        self.rng = np.random.default_rng(seed)  # minibatches' shuffles
        self._both = _Both(self.policy, self.value)
        self.obs_stats = RunningMoments(self.obs_dim) if cfg.normalize_observations else None
        self._stats_indices: np.ndarray | None = None  # the batch the statistics last took in

    def _progress(self) -> float:
        """The share of ``trainer.max_opts`` done, for the schedules."""
        return min(1.0, self.opt_steps / self.max_opts) if self.max_opts > 0 else 0.0

    def lr_now(self) -> float:
        cfg = self.cfg
        return cfg.lr * (1.0 - self._progress()) if cfg.lr_schedule == "linear" else cfg.lr

    def ent_coef_now(self) -> float:
        cfg = self.cfg
        if cfg.ent_coef_end is None:
            return cfg.ent_coef
        return cfg.ent_coef + (cfg.ent_coef_end - cfg.ent_coef) * self._progress()

    def update(self, batch: Mapping[str, np.ndarray]) -> tuple[dict[str, float], None]:
        """One optimisation step on a batch of segments, a pass of ``agent.minibatches`` gradient steps over
        it (its segments shuffled and split, as PPO's minibatches); returns the metrics (their means over the
        gradient steps; no priorities). The schedules move once per optimisation step."""
        if self.obs_stats is not None:
            self._observe_obs(batch)
        parts = min(self.cfg.minibatches, len(batch["mask"]))
        if parts <= 1:
            metrics = self._gradient_step(batch)
        else:
            order = self.rng.permutation(len(batch["mask"]))
            fields = [k for k in batch if k not in ("indices", "weights")]
            steps = [self._gradient_step({k: np.asarray(batch[k])[rows] for k in fields})
                     for rows in np.array_split(order, parts)]
            metrics = {key: float(np.mean([m[key] for m in steps])) for key in self.METRICS}
            metrics["skipped"] = float(max(m["skipped"] for m in steps))
        self.opt_steps += 1
        return metrics, None

    def _observe_obs(self, batch: Mapping[str, np.ndarray]) -> None:
        """Take a new batch's observations into the running moments once (a batch comes ``agent.epochs``
        times, the same ``indices`` each pass) and set the policy's normalisation from them: every real step
        but each segment's last (the next segment's first)."""
        assert self.obs_stats is not None
        indices = np.asarray(batch["indices"]) if "indices" in batch else None
        if indices is not None and self._stats_indices is not None and np.array_equal(indices, self._stats_indices):
            return
        self._stats_indices = indices
        obs = np.asarray(batch["obs"])
        real = np.asarray(batch["mask"])[:, :-1] > 0
        self.obs_stats.add(obs[:, :-1][real].reshape(-1, self.obs_dim))
        with torch.no_grad():
            self.policy.obs_mean.copy_(torch.as_tensor(self.obs_stats.mean, dtype=torch.float32))
            self.policy.obs_var.copy_(torch.as_tensor(self.obs_stats.var, dtype=torch.float32))

    def _gradient_step(self, batch: Mapping[str, np.ndarray]) -> dict[str, float]:
        """One gradient step on segments (module docstring)."""
        cfg, dev = self.cfg, self.device
        obs = torch.as_tensor(np.asarray(batch["obs"]), device=dev)
        n, steps = obs.shape[:2]
        length = steps - 1
        action = torch.as_tensor(np.asarray(batch["action"])[:, :length], device=dev)
        reward = torch.as_tensor(np.asarray(batch["reward"], np.float32)[:, :length], device=dev)
        discount = torch.as_tensor(np.asarray(batch["discount"], np.float32)[:, :length], device=dev)
        behaviour = torch.as_tensor(np.asarray(batch["logp"], np.float32)[:, :length], device=dev)
        trained = torch.as_tensor(trained_steps(batch["mask"], batch["discount"]), device=dev)
        count = trained.sum().clamp(min=1.0)

        flat = self._rows(obs.reshape(n * steps, *obs.shape[2:]))
        if self.recurrent:  # the LSTM from each segment's stored state; values and policy read its outputs
            state_h = torch.as_tensor(np.asarray(batch["state_h"], np.float32), device=dev)
            state_c = torch.as_tensor(np.asarray(batch["state_c"], np.float32), device=dev)
            out, _, _ = self.policy.unroll(flat.view(n, steps, -1), state_h, state_c)
            values = self.value.out(out).view(n, steps)
            head = self.policy.head_of(out[:, :length].reshape(n * length, -1))
        elif self.pixels:  # one pass of the shared torso for the values and the policy
            features = self.policy.torso(flat)
            values = self.value.out(features).view(n, steps)
            head = self.policy.head_of(features.view(n, steps, -1)[:, :length].reshape(n * length, -1))
        else:
            values = self.value(flat).view(n, steps)
            head = self.policy(flat.view(n, steps, -1)[:, :length].reshape(n * length, -1))
        if self.discrete:
            head_action = action.reshape(n * length)
        else:
            head_action = action.reshape(n * length, -1).float()
        logp, entropy = self.log_probs(head, head_action)
        logp, entropy = logp.view(n, length), entropy.reshape(n, length)
        log_rho = (logp.detach() - behaviour).clamp(-20.0, 20.0)
        vt = vtrace(log_rho, reward, discount, values.detach(), trained, cfg.rho_bar, cfg.c_bar, cfg.trace_lambda)
        advantages = vt.advantages
        if cfg.normalize_advantages:
            mean = (advantages * trained).sum() / count
            var = (((advantages - mean) * trained) ** 2).sum() / count
            advantages = (advantages - mean) / (var.sqrt() + 1e-8) * trained
        if cfg.clip_ratio > 0:  # APPO: PPO's clipped surrogate over the behaviour policy
            ratio = torch.exp((logp - behaviour).clamp(-20.0, 20.0))
            clipped = ratio.clamp(1.0 - cfg.clip_ratio, 1.0 + cfg.clip_ratio)
            surrogate = torch.minimum(ratio * advantages, clipped * advantages)
            pg_loss = -(surrogate * trained).sum() / count
            clip_fraction = (((ratio - 1.0).abs() > cfg.clip_ratio).float() * trained).sum() / count
        else:  # IMPALA: the importance-weighted policy gradient
            pg_loss = -(vt.clipped_rho * advantages * logp * trained).sum() / count
            clip_fraction = ((vt.clipped_rho < log_rho.exp()).float() * trained).sum() / count
        value_loss = 0.5 * (((vt.vs - values[:, :length]) ** 2) * trained).sum() / count
        mean_entropy = (entropy * trained).sum() / count
        ent_coef, lr = self.ent_coef_now(), self.lr_now()
        loss = pg_loss + cfg.vf_coef * value_loss - ent_coef * mean_entropy

        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = clip_gradients(self._both, cfg.max_grad_norm)
        skipped = nonfinite(loss, grad_norm)
        if not bool(skipped):
            self.optimizer.step()
        stats = torch.stack([loss.detach(), pg_loss.detach(), value_loss.detach(), mean_entropy.detach(),
                             (values[:, :length].detach() * trained).sum() / count,
                             (vt.advantages * trained).sum() / count,
                             (log_rho.exp() * trained).sum() / count, clip_fraction, grad_norm.detach().to(dev),
                             skipped.to(dev)]).float().cpu().tolist()
        metrics = dict(zip(self.METRICS[:-3], stats[:-1], strict=True))
        return {**metrics, "lr": lr, "ent_coef": ent_coef, "skipped": stats[-1]}

    def adopt_initial(self, params: Mapping[str, np.ndarray]) -> None:
        """Start from version-0 policy parameters (the value network has no published counterpart)."""
        self.load_params(params)

    def state_dict(self) -> dict[str, Any]:
        # (not "policy": every checkpoint keeps the published parameters under that key, checkpoint.POLICY_KEY)
        state = {"policy_net": self.policy.state_dict(), "value_net": self.value.state_dict(),
                 "optimizer": self.optimizer.state_dict(), "opt_steps": self.opt_steps,
                 "generator": self.generator.get_state(), "rng": self.rng.bit_generator.state}
        if self.obs_stats is not None:
            batch = None if self._stats_indices is None else self._stats_indices.tolist()
            state["obs_stats"] = {**self.obs_stats.state_dict(), "batch": batch}
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if (self.obs_stats is not None) != ("obs_stats" in state):
            raise ValueError(f"agent.normalize_observations is {self.obs_stats is not None} here but the state was "
                             "saved with it the other way: resume with the setting it was made with")
        self.policy.load_state_dict(state["policy_net"])
        self.value.load_state_dict(state["value_net"])
        self.optimizer.load_state_dict(copy.deepcopy(state["optimizer"]))
        self.opt_steps = int(state["opt_steps"])
        self.generator.set_state(state["generator"].cpu())
        if "rng" in state:
            self.rng.bit_generator.state = state["rng"]
        if self.obs_stats is not None:  # (and the batch they last took in: a resumed pass over it adds nothing)
            self.obs_stats.load_state_dict(state["obs_stats"])
            batch = state["obs_stats"].get("batch")
            self._stats_indices = None if batch is None else np.asarray(batch, np.int64)


FLOAT32_MAX = float(np.finfo(np.float32).max)


class RunningMoments:
    """The running mean and variance of observation rows (Chan et al.'s parallel update, float64), starting
    from mean 0, variance 1 and a count of 1e-4 as SB3's ``RunningMeanStd``."""

    def __init__(self, dim: int) -> None:
        self.mean, self.var, self.count = np.zeros(dim), np.ones(dim), 1e-4

    def add(self, rows: np.ndarray) -> bool:
        """Take ``rows`` in; False, and nothing taken, where the moments would leave float32's range (the
        policy holds them in float32: finite observations of absurd size, which the intake's checks of form
        let through, would otherwise publish an infinite variance for good)."""
        if not len(rows):
            return True
        rows = np.asarray(rows, np.float64)
        n, mean, var = len(rows), rows.mean(axis=0), rows.var(axis=0)
        total = self.count + n
        delta = mean - self.mean
        new_mean = self.mean + delta * n / total
        new_var = (self.var * self.count + var * n + delta * delta * self.count * n / total) / total
        if not (np.abs(new_mean).max() < FLOAT32_MAX and new_var.max() < FLOAT32_MAX):
            return False
        self.mean, self.var, self.count = new_mean, new_var, total
        return True

    def state_dict(self) -> dict[str, Any]:
        # (tensors, not arrays: checkpoints load with torch's weights-only unpickler)
        return {"mean": torch.from_numpy(self.mean.copy()), "var": torch.from_numpy(self.var.copy()),
                "count": self.count}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        mean, var = (np.array(torch.as_tensor(state[key]).cpu().numpy(), np.float64) for key in ("mean", "var"))
        count = float(state["count"])
        if mean.shape != self.mean.shape or var.shape != self.mean.shape:
            raise ValueError(f"observation statistics of shapes {mean.shape} and {var.shape}; this agent's "
                             f"observations have {self.mean.shape}")
        if not (np.isfinite(mean).all() and np.isfinite(var).all() and (var >= 0).all() and count > 0):
            raise ValueError("observation statistics that are not finite, or a negative variance or count")
        self.mean, self.var, self.count = mean, var, count


class _Both(nn.Module):
    """The policy and the value network as one module, for one global gradient norm."""

    def __init__(self, policy: nn.Module, value: nn.Module) -> None:
        super().__init__()
        self.policy, self.value = policy, value


class RecurrentActing:
    """Acting with a state per env (:class:`~zmqrl.core.RecurrentPolicy`) over a policy with an LSTM, for the
    torch policy and the agent (``zmqrl train`` acts with it); the feed-forward calls refuse."""

    cfg: ImpalaConfig
    device: torch.device
    policy: PolicyNet
    _rows: Any
    _sample: Any
    _mode: Any

    def initial_state(self, n: int) -> np.ndarray:
        return np.zeros((n, 2, self.cfg.lstm_size), dtype=np.float32)

    @torch.no_grad()
    def _lstm_step(self, obs: np.ndarray, state: np.ndarray) -> tuple[torch.Tensor, np.ndarray]:
        st = torch.as_tensor(np.asarray(state, np.float32), device=self.device)
        out, h, c = self.policy.unroll(self._rows(obs).unsqueeze(1), st[:, 0], st[:, 1])
        return self.policy.head_of(out[:, 0]), torch.stack((h, c), dim=1).cpu().numpy()

    def act_recurrent(self, obs: np.ndarray, explore: float | np.ndarray,
                      state: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        head, after = self._lstm_step(obs, state)
        return self._sample(head), after

    def greedy_recurrent(self, obs: np.ndarray, state: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        head, after = self._lstm_step(obs, state)
        return self._mode(head), after

    def act(self, obs: np.ndarray, explore: Any) -> np.ndarray:
        raise TypeError(NOT_FEED_FORWARD.replace("R2D2's", "This"))

    def greedy(self, obs: np.ndarray) -> np.ndarray:
        raise TypeError(NOT_FEED_FORWARD.replace("R2D2's", "This"))


class RecurrentActorCriticPolicy(RecurrentActing, ActorCriticPolicy):
    """The torch policy with an LSTM (actors with ``actor.backend: torch``, the evaluator)."""


class RecurrentImpalaAgent(RecurrentActing, ImpalaAgent):
    """The learner's actor-critic with an LSTM: it trains from each segment's stored state."""
