"""The learner's rate limiter: samples per inserted transition kept within configured bounds.

``trainer.max_samples_per_insert`` makes the learner wait for data when it has sampled each
transition that often on average (it would overfit a small replay); ``trainer.min_samples_per_insert``
asks actors to pause when data comes in faster than the learner uses it (on a shared CPU the
learner then gets the cores). Its counters are part of the learner's checkpoint, so a resumed
learner continues the same ratio instead of starting over at zero inserts.
"""

from __future__ import annotations

from typing import Any

from zmqrl.config import TrainerConfig


class SamplesPerInsert:
    """Samples (optimisation steps × batch size) per transition inserted into replay."""

    def __init__(self, tc: TrainerConfig, batch_size: int) -> None:
        self.min_ratio, self.max_ratio = tc.min_samples_per_insert, tc.max_samples_per_insert
        self.batch_size = batch_size
        self.inserted = 0  # transitions inserted over the whole run, resumes included
        self.paused = False  # actors asked to pause
        self.pauses = 0

    def ratio(self, opt_steps: int) -> float:
        return opt_steps * self.batch_size / max(self.inserted, 1)

    def throttled(self, opt_steps: int) -> bool:
        """Whether the learner should wait for data before its next optimisation step."""
        return self.max_ratio > 0 and self.ratio(opt_steps) > self.max_ratio

    def update_pause(self, opt_steps: int, warm: bool) -> bool:
        """Decide whether actors should pause now; True when that changed (tell them at once).

        Warm but the agent still loading also counts (0 samples per insert): actors need not fill
        replay with data nobody trains on, and their CPU is better spent loading torch.
        """
        pause = warm and self.min_ratio > 0 and self.ratio(opt_steps) < self.min_ratio
        if pause == self.paused:
            return False
        self.paused = pause
        self.pauses += pause
        return True

    def state_dict(self) -> dict[str, Any]:
        return {"inserted": self.inserted, "pauses": self.pauses}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.inserted = int(state.get("inserted", 0))
        self.pauses = int(state.get("pauses", 0))
