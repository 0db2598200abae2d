"""Actor: steps a vector of envs with a local policy and PUSHes batches of n-step transitions.

Recipe: build the policy and envs, connect to the proxy (PUSH) and the learner's model stream
(SUB), wait for the first model, then loop: take the newest model, act for the whole vector in
one forward pass, build n-step transitions, and every ``actor.n_buffer`` transitions send one
batch stamped with the model version, the actor's id, incarnation and sequence number.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import zmq

from zmqrl.agents import make_policy
from zmqrl.config import Config
from zmqrl.envs import VectorStepper, check_env, make_vector_env, spaces
from zmqrl.lifecycle import StopFlag, seed_everything
from zmqrl.replay import NStepBuilder
from zmqrl.roles.common import Every, limits, new_context, options, send_blocking, write_role_stats
from zmqrl.wire import (
    BATCH,
    MODEL,
    Message,
    RateLimitedLog,
    SocketOptions,
    VersionTracker,
    drain_latest_model,
    encode,
    make_socket,
    new_incarnation,
)
from zmqrl.wire.monitor import LinkMonitor

log = logging.getLogger("zmqrl")


def actor_epsilon(eps: float, alpha: float, index: int, num_actors: int) -> float:
    """Ape-X exploration: actor i of N uses eps ** (1 + alpha * i / (N - 1)); one actor uses eps."""
    if num_actors <= 1:
        return eps
    return float(eps ** (1.0 + alpha * index / (num_actors - 1)))


def lower_priority(nice: int) -> None:
    """Yield CPU to the learner: raise this process's niceness and, where the kernel groups
    scheduling by session (autogroup), the niceness of this process's session too."""
    os.nice(nice)
    try:
        with open("/proc/self/autogroup", "w") as fh:
            fh.write(str(nice))
    except OSError:
        pass


@dataclass
class ActorStats:
    """What an actor did (border's ``ActorStat``), sent along with every batch."""

    env_steps: int = 0
    episodes: int = 0
    batches: int = 0
    transitions: int = 0
    bytes_sent: int = 0
    blocked_s: float = 0.0
    paused_s: float = 0.0
    model_updates: int = 0
    bad_models: int = 0
    start: float = field(default_factory=time.monotonic)

    def as_dict(self) -> dict[str, Any]:
        wall = time.monotonic() - self.start
        return {"env_steps": self.env_steps, "episodes": self.episodes, "batches": self.batches,
                "transitions": self.transitions, "bytes_sent": self.bytes_sent,
                "blocked_s": round(self.blocked_s, 3), "paused_s": round(self.paused_s, 3),
                "model_updates": self.model_updates,
                "bad_models": self.bad_models, "wall_s": round(wall, 3),
                "env_steps_per_s": self.env_steps / max(wall, 1e-9)}


class Actor:
    """One actor process: envs, local policy, and its two sockets."""

    def __init__(self, cfg: Config, index: int, proxy_addr: str, model_addr: str,
                 run_dir: str | None = None) -> None:
        if cfg.actor.nice:
            lower_priority(cfg.actor.nice)
        self.cfg, self.index, self.run_dir = cfg, index, run_dir
        self.name = f"actor-{index}"
        self.incarnation = new_incarnation()
        self.seed = cfg.run.seed + 1000 * (index + 1)
        seed_everything(self.seed)
        check_env(cfg.env)
        obs_space, act_space = spaces(cfg.env)
        self.policy = make_policy(cfg.agent, obs_space, act_space, seed=self.seed, backend=cfg.actor.backend)
        self.epsilon = actor_epsilon(cfg.actor.eps, cfg.actor.eps_alpha, index, cfg.actor.num_actors)
        self.stepper = VectorStepper(make_vector_env(cfg.env, cfg.env.num_envs, self.seed), self.seed)
        self.nstep = NStepBuilder(cfg.env.num_envs, cfg.agent.n_step, cfg.agent.gamma)
        self.priorities = cfg.actor.compute_priorities and cfg.replay.prioritized

        self.ctx = new_context(cfg.net)
        self.proxy_addr, self.model_addr = proxy_addr, model_addr
        push_opts = options(cfg.net, SocketOptions.push(sndhwm=cfg.actor.send_hwm), data_path=True)
        self.push = make_socket(self.ctx, zmq.PUSH, push_opts, connect=proxy_addr)
        self.sub = make_socket(self.ctx, zmq.SUB, options(cfg.net, SocketOptions.sub(limits(cfg.net, MODEL))),
                               connect=model_addr)
        self.model_limits = limits(cfg.net, MODEL)
        self.links = [LinkMonitor(self.sub, self.name, f"to learner models {model_addr}"),
                      LinkMonitor(self.push, self.name, f"to proxy {proxy_addr}")]
        self._watch_links = Every(0.25)
        self.versions = VersionTracker()
        self.version = -1
        self.paused = False
        self.seq = 0
        self.stats = ActorStats()
        self.ratelog = RateLimitedLog(log, interval=10.0)
        self._pending: list[dict[str, np.ndarray]] = []
        self._pending_n = 0
        self._batch_versions: list[int] = []
        self._episodes: tuple[list[float], list[int]] = ([], [])

    # --- models -----------------------------------------------------------------------------
    def _take_newest_model(self) -> bool:
        msg, bad = drain_latest_model(self.sub, self.versions, self.model_limits, observe=self._control)
        self.stats.bad_models += bad
        if bad:
            self.ratelog.warn("bad-model", f"{self.name}: dropped {bad} bad message(s) from {self.model_addr}")
        if msg is None:
            return False
        try:
            self.policy.load_params(msg.arrays)
        except ValueError as exc:
            self.stats.bad_models += 1
            self.ratelog.warn("mismatch", f"{self.name}: model version {msg.version} from {self.model_addr} "
                                          f"does not fit this config's network: {exc}")
            return False
        self.version = msg.version
        self.stats.model_updates += 1
        return True

    def _control(self, msg: Message) -> None:
        """The learner's rate limiter: ``pause`` in model meta asks actors to stop stepping."""
        if msg.incarnation == self.versions.incarnation or self.versions.incarnation is None:
            self.paused = msg.meta.get("pause") is True

    def wait_for_model(self, stop: StopFlag) -> bool:
        """Block until the first model arrives (or stop); logs where it waits."""
        log.info("%s: waiting for the first model from %s", self.name, self.model_addr)
        started, remind = time.monotonic(), Every(10.0)
        wait_s = self.cfg.net.peer_wait_s
        while not stop.set:
            self._poll_links()
            if self.sub.poll(100, zmq.POLLIN) and self._take_newest_model():
                log.info("%s: got model version %d after %.2fs; acting with epsilon %.4g", self.name,
                         self.version, time.monotonic() - started, self.epsilon)
                return True
            if remind():
                log.info("%s: still waiting for a model from %s (%.0fs)", self.name, self.model_addr,
                         time.monotonic() - started)
            if wait_s and time.monotonic() - started > wait_s:
                log.error("%s: no model from %s within net.peer_wait_s=%s", self.name, self.model_addr, wait_s)
                return False
        return False

    # --- batches ----------------------------------------------------------------------------
    def _send(self, stop: StopFlag) -> None:
        batch = {k: np.concatenate([p[k] for p in self._pending]) for k in self._pending[0]}
        if self.priorities:
            batch["priority"] = self.policy.priorities(batch)
        returns, lengths = self._episodes
        meta = {"episodes": {"returns": returns, "lengths": lengths}, "actor": self.index,
                "max_version": max(self._batch_versions), "model_inc": self.versions.incarnation,
                "epsilon": self.epsilon, "stats": self.stats.as_dict()}
        frames = encode(BATCH, sender=self.name, incarnation=self.incarnation, seq=self.seq,
                        version=min(self._batch_versions), arrays=batch, meta=meta)
        sent, blocked_s = send_blocking(
            self.push, frames, stop,
            on_block=lambda: self.ratelog.warn("blocked", f"{self.name}: proxy {self.proxy_addr} is not taking "
                                                          "batches; waiting (memory stays bounded)"),
            while_blocked=self._keep_reading)
        self.stats.blocked_s += blocked_s
        if sent is None:
            return
        self.seq += 1
        self.stats.batches += 1
        self.stats.transitions += len(batch["reward"])
        self.stats.bytes_sent += sent
        self._pending, self._pending_n, self._batch_versions = [], 0, []
        self._episodes = ([], [])

    def run(self, stop: StopFlag, max_env_steps: int = 0) -> None:
        """Act until stopped (or ``max_env_steps``), sending a batch every ``n_buffer`` transitions."""
        if not self.wait_for_model(stop):
            return
        n_buffer = self.cfg.actor.n_buffer
        report = Every(self.cfg.net.stats_interval_s * 5)
        while not stop.set:
            self._take_newest_model()
            if self._watch_links():
                self._poll_links()
            # Paused by the learner's rate limiter, or cut off from the learner: stepping on would
            # only fill queues with data from a policy that is getting older by the second.
            if self.paused or self.links[0].down:
                paused_at = time.monotonic()
                self.sub.poll(50, zmq.POLLIN)
                self.stats.paused_s += time.monotonic() - paused_at
                continue
            self._batch_versions.append(self.version)
            step = self.stepper.step(self.policy.act(self.stepper.obs, self.epsilon))
            self.stats.env_steps += self.stepper.num_envs
            self.stats.episodes += len(step.episode_returns)
            self._episodes[0].extend(step.episode_returns)
            self._episodes[1].extend(step.episode_lengths)
            transitions = self.nstep.push(step.obs, step.action, step.reward, step.next_obs,
                                          step.terminated, step.truncated)
            if transitions is not None:
                self._pending.append(transitions)
                self._pending_n += len(transitions["reward"])
                if self._pending_n >= n_buffer:
                    self._send(stop)
            if report():
                s = self.stats.as_dict()
                log.info("%s: %d env steps (%.0f/s), %d batches, model v%d, blocked %.1fs", self.name,
                         s["env_steps"], s["env_steps_per_s"], s["batches"], self.version, s["blocked_s"])
            if max_env_steps and self.stats.env_steps >= max_env_steps:
                break

    def _keep_reading(self) -> None:
        """While blocked on send: keep the model stream and link events read."""
        self._take_newest_model()
        self._poll_links()

    def _poll_links(self) -> None:
        for link in self.links:
            link.poll()

    def close(self) -> None:
        write_role_stats(self.run_dir, self.name, {"incarnation": self.incarnation, "sent_seq": self.seq,
                                                   "epsilon": self.epsilon, **self.stats.as_dict(),
                                                   "links": [link.stats() for link in self.links]})
        for link in self.links:
            link.close()
        self.push.close(linger=1000)
        self.sub.close(linger=0)
        self.ctx.term()
        self.stepper.close()


def run_actor(cfg: Config, index: int, proxy_addr: str, model_addr: str, run_dir: str | None = None) -> int:
    """The ``zmqrl actor`` entry point."""
    with StopFlag() as stop:
        actor = Actor(cfg, index, proxy_addr, model_addr, run_dir)
        try:
            actor.run(stop)
        finally:
            actor.close()
    s = actor.stats.as_dict()
    log.info("%s: stopped after %d env steps, %d batches (%d bytes), blocked %.1fs", actor.name,
             s["env_steps"], s["batches"], s["bytes_sent"], s["blocked_s"])
    return 0
