"""Which evaluation reports the learner counts: those of the evaluator it admits, for its own models.

A report can end a run (``trainer.stop_return``), choose ``best`` and draw the curves, so one
forged message must not be able to do any of it. The learner counts a report only when

* it carries a MAC made with the run's evaluation token: a secret the launchers and the learner
  keep in ``RUN_DIR/eval.token`` (mode 0600, made once per run directory) or take from
  ``ZMQRL_EVAL_TOKEN``, which an evaluator on another machine needs set to the same value;
* it evaluates a model this learner published: its learner incarnation, a version no newer than
  the current one and newer than the last one counted (each version at most once), made at an
  optimisation step, env step and wall time (which the model carried and the report repeats, so the
  learner records the evaluation there) no later than where the learner is now;
* its episodes are plausible: ``trainer.eval_episodes`` of them, finite returns, lengths from 1 to
  the env's time limit.

Everything else is refused and counted by reason (``eval_token``, ``eval_version``, ``eval_episodes``).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from zmqrl.config import Config, ConfigError
from zmqrl.run.bookkeeping import ModelPoint

TOKEN_FILE = "eval.token"
TOKEN_ENV = "ZMQRL_EVAL_TOKEN"
MAC_KEY = "mac"


def eval_token(run_dir: str | Path | None, create: bool = False) -> bytes | None:
    """The run's evaluation token: ``$ZMQRL_EVAL_TOKEN`` if set, else ``RUN_DIR/eval.token`` (made now,
    mode 0600, when ``create`` and there is none yet); None when neither exists."""
    env = os.environ.get(TOKEN_ENV, "").strip()
    if env:
        return env.encode()
    if not run_dir:
        return None
    path = Path(run_dir) / TOKEN_FILE
    if create and not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{TOKEN_FILE}.tmp-{os.getpid()}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(secrets.token_hex(32))
            fh.flush()
            os.fsync(fh.fileno())
        try:
            os.link(tmp, path)  # never replaces a token another process made meanwhile
        except FileExistsError:
            pass
        finally:
            tmp.unlink(missing_ok=True)
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return text.encode() if text else None


def report_mac(token: bytes, sender: str, incarnation: str, seq: int, meta: Mapping[str, Any]) -> str:
    """The MAC of an evaluation report: HMAC-SHA256 over its sender, incarnation, sequence number and
    meta (without the MAC), so a report cannot be made, altered or replayed under another number."""
    body = {k: v for k, v in meta.items() if k != MAC_KEY}
    text = json.dumps([sender, incarnation, seq, body], sort_keys=True, separators=(",", ":"))
    return hmac.new(token, text.encode(), hashlib.sha256).hexdigest()


def episode_limit(cfg: Config) -> int:
    """The longest episode an evaluation may report: ``env.max_episode_steps``, else the env's
    registered time limit, else 2**31."""
    if cfg.env.max_episode_steps:
        return int(cfg.env.max_episode_steps)
    try:
        import gymnasium as gym

        registered = gym.spec(cfg.env.id).max_episode_steps
    except Exception:  # a custom env factory, or an id gymnasium does not know: no limit to go by
        registered = None
    return int(registered) if registered else 2**31


class EvalAdmission:
    """The learner's check of evaluation reports (module docstring)."""

    def __init__(self, cfg: Config, run_dir: Path) -> None:
        self.episodes = cfg.trainer.eval_episodes
        self.max_length = episode_limit(cfg)
        self.token = eval_token(run_dir, create=True)
        if self.token is None:
            raise ConfigError(f"no evaluation token: set {TOKEN_ENV} or let the learner write {run_dir / TOKEN_FILE}")
        self.last_version = -1  # the newest version an admitted report evaluated

    def problem(self, sender: str, incarnation: str, seq: int, version: int, meta: Mapping[str, Any],
                learner_incarnation: str, published: int, now: ModelPoint) -> tuple[str, str] | None:
        """``(reason, why)`` when the report must not count; None when it does (and is now taken)."""
        mac = meta.get(MAC_KEY)
        if not isinstance(mac, str) or not hmac.compare_digest(
                mac, report_mac(self.token or b"", sender, incarnation, seq, meta)):
            return "eval_token", (f"it is not signed with this run's evaluation token ({TOKEN_ENV} or "
                                  f"RUN_DIR/{TOKEN_FILE}, which the evaluator must share)")
        if meta.get("model_inc") != learner_incarnation or not self.last_version < version <= published:
            return "eval_version", (f"it evaluates model version {version} of learner "
                                    f"{str(meta.get('model_inc'))[:16]!r}, not a version this learner published "
                                    f"after {self.last_version} (now at {published})")
        if reported_point(meta, now) is None:
            return "eval_version", (f"it does not say where the run was when its model was made (opt_steps, "
                                    f"env_steps and wall_s, at most {now.opt_steps}, {now.env_steps} and "
                                    f"{now.wall_s:.0f})")
        returns, lengths = meta.get("returns"), meta.get("lengths")
        if not (type(returns) is list and type(lengths) is list and len(returns) == len(lengths) == self.episodes):
            return "eval_episodes", f"it does not hold trainer.eval_episodes={self.episodes} returns and lengths"
        for r in returns:
            if type(r) not in (int, float) or not -1e15 <= r <= 1e15:  # (NaN fails; 10**400 too, unconverted)
                return "eval_episodes", f"a return of {str(r)[:40]} is not a finite number"
        for n in lengths:
            if type(n) is not int or not 1 <= n <= self.max_length:
                return "eval_episodes", f"an episode length of {str(n)[:40]} is outside 1..{self.max_length}"
        self.last_version = version
        return None


def reported_point(meta: Mapping[str, Any], now: ModelPoint) -> ModelPoint | None:
    """The point a report says its model was made at (``opt_steps``, ``env_steps``, ``wall_s``), when
    each is a number from 0 to where the run is ``now``; None otherwise."""
    opt: Any = meta.get("opt_steps")
    env: Any = meta.get("env_steps")
    wall: Any = meta.get("wall_s")
    if type(opt) is not int or type(env) is not int or type(wall) not in (int, float):
        return None
    if not (0 <= opt <= now.opt_steps and 0 <= env <= now.env_steps and 0 <= wall <= now.wall_s + 1.0):
        return None  # (+1 s: the model's wall time is rounded finer than the learner's clock here)
    return ModelPoint(opt, env, float(wall))
