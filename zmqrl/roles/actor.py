"""Actor: steps a vector of envs with a local policy and PUSHes batches of n-step transitions.

Recipe: build the policy and envs, connect to the proxy (PUSH) and the learner's stream (its
models and its control, :mod:`~zmqrl.roles.stream`), wait for the first model, then loop: take
the learner's control (pause, allowance, done) and the newest model, act for the whole vector in
one forward pass, build n-step transitions, and every ``actor.n_buffer`` transitions send one
batch stamped with the model version, the actor's id, incarnation and sequence number.

Costs that decide a fast actor's speed (CartPole: a vector step takes ~150 us on 2 cores), each
measured and kept off the per-step path: the stream is polled every ``MODEL_POLL_S``, not
every step; batches finished within ``SEND_LINGER_S`` of the last send go out together, because
waking ZeroMQ's I/O thread for each message costs more than the rest of the sending; batches
that go out together are assembled with one concatenation per field; priorities come from the
values the policy computed when acting, where its algorithm can reuse them (a policy that is a
:class:`~zmqrl.core.ReusesActingValues`: no forward pass of their own, see
:class:`~zmqrl.run.acting.ActingLoop`), else from one forward pass per batch (of
``obs`` and ``next_obs`` together); and a header is filled into a template
(:class:`~zmqrl.wire.batches.BatchEncoder`) rather than built and checked anew. Image stacks
(``obs``/``next_obs`` of uint8 frames) go as each batch's distinct frames and their indices
(:class:`~zmqrl.wire.compact.FrameCompactor`; Pong: 1.5 frames per transition at ``n_buffer`` 32
instead of 8), compressed with ``net.compress``.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import zmq

from zmqrl.config import Config
from zmqrl.frames import image_fields
from zmqrl.roles.fit import (
    EXIT_CONFIG_MISMATCH,
    Allowance,
    learner_done,
    load_if_fits,
    signature_digest,
    task_signature,
)
from zmqrl.roles.net import options, send_blocking
from zmqrl.roles.skeleton import RoleProcess, serve
from zmqrl.roles.stream import LearnerStream
from zmqrl.run.acting import ActingLoop, make_task
from zmqrl.run.lifecycle import Every, StopFlag, seed_everything
from zmqrl.run.rewards import control_factor, scaled
from zmqrl.wire import (
    DEFAULT_COPY_THRESHOLD,
    SUPPORTED_VERSIONS,
    BatchEncoder,
    Message,
    SocketOptions,
    VersionTracker,
    WireError,
    encode_hello,
    send_frames,
)
from zmqrl.wire.compact import FrameCompactor

log = logging.getLogger("zmqrl")

HOST = socket.gethostname()
MODEL_POLL_S = 0.002  # the loop looks for a new model and control (and link events) this often
SEND_LINGER_S = 0.02  # batches finished sooner than this after the last send wait to go out together


@dataclass
class ReadyBatch:
    """A finished batch waiting to be sent: transitions as built, model versions, episodes ended."""

    parts: list[dict[str, np.ndarray]]  # the acting loop's transitions, concatenated when sent
    size: int  # transitions
    low: int  # oldest and newest model version that acted for it
    high: int
    returns: list[float]  # episodes that ended while it was built
    lengths: list[int]
    grants: list[int] = field(default_factory=list)  # the learner's grants applied since the previous batch


def lower_priority(nice: int) -> None:
    """Yield CPU to the learner: raise this process's niceness and, where the kernel groups
    scheduling by session (autogroup), the niceness of this process's session too."""
    os.nice(nice)
    try:
        with open("/proc/self/autogroup", "w") as fh:
            fh.write(str(nice))
    except OSError:
        pass


def policy_device(name: str) -> str:
    """``actor.device`` checked and resolved (torch is imported only for a device other than the CPU)."""
    if name == "cpu":
        return name
    from zmqrl.agents.torch_util import resolve_device

    return str(resolve_device(name, "actor.device"))


@dataclass
class ActorStats:
    """What an actor did (border's ``ActorStat``). Every batch carries ``env_steps`` (the learner
    counts the run's env steps from it); all of it rides on one batch per ``net.stats_interval_s``
    (see :meth:`for_batch`)."""

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
        return {"host": HOST, "env_steps": self.env_steps, "episodes": self.episodes, "batches": self.batches,
                "transitions": self.transitions, "bytes_sent": self.bytes_sent,
                "blocked_s": round(self.blocked_s, 3), "paused_s": round(self.paused_s, 3),
                "model_updates": self.model_updates,
                "bad_models": self.bad_models, "wall_s": round(wall, 3),
                "env_steps_per_s": self.env_steps / max(wall, 1e-9)}

    def for_batch(self, full: bool) -> dict[str, Any]:
        """The stats a batch carries: all of them when ``full``, else ``env_steps`` alone (the rest
        on every batch was about a sixth of the learner's intake cost per CartPole batch)."""
        return self.as_dict() if full else {"env_steps": self.env_steps}


class Actor(RoleProcess):
    """One actor process: envs, local policy, and its two sockets."""

    def __init__(self, cfg: Config, index: int, proxy_addr: str, model_addr: str,
                 run_dir: str | None = None, snapshot_addr: str | None = None) -> None:
        if cfg.actor.nice:
            lower_priority(cfg.actor.nice)
        super().__init__(cfg, f"actor-{index}", run_dir)
        self.index = index
        self.seed = cfg.run.seed + 1000 * (index + 1)
        seed_everything(self.seed)
        task = make_task(cfg)
        self.signature = task_signature(task)
        self.policy = task.policy(self.seed, backend=cfg.actor.backend, device=policy_device(cfg.actor.device))
        self.exploration = task.exploration(index)
        self.priorities = cfg.actor.compute_priorities and cfg.replay.prioritized
        self.loop = ActingLoop(cfg, self.policy, self.exploration, self.seed, priorities=self.priorities)

        self.proxy_addr, self.model_addr = proxy_addr, model_addr
        self.stream = LearnerStream(self, cfg.net, model_addr, snapshot=snapshot_addr,
                                    digest=signature_digest(self.signature), on_error=self._wire_error)
        self.push = self.socket(zmq.PUSH, options(cfg.net, SocketOptions.push(sndhwm=cfg.actor.send_hwm),
                                                  data_path=True),
                                connect=proxy_addr, link="to proxy {address}", linger_ms=1000)
        self.version = -1
        self.allowance = Allowance()  # the learner's pause and allowance, as its control says them
        self.made = 0  # transitions in finished batches, counted against the allowance
        self.seq = 0
        self.encoder = BatchEncoder(self.name, self.incarnation, pack_below=DEFAULT_COPY_THRESHOLD)
        fields = image_fields(task.batch_spec())  # image stacks go as their distinct frames (net.compress: packed)
        self.compactor = FrameCompactor(fields, cfg.net.compress) if fields else None
        self.stats = ActorStats()
        self._full_stats = Every(cfg.net.stats_interval_s, now=True)
        self._pending: list[dict[str, np.ndarray]] = []  # transitions since the last batch, as built
        self._pending_n = 0
        self._versions: tuple[int, int] | None = None  # (min, max) model version acting for the pending batch
        self._episodes: tuple[list[float], list[int]] = ([], [])
        self._ready: list[ReadyBatch] = []  # finished batches not sent yet, oldest first
        self._flush_at = 0.0  # monotonic time from which ready batches go out (SEND_LINGER_S after a send)
        self.send_linger_s = SEND_LINGER_S  # 0: every batch goes out before the next env step
        self._hold = False  # paused by the learner or cut off from it: step no further for now
        self.finished = ""  # the learner's stop reason once it said the run is over
        self.refused = ""  # why this actor cannot act for the learner (a config mismatch): exit 2
        self.gave_up = False  # no model within net.peer_wait_s: exit 1, so a supervisor starts it again

    # --- models -----------------------------------------------------------------------------
    def _take_newest_model(self) -> bool:
        """Take the learner's control, then its newest model (and control of its line that waited for it)."""
        bad = self.stream.take_control(self._control)
        msg, bad_models = self.stream.newest_model()
        bad += bad_models
        self.stats.bad_models += bad
        if bad:
            self.ratelog.warn("bad-model", f"{self.name}: dropped {bad} bad message(s) from {self.model_addr}")
        if msg is None or self.refused:
            return False
        problem = load_if_fits(self.policy, self.signature, msg)
        if problem is not None:
            self._refuse(problem)
            return False
        self.version = msg.version
        if self._versions is not None:
            low, high = self._versions
            self._versions = (min(low, msg.version), max(high, msg.version))
        self.stats.model_updates += 1
        self.stream.take_control(self._control)
        return True

    @property
    def versions(self) -> VersionTracker:
        """The learner line and model version in use (:class:`~zmqrl.wire.VersionTracker`)."""
        return self.stream.versions

    def _control(self, msg: Message) -> None:
        """The learner's control: ``pause`` (its rate limiter asks actors to stop stepping), ``quota``
        (while the learner is starting: hold once this actor has made that many transitions, until
        control without one comes), ``allow`` (while it trains: make at most that many more
        transitions per grant) and ``done`` (the run is over: finish)."""
        self.allowance.observe(msg, self.made)
        self.loop.reward_factor = control_factor(msg.meta)  # the learner's factor on rewards, for priorities
        done = learner_done(msg)
        if done and not self.finished:
            self.finished = done
            log.info("%s: the learner finished (%s); stopping", self.name, done)

    def _wire_error(self, exc: WireError) -> None:
        if exc.reason == "version":
            self._refuse(f"the learner at {self.model_addr} speaks another protocol version ({exc}); this zmqrl "
                         f"speaks {sorted(SUPPORTED_VERSIONS)}: run the same zmqrl version on every host")

    def _refuse(self, reason: str) -> None:
        """A config or version mismatch: tell the learner (through the proxy), log it, and stop (exit 2)."""
        if self.refused:
            return
        self.refused = reason
        log.error("%s: %s", self.name, reason)
        try:
            send_frames(self.push, encode_hello(self.name, self.incarnation, self.seq, {"refused_model": reason}),
                        flags=zmq.NOBLOCK)
        except zmq.Again:
            pass  # the proxy is not taking messages; the log line above still says it

    def wait_for_model(self, stop: StopFlag) -> bool:
        """Block until the first model arrives (or stop); logs where it waits."""
        log.info("%s: waiting for the first model from %s", self.name, self.model_addr)
        started, remind = time.monotonic(), Every(10.0)
        wait_s = self.cfg.net.peer_wait_s
        while not stop.set and not self.refused and not self.finished:
            if self.stream.wait(100) and self._take_newest_model():
                log.info("%s: got model version %d after %.2fs; acting with %s %s", self.name, self.version,
                         time.monotonic() - started, self.exploration.name, self.exploration.describe())
                return True
            if remind():
                log.info("%s: still waiting for a model from %s (%.0fs)", self.name, self.model_addr,
                         time.monotonic() - started)
            if wait_s and time.monotonic() - started > wait_s:
                log.error("%s: no model from %s within net.peer_wait_s=%s", self.name, self.model_addr, wait_s)
                self.gave_up = True
                return False
        return False

    # --- batches ----------------------------------------------------------------------------
    def _finish_batch(self) -> None:
        """Set the pending transitions aside as a ready batch and start the next one."""
        low, high = self._versions if self._versions is not None else (self.version, self.version)
        self._ready.append(ReadyBatch(self._pending, self._pending_n, low, high, *self._episodes,
                                      grants=self.allowance.stamp()))
        self.made += self._pending_n
        self._pending, self._pending_n, self._versions = [], 0, None
        self._episodes = ([], [])

    def _arrays(self) -> list[dict[str, np.ndarray]]:
        """The ready batches' arrays, with priorities: one concatenation per field for all of them
        (numpy's per-call cost, not the rows, is what small batches pay for), a contiguous slice of
        it per batch, and, where the acting loop did not bring priorities, one forward pass per
        batch (larger ones cost more per row here: big temporaries are mmapped afresh each time,
        and OpenBLAS starts spinning worker threads)."""
        parts = [part for ready in self._ready for part in ready.parts]
        arrays = {key: np.concatenate([part[key] for part in parts]) for key in parts[0]}
        batches, end = [], 0
        for ready in self._ready:
            batch = {key: value[end:end + ready.size] for key, value in arrays.items()}
            if self.priorities and not self.loop.prioritises:
                priority = self.policy.priorities(scaled(batch, self.loop.reward_factor))
                if priority is not None:
                    batch["priority"] = priority
            batches.append(batch)
            end += ready.size
        return batches

    def _flush(self, stop: StopFlag) -> None:
        """Send the ready batches, oldest first; one stopped while blocked stays ready (unnumbered).

        All are encoded before the first is sent, so the messages leave back to back and ZeroMQ's
        I/O thread, woken by the first, finds the others queued (a wake-up costs more than a send).
        """
        if not self._ready:
            return
        stats = self.stats.for_batch(self._full_stats())
        outbox = []
        for i, (ready, arrays) in enumerate(zip(self._ready, self._arrays(), strict=True)):
            meta = {"episodes": {"returns": ready.returns, "lengths": ready.lengths}, "actor": self.index,
                    "max_version": ready.high, "model_inc": self.versions.incarnation, "grants": ready.grants,
                    "explore": self.exploration.mean(self.loop.env_steps), "stats": stats}
            if self.compactor is not None:
                arrays, frames_meta = self.compactor.compact(arrays)
                meta.update(frames_meta)
            outbox.append((self.encoder.encode(self.seq + i, ready.low, arrays, meta), ready.size))
        for frames, size in outbox:
            sent, blocked_s = send_blocking(
                self.push, frames, stop,
                on_block=lambda: self.ratelog.warn("blocked", f"{self.name}: proxy {self.proxy_addr} is not "
                                                              "taking batches; waiting (memory stays bounded)"),
                while_blocked=self._keep_reading)
            self.stats.blocked_s += blocked_s
            if sent is None:
                return
            del self._ready[0]
            self.seq += 1
            self.stats.batches += 1
            self.stats.transitions += size
            self.stats.bytes_sent += sent
        self._flush_at = time.monotonic() + self.send_linger_s

    def _housekeeping(self) -> None:
        """Between env steps, at most every ``MODEL_POLL_S``: newest model, link events, pause state."""
        self._take_newest_model()
        # Paused by the learner's rate limiter, past its start-up quota, cut off from the learner, or
        # its control says it runs another task: stepping on would only fill queues with data nobody
        # trains on yet, from a policy that is getting older by the second.
        self._hold = self.stream.down or self.stream.foreign or self._past_quota()

    def _past_quota(self) -> bool:
        """Whether the learner asks this actor to hold: paused, or its start-up quota or allowance made."""
        return self.allowance.reached(self.made)

    @property
    def paused(self) -> bool:
        return self.allowance.paused

    @property
    def quota(self) -> int | None:
        return self.allowance.quota

    def run(self, stop: StopFlag, max_env_steps: int = 0) -> None:
        """Act until stopped (or ``max_env_steps``), finishing a batch every ``n_buffer`` transitions.

        A new model is applied within about ``MODEL_POLL_S`` plus one vector step of its arrival,
        and a finished batch leaves at most ``send_linger_s`` (plus one vector step) after it is
        finished; slow actors send each batch at once (why both: the module docstring).
        """
        if not self.wait_for_model(stop):
            return
        self._act(stop, max_env_steps)
        self._flush(stop)  # what is finished goes out (while stopping: what the queue takes at once)

    def _act(self, stop: StopFlag, max_env_steps: int) -> None:
        """The acting loop of :meth:`run` (without the first model's wait and the last flush)."""
        n_buffer = self.cfg.actor.n_buffer
        report = Every(self.cfg.net.stats_interval_s * 5)
        loop, stats = self.loop, self.stats
        clock, next_poll = time.monotonic, 0.0
        while not stop.set:
            now = clock()
            if now >= next_poll:
                next_poll = now + MODEL_POLL_S
                self._housekeeping()
                if self.finished or self.refused:
                    break
                if self._hold:
                    self._flush(stop)  # nothing finished waits out a pause
                    self.stream.wait(50)
                    stats.paused_s += clock() - now
                    next_poll = 0.0
                    continue
                if report():
                    s = stats.as_dict()
                    log.info("%s: %d env steps (%.0f/s), %d batches, model v%d, blocked %.1fs", self.name,
                             s["env_steps"], s["env_steps_per_s"], s["batches"], self.version, s["blocked_s"])
            if self._ready and now >= self._flush_at:
                self._flush(stop)
            if self._versions is None:
                self._versions = (self.version, self.version)
            acted = loop.step()
            stats.env_steps += acted.env_steps
            if acted.episode_returns:
                stats.episodes += len(acted.episode_returns)
                self._episodes[0].extend(acted.episode_returns)
                self._episodes[1].extend(acted.episode_lengths)
            transitions = acted.transitions
            if transitions is not None:
                self._pending.append(transitions)
                self._pending_n += len(transitions["reward"])
                if self._pending_n >= n_buffer:
                    self._finish_batch()
                    if self._past_quota():
                        next_poll = 0.0  # hold at once, not up to MODEL_POLL_S of steps later
            if max_env_steps and stats.env_steps >= max_env_steps:
                break

    def _keep_reading(self) -> None:
        """While blocked on send: keep the learner's stream read."""
        self._take_newest_model()


    def role_stats(self) -> dict[str, Any]:
        frames = {} if self.compactor is None else {"frames_per_transition": round(
            self.compactor.frames / max(self.compactor.transitions, 1), 3), "compress": self.compactor.codec}
        return {"incarnation": self.incarnation, "sent_seq": self.seq,
                "explore": self.exploration.mean(self.loop.env_steps),
                **self.stats.as_dict(), **frames}

    def close(self) -> None:
        super().close()
        self.loop.close()


def run_actor(cfg: Config, index: int, proxy_addr: str, model_addr: str, run_dir: str | None = None,
              snapshot_addr: str | None = None) -> int:
    """The ``zmqrl actor`` entry point: models and control from ``model_addr`` (the learner's stream or its
    host's relay), snapshots from ``snapshot_addr``."""
    actor = serve(lambda: Actor(cfg, index, proxy_addr, model_addr, run_dir, snapshot_addr))
    s = actor.stats.as_dict()
    log.info("%s: stopped after %d env steps, %d batches (%d bytes), blocked %.1fs", actor.name,
             s["env_steps"], s["batches"], s["bytes_sent"], s["blocked_s"])
    return EXIT_CONFIG_MISMATCH if actor.refused else 1 if actor.gave_up else 0
