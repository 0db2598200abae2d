"""Evaluator: runs greedy episodes on new model versions, reports them, keeps the best model.

Recipe: subscribe to the learner's stream (models and control), push reports to the learner's
evaluation socket,
then loop: take the newest model; when it is at least ``trainer.eval_interval`` optimisation
steps past the last one evaluated, run ``trainer.eval_episodes`` greedy episodes, report the
returns, and save the model to ``checkpoints/best`` when it beats every earlier one.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

import numpy as np
import zmq

from zmqrl.config import Config
from zmqrl.envs.evaluator import evaluator_for
from zmqrl.roles.admission import MAC_KEY, TOKEN_ENV, TOKEN_FILE, eval_token, report_mac
from zmqrl.roles.fit import EXIT_CONFIG_MISMATCH, learner_done, load_if_fits, signature_digest, task_signature
from zmqrl.roles.net import options
from zmqrl.roles.skeleton import RoleProcess, serve
from zmqrl.roles.stream import LearnerStream
from zmqrl.run import checkpoint
from zmqrl.run.acting import make_task
from zmqrl.run.lifecycle import Every, StopFlag, seed_everything
from zmqrl.wire import EVAL, Message, SocketOptions, encode, eval_meta, send_frames

log = logging.getLogger("zmqrl")


class Evaluator(RoleProcess):
    """One evaluator process."""

    def __init__(self, cfg: Config, model_addr: str, report_addr: str, run_dir: str | None = None,
                 snapshot_addr: str | None = None) -> None:
        super().__init__(cfg, "evaluator", run_dir)
        seed = cfg.run.seed + 1_000_000
        seed_everything(seed)
        task = make_task(cfg)
        self.signature = task_signature(task)
        self.policy = task.policy(seed, backend=cfg.actor.backend)
        self.episodes = evaluator_for(cfg, seed)
        self.model_addr, self.report_addr = model_addr, report_addr
        self.stream = LearnerStream(self, cfg.net, model_addr, snapshot=snapshot_addr,
                                    digest=signature_digest(self.signature))
        self.push = self.socket(zmq.PUSH, options(cfg.net, SocketOptions.push()), connect=report_addr,
                                link="to learner reports {address}", linger_ms=500)
        self.versions = self.stream.versions
        self.seq = 0
        self.best = -math.inf
        self.last_opt_steps: int | None = None
        self.evaluated = 0
        self.unsent = 0
        self.finished = ""  # the learner's stop reason once it said the run is over
        self.refused = ""  # why the learner's models do not fit this config: exit 2
        self.token = eval_token(run_dir)  # read again at each report until found (the learner may write it later)
        self._warned_token = False

    def _due(self, opt_steps: int) -> bool:
        return self.last_opt_steps is None or opt_steps - self.last_opt_steps >= self.cfg.trainer.eval_interval \
            or opt_steps < self.last_opt_steps  # a new learner line started over

    def step(self) -> bool:
        """Evaluate the newest model if one is due; returns whether an evaluation ran."""
        bad = self.stream.take_control(self._control)
        msg, bad_models = self.stream.newest_model()
        self.stream.take_control(self._control)  # control of a learner line whose model just came
        bad += bad_models
        if bad:
            self.ratelog.warn("bad", f"evaluator: dropped {bad} bad message(s) from {self.model_addr}")
        if msg is None:
            return False
        opt_steps = msg.meta.get("opt_steps", 0)
        if not isinstance(opt_steps, int) or not self._due(opt_steps):
            return False
        problem = load_if_fits(self.policy, self.signature, msg)
        if problem is not None:
            self.refused = problem
            log.error("evaluator: %s", problem)
            return False
        params = {k: np.array(v) for k, v in msg.arrays.items()}
        returns, lengths = self.episodes.play(self.policy)
        self.last_opt_steps = opt_steps
        self.evaluated += 1
        try:  # never block: with the learner gone, a blocking send would hang shutdown
            send_frames(self.push, self._report(msg, opt_steps, returns, lengths), flags=zmq.NOBLOCK)
            self.seq += 1
        except zmq.Again:
            self.unsent += 1
            self.ratelog.warn("unsent", f"evaluator: learner {self.report_addr} is not taking reports; "
                                        f"{self.unsent} dropped (the best model is still kept here)")
        mean = float(np.mean(returns))
        log.info("evaluator: model v%d (opt %d): return %.1f ± %.1f", msg.version, opt_steps, mean, np.std(returns))
        if mean > self.best:
            self.best = mean
            self._save_best(params, msg.version, opt_steps, mean)
        return True

    def _report(self, msg: Message, opt_steps: int, returns: list[float], lengths: list[int]) -> list[Any]:
        """The EVAL message for ``msg``'s model: which learner line it came from and where that run was when
        it was made (the model's own ``opt_steps``, ``env_steps`` and ``wall_s``), signed with the
        run's evaluation token (:mod:`~zmqrl.roles.admission`) so the learner knows it is this evaluator's."""
        made_at: dict[str, Any] = {key: msg.meta[key] for key in ("env_steps", "wall_s") if key in msg.meta}
        meta = eval_meta(msg.version, returns, lengths,
                         {"model_inc": msg.incarnation, "opt_steps": opt_steps, **made_at})
        if self.token is None:
            self.token = eval_token(self.run_dir)
        if self.token is not None:
            meta[MAC_KEY] = report_mac(self.token, "evaluator", self.incarnation, self.seq, meta)
        elif not self._warned_token:
            self._warned_token = True
            log.warning("evaluator: no evaluation token (%s, or %s in --run-dir): the learner will not count these "
                        "reports", TOKEN_ENV, TOKEN_FILE)
        return encode(EVAL, sender="evaluator", incarnation=self.incarnation, seq=self.seq, version=msg.version,
                      meta=meta)

    def _save_best(self, params: dict[str, np.ndarray], version: int, opt_steps: int, mean: float) -> None:
        """``checkpoints/best``, holding the policy (what an evaluator has) as ``policy.npz``:
        written without torch (an evaluator acting with a numpy policy never imports it). The training state
        lives in ``latest`` and the numbered ones."""
        if not self.run_dir:
            return
        checkpoint.save_policy(Path(self.run_dir) / "checkpoints" / "best", params,
                               {"version": version, "opt_steps": opt_steps, "eval_return": mean, "source": "evaluator",
                                "training_state": False})

    def _control(self, msg: Message) -> None:
        """``done`` in the learner's control: the run is over."""
        done = learner_done(msg)
        if done and not self.finished:
            self.finished = done
            log.info("evaluator: the learner finished (%s); stopping", done)

    def run(self, stop: StopFlag) -> None:
        log.info("evaluator: waiting for models from %s; reporting to %s", self.model_addr, self.report_addr)
        remind = Every(30.0)
        while not stop.set and not self.finished and not self.refused:
            if not self.step():
                self.stream.wait(100)
                if self.versions.version < 0 and remind():
                    log.info("evaluator: still waiting for a model from %s", self.model_addr)

    def role_stats(self) -> dict[str, Any]:
        return {"evaluated": self.evaluated, "best": self.best, "reports_unsent": self.unsent}

    def close(self) -> None:
        super().close()
        self.episodes.close()


def run_evaluator(cfg: Config, model_addr: str, report_addr: str, run_dir: str | None = None,
                  snapshot_addr: str | None = None) -> int:
    """The ``zmqrl evaluator`` entry point."""
    evaluator = serve(lambda: Evaluator(cfg, model_addr, report_addr, run_dir, snapshot_addr))
    return EXIT_CONFIG_MISMATCH if evaluator.refused else 0
