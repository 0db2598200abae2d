"""Per-env n-step transition assembly for vectorised environments, on the acting side."""

from __future__ import annotations

import numpy as np

Batch = dict[str, np.ndarray]

# The fields a push that brings ``values`` adds to each transition, beside obs, action, reward,
# next_obs and discount (see NStepBuilder.push):
FIRST_VALUES = "first_values"  # the values given with the transition's first step (leading dim: transitions)
ENV_ID = "env_id"  # the index of the env the transition comes from (int64)


class NStepBuilder:
    """Turns vector-env steps into n-step transitions that never cross episodes.

    Each env keeps its last up-to-``n`` (obs, action, reward) in ring arrays of
    shape ``(n, num_envs, ...)``. A transition carries ``reward`` (discounted
    sum over its ``k <= n`` steps), ``next_obs`` (``k`` steps later, or the final
    observation) and ``discount`` (``gamma ** k``, or 0 if the episode terminated).

    Optionally each step also brings per-env ``values`` (what a policy computed when acting on
    ``obs``); they ride along in a ring of the same shape and come out with the transition whose
    first step they belong to, so initial priorities can reuse the acting forward pass.
    """

    # The values ring, made by the first push that brings values. A class default rather than an
    # instance attribute, so builders that never carry values save the same state as before.
    _values: np.ndarray | None = None
    # Steps taken per env, made by the first push that names its envs (``env_ids``): such pushes
    # bring a subset of the envs, so each env has its own ring position. A class default, like
    # ``_values``, so builders stepped whole save the same state as before.
    _env_t: np.ndarray | None = None

    def __init__(self, num_envs: int, n: int, gamma: float) -> None:
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        if not 0.0 <= gamma <= 1.0:
            raise ValueError(f"gamma must lie in [0, 1], got {gamma}")
        self.num_envs = int(num_envs)
        self.n = int(n)
        self.gamma = float(gamma)
        powers = self.gamma ** np.arange(self.n, dtype=np.float64)
        self._powers = powers
        # _returns[j, i] = gamma ** (i - j) for i >= j: row j sums rewards from step j on.
        offsets = np.arange(self.n)[None, :] - np.arange(self.n)[:, None]
        self._returns = np.where(offsets >= 0, self.gamma ** np.maximum(offsets, 0), 0.0)
        self._obs: np.ndarray | None = None
        self._action: np.ndarray | None = None
        self._reward = np.zeros((self.n, self.num_envs), dtype=np.float64)
        self._count = np.zeros(self.num_envs, dtype=np.int64)  # pending steps per env
        self._t = 0  # global step counter; this step's ring slot is _t % n

    def reset(self) -> None:
        """Drop all pending steps of every env."""
        self._count[:] = 0

    @property
    def pending(self) -> np.ndarray:
        """Number of pending (not yet emitted) steps per env."""
        return self._count.copy()

    def push(
        self,
        obs: np.ndarray,
        action: np.ndarray,
        reward: np.ndarray,
        next_obs: np.ndarray,
        terminated: np.ndarray,
        truncated: np.ndarray,
        values: np.ndarray | None = None,
        valid: np.ndarray | None = None,
        env_ids: np.ndarray | None = None,
    ) -> Batch | None:
        """Record one vector-env step; return the transitions it completes, or None.

        ``values`` (leading dim ``num_envs``): given on every push or on none. With them, each
        transition also carries :data:`FIRST_VALUES` (the values of its first step) and
        :data:`ENV_ID` (its env's index).

        ``valid`` (bool per env, default all): envs whose row is no step of theirs (an env that
        was resetting, its episode having ended the push before); their rows are ignored. Such an
        env has no pending steps, so the ring slots it skips are never read.

        ``env_ids`` (distinct env indices, one per row): the push brings those envs' steps only
        (an asynchronous pool steps whichever envs are ready); every other argument then has one
        row per entry. Given on every push or on none.
        """
        if env_ids is not None:
            return self._push_rows(np.asarray(env_ids, dtype=np.int64), np.asarray(obs), np.asarray(action),
                                   reward, np.asarray(next_obs), terminated, truncated, values, valid)
        if self._env_t is not None:
            raise ValueError("env_ids: this builder got env_ids before; give them on every push")
        obs, action, next_obs = np.asarray(obs), np.asarray(action), np.asarray(next_obs)
        reward = self._per_env("reward", reward).astype(np.float64)
        term = self._per_env("terminated", terminated).astype(bool)
        trunc = self._per_env("truncated", truncated).astype(bool)
        self._check_step(obs, action, next_obs)
        self._check_values(values)
        assert self._obs is not None and self._action is not None

        slot = self._t % self.n
        self._obs[slot] = obs
        self._action[slot] = action
        self._reward[slot] = reward
        if self._values is not None:
            self._values[slot] = values
        self._t += 1
        if valid is None:
            self._count = np.minimum(self._count + 1, self.n)
        else:
            valid = self._per_env("valid", valid).astype(bool)
            if np.any(self._count[~valid]):
                raise ValueError("valid: an env with pending steps skipped a step")
            self._count = np.minimum(self._count + valid, self.n)
            term, trunc = term & valid, trunc & valid

        ended = term | trunc
        parts = []
        full = np.flatnonzero((self._count == self.n) & ~ended)  # skipped envs have none pending
        if full.size:
            parts.append(self._emit_full(slot, full, next_obs[full]))
        for env in np.flatnonzero(ended):
            parts.append(self._flush(slot, int(env), next_obs[env], bool(term[env])))
            self._count[env] = 0
        if not parts:
            return None
        return {key: np.concatenate([p[key] for p in parts]) for key in parts[0]}

    def _push_rows(self, ids: np.ndarray, obs: np.ndarray, action: np.ndarray, reward: np.ndarray,
                   next_obs: np.ndarray, terminated: np.ndarray, truncated: np.ndarray,
                   values: np.ndarray | None, valid: np.ndarray | None) -> Batch | None:
        """:meth:`push` for the envs ``ids`` only, each at its own ring position."""
        m = ids.size
        if ids.ndim != 1 or m == 0 or np.unique(ids).size != m or ids.min() < 0 or ids.max() >= self.num_envs:
            raise ValueError(f"env_ids: expected distinct env indices in [0, {self.num_envs}), got {ids}")
        rows = {}
        for name, x in (("reward", reward), ("terminated", terminated), ("truncated", truncated),
                        ("valid", np.ones(m, dtype=bool) if valid is None else valid)):
            rows[name] = np.asarray(x)
            if rows[name].shape != (m,):
                raise ValueError(f"{name}: expected shape ({m},), got {rows[name].shape}")
        for name, arr in (("obs", obs), ("action", action), ("next_obs", next_obs)):
            if arr.ndim == 0 or arr.shape[0] != m:
                raise ValueError(f"{name}: expected leading dim {m}, got shape {arr.shape}")
        if self._env_t is None:
            if self._t:
                raise ValueError("env_ids: this builder had pushes without them; give them on every push")
            self._env_t = np.zeros(self.num_envs, dtype=np.int64)
            self._obs = np.zeros((self.n, self.num_envs, *obs.shape[1:]), dtype=obs.dtype)
            self._action = np.zeros((self.n, self.num_envs, *action.shape[1:]), dtype=action.dtype)
            if values is not None:
                values = np.asarray(values)
                self._values = np.zeros((self.n, self.num_envs, *values.shape[1:]), dtype=values.dtype)
        assert self._obs is not None and self._action is not None
        if obs.shape[1:] != self._obs.shape[2:] or next_obs.shape != obs.shape or obs.dtype != self._obs.dtype:
            raise ValueError(f"obs: expected rows of shape {self._obs.shape[2:]} dtype {self._obs.dtype}, "
                             f"got {obs.shape[1:]} {obs.dtype} (next_obs {next_obs.shape[1:]})")
        if (values is None) != (self._values is None):
            raise ValueError("values: give them on every push or on none")
        if values is not None and self._values is not None and np.shape(values)[1:] != self._values.shape[2:]:
            raise ValueError(f"values: expected rows of shape {self._values.shape[2:]}, got {np.shape(values)[1:]}")
        valid_rows = rows["valid"].astype(bool)
        if np.any(self._count[ids[~valid_rows]]):
            raise ValueError("valid: an env with pending steps skipped a step")

        slots = self._env_t[ids] % self.n
        self._obs[slots, ids] = obs
        self._action[slots, ids] = action
        self._reward[slots, ids] = rows["reward"].astype(np.float64)
        if self._values is not None:
            self._values[slots, ids] = values
        self._env_t[ids] += 1
        self._t += 1
        self._count[ids] = np.minimum(self._count[ids] + valid_rows, self.n)
        term = rows["terminated"].astype(bool) & valid_rows
        ended = term | (rows["truncated"].astype(bool) & valid_rows)

        parts = []
        full = np.flatnonzero((self._count[ids] == self.n) & ~ended)
        if full.size:
            parts.append(self._emit_full(slots[full], ids[full], next_obs[full]))
        for row in np.flatnonzero(ended):
            parts.append(self._flush(int(slots[row]), int(ids[row]), next_obs[row], bool(term[row])))
            self._count[ids[row]] = 0
        if not parts:
            return None
        return {key: np.concatenate([p[key] for p in parts]) for key in parts[0]}

    def _emit_full(self, slots: np.ndarray | int, envs: np.ndarray, next_obs: np.ndarray) -> Batch:
        """Transitions from the oldest of ``n`` pending steps of each env in ``envs``, whose newest
        step is in ring slot ``slots`` (one per env, or one for all); ``next_obs``: one row per env."""
        assert self._obs is not None and self._action is not None
        oldest = (np.asarray(slots) + 1) % self.n
        order = (np.broadcast_to(oldest, envs.shape)[:, None] + np.arange(self.n)) % self.n  # (envs, n), oldest first
        batch = {
            "obs": self._obs[oldest, envs],
            "action": self._action[oldest, envs],
            "reward": (self._reward[order, envs[:, None]] @ self._powers).astype(np.float32),
            "next_obs": next_obs,
            "discount": np.full(envs.size, self.gamma**self.n, dtype=np.float32),
        }
        if self._values is not None:
            batch[FIRST_VALUES] = self._values[oldest, envs]
            batch[ENV_ID] = envs
        return batch

    def _flush(self, slot: int, env: int, final_obs: np.ndarray, terminated: bool) -> Batch:
        """All pending transitions of an env whose episode ended at ``slot``."""
        assert self._obs is not None and self._action is not None
        c = int(self._count[env])
        order = (slot - c + 1 + np.arange(c)) % self.n  # oldest first
        ret = self._returns[:c, :c] @ self._reward[order, env]
        steps_left = c - np.arange(c)
        discount = np.zeros(c) if terminated else self.gamma**steps_left
        batch = {
            "obs": self._obs[order, env],
            "action": self._action[order, env],
            "reward": ret.astype(np.float32),
            "next_obs": np.repeat(final_obs[None], c, axis=0),
            "discount": discount.astype(np.float32),
        }
        if self._values is not None:
            batch[FIRST_VALUES] = self._values[order, env]
            batch[ENV_ID] = np.full(c, env, dtype=np.int64)
        return batch

    def _per_env(self, name: str, x: np.ndarray) -> np.ndarray:
        arr = np.asarray(x)
        if arr.shape != (self.num_envs,):
            raise ValueError(f"{name}: expected shape ({self.num_envs},), got {arr.shape}")
        return arr

    def _check_values(self, values: np.ndarray | None) -> None:
        """Values on every push or on none; allocate their ring on the first push (of the first ones)."""
        if values is None:
            if self._values is not None:
                raise ValueError("values: this builder got values before; give them on every push")
            return
        if self._values is None:
            if self._t:
                raise ValueError("values: this builder had steps without values; give them on every push")
            self._values = np.zeros((self.n, *np.shape(values)), dtype=np.asarray(values).dtype)
        if np.shape(values) != self._values.shape[1:]:
            raise ValueError(f"values: expected shape {self._values.shape[1:]}, got {np.shape(values)}")

    def _check_step(self, obs: np.ndarray, action: np.ndarray, next_obs: np.ndarray) -> None:
        """Validate shapes/dtypes; allocate the rings on the first call."""
        for name, arr in (("obs", obs), ("action", action), ("next_obs", next_obs)):
            if arr.ndim == 0 or arr.shape[0] != self.num_envs:
                raise ValueError(f"{name}: expected leading dim {self.num_envs}, got shape {arr.shape}")
        if self._obs is None or self._action is None:
            self._obs = np.zeros((self.n, *obs.shape), dtype=obs.dtype)
            self._action = np.zeros((self.n, *action.shape), dtype=action.dtype)
        for name, arr, ring in (
            ("obs", obs, self._obs),
            ("next_obs", next_obs, self._obs),
            ("action", action, self._action),
        ):
            if arr.shape != ring.shape[1:] or arr.dtype != ring.dtype:
                raise ValueError(
                    f"{name}: expected shape {ring.shape[1:]} dtype {ring.dtype}, "
                    f"got shape {arr.shape} dtype {arr.dtype}"
                )
