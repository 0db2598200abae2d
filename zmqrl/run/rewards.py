"""Rewards at any scale: the factor the learner multiplies stored rewards by before every update.

Replay keeps the rewards as the environment paid them; :meth:`RewardScale.scale` multiplies a sampled
batch's ``reward`` (a copy: an on-policy store hands the same arrays out for every epoch), so items
stored before and after the factor is known train alike, and evaluations and episode records stay on
the game's own scale. ``env.reward_scale`` is the factor, or ``auto``: then the learner measures the
root mean square of the rewards it stored during warm-up (the first episodes, played by the untrained
policy) and sets the factor that brings it to ``env.reward_rms``, the scale the config was tuned at.
The same config then sees the same numbers whether the game pays ±0.01 or ±100 a step: the Huber
threshold, value rescaling, Adam's epsilon, SAC's entropy bonus and the critic's learning rate all stay
where they were tuned. The factor is measured once and kept (a moving scale would move every value
target with it), saved with checkpoints and taken back on resume; where warm-up paid no reward at all
it stays 1 until some is paid (values of a reward-free replay are zero at any scale).

The factor goes to actors with the learner's control (``rscale``), for the priorities they compute;
an actor never sends one: the learner measures what it stores itself.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from zmqrl.config import EnvConfig
from zmqrl.replay import PrioritizedReplay

AUTO = "auto"
FAR = 10.0  # a reward RMS more than this many times from env.reward_rms (either way) draws a warning
FACTOR_RANGE = (1e-6, 1e6)  # a measured factor is kept within this range
CONTROL_KEY = "rscale"  # the factor in the learner's control

log = logging.getLogger("zmqrl")


def stored_rewards(arrays: Mapping[str, Any]) -> np.ndarray:
    """The rewards of a batch of items as stored, padding left out (``mask``: sequences and segments)."""
    reward = np.asarray(arrays["reward"], dtype=np.float64)
    mask = arrays.get("mask")
    return reward[np.asarray(mask) > 0] if mask is not None else reward.reshape(-1)


def scaled(batch: dict[str, Any], factor: float) -> dict[str, Any]:
    """``batch`` with its ``reward`` multiplied by ``factor`` (a new mapping and a new reward array; the
    rest shared); ``batch`` itself when the factor is 1. Works for numpy arrays and torch tensors."""
    if factor == 1.0 or "reward" not in batch:
        return batch
    out = dict(batch)
    out["reward"] = batch["reward"] * factor
    return out


class RewardScale:
    """The learner's reward factor (module docstring): fixed by ``env.reward_scale``, or with ``auto``
    measured once from the rewards stored during warm-up."""

    def __init__(self, env: EnvConfig) -> None:
        self.auto = env.reward_scale == AUTO
        self.target = env.reward_rms
        self.factor = 1.0 if self.auto or isinstance(env.reward_scale, str) else float(env.reward_scale)
        self.measured_rms: float | None = None  # RMS of the rewards stored in warm-up, as the env paid them
        self._sum_sq = 0.0
        self._count = 0

    @property
    def settle_due(self) -> bool:
        """Whether the measurement is still to be taken (:meth:`settle`)."""
        return self.measured_rms is None

    def observe(self, arrays: Mapping[str, Any]) -> None:
        """Count a stored batch's rewards, until the measurement is taken."""
        if self.measured_rms is not None or "reward" not in arrays:
            return
        rewards = stored_rewards(arrays)
        self._sum_sq += float(np.dot(rewards, rewards))
        self._count += rewards.size

    def settle(self, who: str = "") -> bool:
        """Once replay is warm (the caller's to say) and some reward was paid: take the measurement and,
        with ``auto``, set the factor; logged (``who`` starts the line), with a warning naming the keys
        where a fixed factor leaves rewards far from the scale the config assumes. Returns whether the
        measurement was taken now."""
        if self.measured_rms is not None or self._count == 0 or self._sum_sq == 0.0:
            return False
        rms = math.sqrt(self._sum_sq / self._count)
        self.measured_rms = rms
        target = self.target if self.target is not None else 1.0
        if self.auto:
            low, high = FACTOR_RANGE
            self.factor = min(max(target / rms, low), high)
            log.info("%srewards stored in warm-up: RMS %.4g over %s rewards; env.reward_scale: auto scales them by "
                     "%.4g to the RMS %g the config assumes (%s)", who, rms, f"{self._count:,}", self.factor, target,
                     "env.reward_rms" if self.target is not None else "env.reward_rms unset: 1")
            return True
        seen = rms * self.factor
        if self.target is not None and (seen > self.target * FAR or seen * FAR < self.target):
            log.warning("%srewards stored in warm-up have RMS %.4g (the env's %.4g times env.reward_scale %g), "
                        "far from the %g this config assumes (env.reward_rms): it was tuned at another reward scale "
                        "and may learn slowly or not at all; set env.reward_scale: auto (or a factor near %.3g)",
                        who, seen, rms, self.factor, self.target, self.target / rms)
        return True

    def level_priorities(self, replay: object) -> None:
        """After an ``auto`` measurement: every item stored so far gets the same priority, the config's reward
        scale. Their priorities came from actors that did not know the factor yet (TD errors at the env's
        scale): left so, a task paid x100 would draw its warm-up items about 16 times as often as the items
        that follow (alpha 0.6), one paid x0.01 hardly at all; levelled, every scale starts alike."""
        if not self.auto or self.measured_rms is None or not isinstance(replay, PrioritizedReplay) or not len(replay):
            return
        n = len(replay)
        replay.update_priorities(np.arange(n), np.full(n, self.target if self.target is not None else 1.0))

    def scale(self, batch: dict[str, Any]) -> dict[str, Any]:
        """A sampled batch with its rewards multiplied by the factor."""
        return scaled(batch, self.factor)

    def state_dict(self) -> dict[str, Any]:
        return {"factor": self.factor, "measured_rms": self.measured_rms, "auto": self.auto,
                "sum_sq": self._sum_sq, "count": self._count}

    def load_state_dict(self, state: Mapping[str, Any], where: str) -> None:
        """Take a checkpoint's factor and measurement back (a factor set by a number in the config wins
        over the checkpoint's, as every other config value does)."""
        try:
            factor = float(state["factor"])
            rms = state.get("measured_rms")
            measured = None if rms is None else float(rms)
            sum_sq, count = float(state.get("sum_sq", 0.0)), int(state.get("count", 0))
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"{where}: 'reward_scale' is not a reward scale's state: {exc}") from None
        if not (math.isfinite(factor) and factor > 0):
            raise ValueError(f"{where}: 'reward_scale' holds the factor {factor!r}, not a positive finite number")
        if self.auto:
            self.factor = factor
        self.measured_rms, self._sum_sq, self._count = measured, sum_sq, count


def control_factor(meta: Mapping[str, Any]) -> float:
    """The reward factor a learner's control names (1 when it names none or one out of range)."""
    value = meta.get(CONTROL_KEY)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return 1.0
    low, high = FACTOR_RANGE
    return float(value) if math.isfinite(value) and low <= value <= high else 1.0
