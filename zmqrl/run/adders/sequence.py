"""Per-env assembly of sequence items for recurrent agents (R2D2) from vectorised environments (numpy only).

The item format is defined in :mod:`zmqrl.agents.r2d2`: ``T = burn_in + sequence_length + 1``
consecutive steps of one episode with ``obs``, ``action``, ``reward``, ``discount``, ``mask`` and
the recurrent state the actor held before the item's first step (``state_h``, ``state_c``). An
episode's items have their first trained step at the episode's steps ``0, P, 2P, ...`` with
``P = sequence_length - overlap``; item ``k`` holds steps ``kP - burn_in .. kP + sequence_length``,
padding where those do not exist (before the episode's first step, after its last).

The same adder makes an on-policy algorithm's *segments* (no burn-in, no overlap, no recurrent state
where the policy has none): ``sequence_length`` steps and the step after them, whose observation
bootstraps the last; each step may bring further per-step fields (``extras``: the behaviour
log-probability), gathered and padded like ``action``.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

Batch = dict[str, np.ndarray]


class SequenceAdder:
    """Turns vector-env steps into sequence items that never cross episodes.

    Each env keeps its episode's last ``T`` steps in ring arrays of shape ``(T, num_envs, ...)``
    (enough for every item still open: an item is sent as soon as its last step is in, or when
    its episode ends). :meth:`push` takes one vector step and returns the items it completes, one
    dict of arrays with leading dim = items, or None.
    """

    def __init__(self, num_envs: int, burn_in: int, sequence_length: int, overlap: int, gamma: float) -> None:
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        if sequence_length < 1 or burn_in < 0 or not 0 <= overlap < sequence_length:
            raise ValueError(f"need sequence_length >= 1, burn_in >= 0 and 0 <= overlap < sequence_length; got "
                             f"sequence_length {sequence_length}, burn_in {burn_in}, overlap {overlap}")
        if not 0.0 <= gamma <= 1.0:
            raise ValueError(f"gamma must lie in [0, 1], got {gamma}")
        self.num_envs = int(num_envs)
        self.burn_in = int(burn_in)
        self.length = int(sequence_length)
        self.period = self.length - int(overlap)
        self.steps = self.burn_in + self.length + 1  # T
        self.gamma = np.float32(gamma)
        self._t = np.zeros(self.num_envs, dtype=np.int64)  # steps of each env's current episode so far
        self._obs: np.ndarray | None = None  # rings (T, num_envs, ...), made by the first push
        self._action: np.ndarray | None = None
        self._state: np.ndarray | None = None
        self._extras: dict[str, np.ndarray] = {}  # rings of the extra per-step fields, made by the first push
        self._reward = np.zeros((self.steps, self.num_envs), dtype=np.float32)
        self._terminated = np.zeros((self.steps, self.num_envs), dtype=bool)

    def reset(self) -> None:
        """Drop every env's running episode: its next step starts a new one."""
        self._t[:] = 0

    @property
    def episode_steps(self) -> np.ndarray:
        """Steps of each env's running episode taken so far."""
        return self._t.copy()

    def push(self, obs: np.ndarray, action: np.ndarray, reward: np.ndarray, terminated: np.ndarray,
             truncated: np.ndarray, state: np.ndarray | None, valid: np.ndarray | None = None,
             env_ids: np.ndarray | None = None, extras: Mapping[str, np.ndarray] | None = None) -> Batch | None:
        """Record one vector step; return the items it completes, or None.

        ``state`` (rows, 2, H) float32: the recurrent state each env held before acting on ``obs``
        (``[:, 0]`` h, ``[:, 1]`` c; :class:`~zmqrl.core.RecurrentPolicy`), or None on every push for a
        policy without one (items then have no ``state_h``, ``state_c``). ``extras``: further per-step
        fields, one row per env (the same keys on every push), stored with each step. ``env_ids`` (distinct env
        indices, one per row; default: row i is env i, every env): the step of those envs only.
        ``valid`` (bool per row, default all): rows that are no step of their env (an env resetting
        after its episode ended) are ignored; an env in the middle of an episode may not skip one.
        """
        obs, action = np.asarray(obs), np.asarray(action)
        state = None if state is None else np.asarray(state, dtype=np.float32)
        extra = {key: np.asarray(value) for key, value in (extras or {}).items()}
        rows = len(obs) if obs.ndim else 0
        ids = np.arange(self.num_envs) if env_ids is None else np.asarray(env_ids, dtype=np.int64)
        if ids.ndim != 1 or ids.size != rows or np.unique(ids).size != ids.size or \
                (ids.size and (ids.min() < 0 or ids.max() >= self.num_envs)):
            raise ValueError(f"env_ids: expected {rows} distinct env indices in [0, {self.num_envs}), got {ids}")
        flags = {}
        for name, x in (("reward", reward), ("terminated", terminated), ("truncated", truncated),
                        ("valid", np.ones(rows, dtype=bool) if valid is None else valid)):
            flags[name] = np.asarray(x)
            if flags[name].shape != (rows,):
                raise ValueError(f"{name}: expected shape ({rows},), got {flags[name].shape}")
        self._check_rows(obs, action, state, extra)
        assert self._obs is not None and self._action is not None
        taken = flags["valid"].astype(bool)
        if np.any(self._t[ids[~taken]]):
            raise ValueError("valid: an env in the middle of an episode skipped a step")
        ids, rows_taken = ids[taken], np.flatnonzero(taken)
        t = self._t[ids]
        slots = t % self.steps
        self._obs[slots, ids] = obs[rows_taken]
        self._action[slots, ids] = action[rows_taken]
        if self._state is not None and state is not None:
            self._state[slots, ids] = state[rows_taken]
        for key, ring in self._extras.items():
            ring[slots, ids] = extra[key][rows_taken]
        self._reward[slots, ids] = flags["reward"][rows_taken]
        term = flags["terminated"][rows_taken].astype(bool)
        ended = term | flags["truncated"][rows_taken].astype(bool)
        self._terminated[slots, ids] = term
        self._t[ids] = t + 1

        envs, starts, lasts = [], [], []
        full = t - self.length  # the item whose last step this is, where one starts there
        done = (full >= 0) & (full % self.period == 0)
        envs.append(ids[done])
        starts.append(full[done])
        lasts.append(t[done])
        for row in np.flatnonzero(ended):  # the items still open, padded; none with no step that has a target
            first = max(int(t[row]) - self.length + 1, 0)
            open_starts = np.arange(-(-first // self.period) * self.period, int(t[row]) + 1, self.period)
            if not term[row]:
                open_starts = open_starts[open_starts < t[row]]
            envs.append(np.full(open_starts.size, ids[row]))
            starts.append(open_starts)
            lasts.append(np.full(open_starts.size, t[row]))
        self._t[ids[ended]] = 0
        env, start, last = (np.concatenate(parts).astype(np.int64) for parts in (envs, starts, lasts))
        return self._items(env, start, last) if env.size else None

    def _items(self, env: np.ndarray, start: np.ndarray, last: np.ndarray) -> Batch:
        """The items of env ``env`` whose first trained step is episode step ``start``, the episode's steps
        known up to ``last`` (one entry per item)."""
        assert self._obs is not None and self._action is not None
        step = start[:, None] - self.burn_in + np.arange(self.steps)  # (items, T): the episode step of each row
        real = (step >= 0) & (step <= last[:, None])
        slot = step % self.steps
        column = env[:, None]

        def gather(ring: np.ndarray) -> np.ndarray:
            values = ring[slot, column]
            values[~real] = 0
            return values

        discount = np.where(real & ~self._terminated[slot, column], self.gamma, np.float32(0.0))
        items = {"obs": gather(self._obs), "action": gather(self._action), "reward": gather(self._reward),
                 "discount": discount.astype(np.float32), "mask": real.astype(np.float32)}
        for key, ring in self._extras.items():
            items[key] = gather(ring)
        if self._state is not None:
            first = np.maximum(start - self.burn_in, 0) % self.steps  # the first real row's step
            state = self._state[first, env]
            items["state_h"], items["state_c"] = state[:, 0].copy(), state[:, 1].copy()
        return items

    def _check_rows(self, obs: np.ndarray, action: np.ndarray, state: np.ndarray | None,
                    extra: dict[str, np.ndarray]) -> None:
        """Shapes and dtypes of a push's rows; the rings are made on the first push."""
        rows = len(obs) if obs.ndim else 0
        given = {"obs": obs, "action": action, **extra}
        if state is not None:
            given["state"] = state
        for name, arr in given.items():
            if arr.ndim == 0 or arr.shape[0] != rows:
                raise ValueError(f"{name}: expected leading dim {rows}, got shape {arr.shape}")
        if state is not None and (state.ndim != 3 or state.shape[1] != 2):
            raise ValueError(f"state: expected shape (rows, 2, state size), got {state.shape}")
        if self._obs is None:
            self._obs = np.zeros((self.steps, self.num_envs, *obs.shape[1:]), dtype=obs.dtype)
            self._action = np.zeros((self.steps, self.num_envs, *action.shape[1:]), dtype=action.dtype)
            if state is not None:
                self._state = np.zeros((self.steps, self.num_envs, *state.shape[1:]), dtype=np.float32)
            self._extras = {key: np.zeros((self.steps, self.num_envs, *arr.shape[1:]), dtype=arr.dtype)
                            for key, arr in extra.items()}
        assert self._action is not None
        if (state is None) != (self._state is None) or set(extra) != set(self._extras):
            raise ValueError(f"a push brings the state and extra fields the first one did: state "
                             f"{'given' if self._state is not None else 'none'}, extras {sorted(self._extras)}; "
                             f"got state {'given' if state is not None else 'none'}, extras {sorted(extra)}")
        checked = [("obs", obs, self._obs), ("action", action, self._action),
                   *((key, extra[key], ring) for key, ring in self._extras.items())]
        if state is not None and self._state is not None:
            checked.append(("state", state, self._state))
        for name, arr, ring in checked:
            if arr.shape[1:] != ring.shape[2:] or (name != "state" and arr.dtype != ring.dtype):
                raise ValueError(f"{name}: expected rows of shape {ring.shape[2:]} dtype {ring.dtype}, "
                                 f"got {arr.shape[1:]} {arr.dtype}")
