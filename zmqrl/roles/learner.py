"""Learner: owns replay and the agent; trains on what actors send and publishes versioned models.

Recipe: build replay and bookkeeping (shared with ``zmqrl train``), bind the data PULL, the
evaluation PULL and the model XPUB, then loop: every ``INGEST_INTERVAL_S`` read, decode and
validate what has arrived and move it into replay, optimise, update priorities, and every
``trainer.sync_interval`` steps publish the model with the next version. The latest model is
re-published when a subscriber appears and every ``net.republish_s`` seconds, so late joiners
never wait for the next sync.

Startup does not wait for torch (seconds to import on a small machine): for MLP Q-networks the
learner publishes model version 0 drawn with numpy, starts receiving and inserting into the
(numpy-only) replay at once, and imports torch and builds the agent in a background thread; the
agent adopts those same version-0 parameters, so every actor acts with the model the learner
trains. Optimisation starts once the agent is built and replay holds ``trainer.warmup``
transitions. Resuming, and other networks, build the agent first as before.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Generic, TypeVar

import numpy as np
import zmq

from zmqrl.acting import make_task
from zmqrl.bookkeeping import Bookkeeper, make_replay_from, prepare_run_dir, require_checkpoint, restore_replay
from zmqrl.checkpoint import write_json_atomic
from zmqrl.config import Config
from zmqrl.core import Agent
from zmqrl.lifecycle import StopFlag, seed_everything
from zmqrl.roles.common import Every, auth_counts, limits, new_context, options, read_json
from zmqrl.wire import (
    BATCH,
    EVAL,
    STATS,
    Message,
    RateLimitedLog,
    SequenceTracker,
    SocketOptions,
    WireError,
    bound_address,
    check_batch,
    decode,
    encode_model,
    make_socket,
    new_incarnation,
    send_frames,
)
from zmqrl.wire.monitor import LinkMonitor

log = logging.getLogger("zmqrl")

FIRST_BATCH_FILE = "first_batch.json"  # in the run directory, written once the first batch is in replay
INGEST_INTERVAL_S = 0.05  # while training, read and insert what arrived this often (bursts amortise costs)
GROUP_BYTES = 1 << 20  # join batches into one replay.add up to this size (beyond it the copy costs more)
T = TypeVar("T")


def _groups(batches: list[Message]) -> list[list[Message]]:
    """Runs of consecutive batches that can be joined: same fields, dtypes and item shapes, small."""
    groups: list[list[Message]] = []
    last: tuple[Any, ...] | None = None
    size = 0
    for msg in batches:
        sig = tuple((k, a.dtype, a.shape[1:]) for k, a in msg.arrays.items())
        if groups and sig == last and size + msg.nbytes <= GROUP_BYTES:
            groups[-1].append(msg)
            size += msg.nbytes
        else:
            groups.append([msg])
            last, size = sig, msg.nbytes
    return groups


def _number(meta: dict[str, Any], key: str, default: float = 0.0) -> float:
    value = meta.get(key, default)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else default


def _episodes(meta: dict[str, Any]) -> tuple[list[float], list[int]]:
    """Episode returns and lengths carried in a batch's meta, ignoring anything malformed."""
    ep = meta.get("episodes")
    if not isinstance(ep, dict):
        return [], []
    returns, lengths = ep.get("returns"), ep.get("lengths")
    if not (isinstance(returns, list) and isinstance(lengths, list) and len(returns) == len(lengths)):
        return [], []
    if not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in returns + lengths):
        return [], []
    return [float(r) for r in returns], [int(n) for n in lengths]


class Background(threading.Thread, Generic[T]):
    """Runs one function in a daemon thread and keeps its result or the exception it raised."""

    def __init__(self, fn: Callable[[], T], name: str) -> None:
        super().__init__(name=name, daemon=True)
        self.fn = fn
        self.result: T | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.result = self.fn()
        except BaseException as exc:  # handed to the thread that asks for the result
            self.error = exc

    def get(self) -> T:
        """The result once the thread has finished (call after ``join``); re-raises its exception."""
        if self.error is not None:
            raise self.error
        assert self.result is not None
        return self.result


class Receiver:
    """Reads, decodes and validates what has arrived on the data and evaluation sockets.

    It runs on the optimisation thread, between steps, a burst of messages at a time. ZeroMQ's
    own I/O thread already receives in the background without the GIL; a Python receiver
    thread took the GIL at every message and stalled the optimiser's many short torch calls
    (on two busy cores the learner kept ~0.7 of its idle step rate while ingesting 4 actors'
    batches with one, ~0.95 without; ``zmqrl bench --only learner``). Back-pressure is as
    before: while the learner is not reading, ZeroMQ's bounded queues (``rcvhwm``) fill and the
    senders block, so memory stays bounded everywhere.
    """

    def __init__(self, data: zmq.Socket, evals: zmq.Socket, cfg: Config) -> None:
        self.data, self.evals = data, evals
        self.data_limits = limits(cfg.net, BATCH, STATS)
        self.eval_limits = limits(cfg.net, EVAL)
        self.poller = zmq.Poller()
        self.poller.register(data, zmq.POLLIN)
        self.poller.register(evals, zmq.POLLIN)
        self.rejected: collections.Counter[str] = collections.Counter()
        self.bytes = 0
        self.ratelog = RateLimitedLog(log, interval=10.0)

    def receive(self, timeout: float = 0.0, max_messages: int = 256) -> list[Message]:
        """Valid messages that have arrived (at most ``max_messages`` read), waiting up to ``timeout`` s."""
        ready = dict(self.poller.poll(int(timeout * 1000)))
        messages: list[Message] = []
        if self.evals in ready:
            messages += self._read(self.evals, self.eval_limits, "eval", max_messages)
        if self.data in ready:
            messages += self._read(self.data, self.data_limits, "data", max_messages)
        return messages

    def drain(self, seconds: float) -> list[Message]:
        """At shutdown: what is still queued on the data socket, read for at most ``seconds``."""
        messages: list[Message] = []
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            burst = self._read(self.data, self.data_limits, "data", 256)
            if not burst and not self.data.poll(0, zmq.POLLIN):
                break
            messages += burst
        return messages

    def _read(self, sock: zmq.Socket, lim: Any, where: str, max_messages: int) -> list[Message]:
        messages = []
        for _ in range(max_messages):
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                break
            msg = self._decode(frames, lim, where)
            if msg is not None:
                messages.append(msg)
        return messages

    def _decode(self, frames: list[Any], lim: Any, where: str) -> Message | None:
        try:
            msg = decode(frames, lim)
            if msg.kind == BATCH:
                check_batch(msg)
        except WireError as exc:
            self.rejected[exc.reason] += 1
            self.ratelog.warn(f"bad-{where}-{exc.reason}", f"learner: dropped a bad message on the {where} "
                                                           f"socket: {exc}")
            return None
        self.bytes += msg.nbytes
        return msg


class Learner:
    """One learner process."""

    def __init__(self, cfg: Config, run_dir: str | Path | None, bind_data: str, bind_model: str,
                 bind_eval: str, resume: bool = False) -> None:
        self.started = time.monotonic()
        self.cfg = cfg
        seed_everything(cfg.run.seed)
        self.task = make_task(cfg)
        require_checkpoint(run_dir or cfg.run.run_dir, resume)
        self.dir = prepare_run_dir(cfg, run_dir)
        self.spec = self.task.batch_spec()
        self.replay = make_replay_from(cfg, self.spec)
        self.book = Bookkeeper(cfg, self.dir, None, extra_state=lambda: {"replay": self.replay.state_dict()},
                               replay=self.replay)
        self._initial = None if resume else self.task.initial_params()
        self._agent: Agent | None = None
        self._builder: Background[Agent] = Background(self._build_agent, name="agent-builder")
        self._deferred: list[Message] = []  # evaluation reports that came before the agent
        if self._initial is None:  # build (and resume) before binding anything, as errors belong here
            self._builder.run()
            self._adopt(self._builder.get())
            if resume:
                state = self.book.restore("latest")
                restore_replay(self.book, self.replay, state)
                log.info("learner: resumed from %s at opt step %d, model version %d, %d transitions in replay",
                         self.dir / "checkpoints/latest", self.book.opt_steps, self.book.version, len(self.replay))
        self.incarnation = new_incarnation()

        self.ctx = new_context(cfg.net)
        net = cfg.net
        self.data = make_socket(self.ctx, zmq.PULL, options(net, SocketOptions.pull(limits(net, BATCH, STATS),
                                                                                     rcvhwm=64), data_path=True),
                                 bind=bind_data)
        self.evals = make_socket(self.ctx, zmq.PULL, options(net, SocketOptions.pull(limits(net, EVAL))),
                                 bind=bind_eval)
        self.pub = make_socket(self.ctx, zmq.XPUB, options(net, SocketOptions.pub()), bind=bind_model)
        self.pub.setsockopt(zmq.XPUB_VERBOSE, 1)
        self.endpoints = {"data": bound_address(self.data), "model": bound_address(self.pub),
                          "eval": bound_address(self.evals)}
        self._write_endpoints()
        self.links = [LinkMonitor(self.pub, "learner", f"model subscribers on {self.endpoints['model']}"),
                      LinkMonitor(self.data, "learner", f"data peers on {self.endpoints['data']}")]
        self.receiver = Receiver(self.data, self.evals, cfg)

        self.sequences = SequenceTracker()
        self.inserted = 0
        self.batches = 0
        self.per_actor: dict[str, dict[str, Any]] = {}
        self.proxies: dict[str, dict[str, Any]] = {}
        self.actor_steps: dict[tuple[str, str], int] = {}
        self.lags: collections.deque[int] = collections.deque(maxlen=10_000)
        self.lag_counts: collections.Counter[int] = collections.Counter()
        self.other_line_batches = 0
        self.published = 0
        self.schema_rejected = 0
        self.ratelog = RateLimitedLog(log, interval=10.0)
        self._last_params: list[Any] | None = None
        self.pause = False
        self.pauses = 0
        self.first_batch_s: float | None = None
        if self._agent is None:
            self._builder.start()
            log.info("learner: sockets bound after %.1fs; building the agent in the background",
                     time.monotonic() - self.started)

    # --- the agent ----------------------------------------------------------------------------
    def _build_agent(self) -> Agent:
        """Import torch, build the agent (adopting the published version-0 parameters) and open TensorBoard."""
        import torch

        from zmqrl.agents.torch_util import resolve_device

        torch.set_num_threads(1)
        torch.manual_seed(self.cfg.run.seed)
        agent = self.task.agent(device=resolve_device(self.cfg.run.device), seed=self.cfg.run.seed)
        if self._initial is not None:
            agent.adopt_initial(self._initial)
        self.book.open_recorder()
        return agent

    def _adopt(self, agent: Agent) -> None:
        import torch

        torch.set_num_threads(1)  # (a per-thread setting in some builds: this is the thread that trains)
        self._agent = agent
        self.book.agent = agent
        log.info("learner: ready in %.1fs", time.monotonic() - self.started)

    def agent_ready(self, block: bool = False) -> bool:
        """Whether the agent is built (adopting it when the builder has just finished); ``block`` waits."""
        if self._agent is not None:
            return True
        if block:
            self._builder.join()
        elif self._builder.is_alive():
            return False
        self._adopt(self._builder.get())
        deferred, self._deferred = self._deferred, []
        self._dispatch(deferred)
        return True

    @property
    def agent(self) -> Agent:
        """The agent, waiting for the background build if it is still under way."""
        self.agent_ready(block=True)
        assert self._agent is not None
        return self._agent

    def _write_endpoints(self) -> None:
        path = self.dir / "endpoints.json"
        data = read_json(path) or {}
        data["learner"] = self.endpoints
        write_json_atomic(path, data)

    # --- models out ---------------------------------------------------------------------------
    def publish(self, new_version: bool, refresh: bool = False) -> None:
        """Send the current model; with ``new_version`` it first gets the next version number.

        The meta carries ``pause``: the rate limiter's request that actors stop stepping while
        samples per insert is below ``trainer.min_samples_per_insert``.
        """
        if new_version or refresh or self._last_params is None:
            if new_version:
                self.book.version += 1
            params = self._initial if self._agent is None and self._initial is not None else self.agent.params()
            self._last_params = encode_model("learner", self.incarnation, self.book.version, params,
                                             meta={"opt_steps": self.book.opt_steps, "pause": self.pause})
        try:
            send_frames(self.pub, self._last_params, flags=zmq.NOBLOCK)
            self.published += 1
        except zmq.Again:
            pass  # PUB drops by design; the next version supersedes this one

    def _new_subscribers(self) -> bool:
        """True when a subscriber joined since the last look (XPUB subscription messages)."""
        joined = False
        while self.pub.poll(0, zmq.POLLIN):  # checked every loop: no zmq.Again raised in the common case
            event = self.pub.recv(zmq.NOBLOCK)
            joined |= bool(event) and event[0] == 1
        return joined

    # --- data in ------------------------------------------------------------------------------
    def ingest(self, timeout: float = 0.0, max_messages: int = 256) -> int:
        """Move what has arrived (up to ``max_messages`` messages) into replay; returns transitions inserted."""
        return self._dispatch(self.receiver.receive(timeout, max_messages))

    def _dispatch(self, messages: list[Message]) -> int:
        """Handle received messages: batches go into replay together, in as few ``add`` calls as
        possible (each call has a fixed cost several times that of copying a small batch)."""
        batches = []
        for msg in messages:
            if msg.kind == BATCH:
                if self._in_sequence(msg):
                    batches.append(msg)
            elif msg.kind == STATS:
                self.proxies[msg.sender] = msg.meta
            elif msg.kind == EVAL:
                if self._agent is None:
                    self._deferred.append(msg)  # recording it opens TensorBoard: that waits for torch
                else:
                    self._evaluation(msg)
        return sum(self._account(msg) for msg in self._add_to_replay(batches))

    def _actor(self, sender: str) -> dict[str, Any]:
        return self.per_actor.setdefault(sender, {"batches": 0, "transitions": 0, "lost": 0, "dropped_old": 0,
                                                  "incarnations": 0, "lag_sum": 0})

    def _in_sequence(self, msg: Message) -> bool:
        """Sequence check per sender incarnation: counts lost batches; False for a repeat or an older one."""
        accept, lost = self.sequences.observe(msg.sender, msg.incarnation, msg.seq)
        actor = self._actor(msg.sender)
        actor["lost"] += lost
        if not accept:
            actor["dropped_old"] += 1
        return accept

    def _add_to_replay(self, batches: list[Message]) -> list[Message]:
        """Insert the batches into replay, in order; returns those that went in.

        Consecutive small batches with the same fields are joined into one ``add``; where that
        fails, each goes in on its own, so only a batch that does not fit is rejected.
        """
        added: list[Message] = []
        for group in _groups(batches):
            if len(group) > 1:
                arrays = {k: np.concatenate([m.arrays[k] for m in group]) for k in group[0].arrays}
                if self._add(arrays, None):
                    added += group
                    continue
            added += [m for m in group if self._add(m.arrays, m.sender)]
        return added

    def _add(self, arrays: dict[str, np.ndarray], sender: str | None) -> bool:
        """One ``replay.add``; a batch (``sender`` given) that does not fit is counted and logged."""
        arrays = dict(arrays)
        priorities = arrays.pop("priority", None)
        try:
            self.replay.add(arrays, priorities=priorities)
        except (ValueError, IndexError) as exc:
            if sender is not None:
                self.schema_rejected += 1
                self.ratelog.warn(f"schema-{sender}", f"learner: batch from {sender} does not fit replay: {exc}")
            return False
        return True

    def _account(self, msg: Message) -> int:
        """Counters, episodes, policy lag and actor stats of a batch now in replay; returns its length."""
        n = len(msg.arrays["reward"]) if "reward" in msg.arrays else len(next(iter(msg.arrays.values())))
        self.inserted += n
        self.batches += 1
        if self.first_batch_s is None:
            self._first_batch(msg.sender, n)
        meta, actor = msg.meta, self._actor(msg.sender)
        key = (msg.sender, msg.incarnation)
        if key not in self.actor_steps:
            actor["incarnations"] += 1
            self.actor_steps[key] = 0
        raw = meta.get("stats")
        stats: dict[str, Any] = raw if isinstance(raw, dict) else {}
        steps = int(_number(stats, "env_steps"))
        self.book.add_env_steps(max(0, steps - self.actor_steps[key]))
        self.actor_steps[key] = max(steps, self.actor_steps[key])
        self.book.add_episodes(*_episodes(meta))
        if meta.get("model_inc") == self.incarnation and msg.version >= 0:
            lag = self.book.version - msg.version
            self.lags.append(lag)
            self.lag_counts[lag] += 1
            actor["lag_sum"] += lag
        else:
            self.other_line_batches += 1
        actor["batches"] += 1
        actor["transitions"] += n
        actor["incarnation"] = msg.incarnation
        for k in ("env_steps", "episodes", "blocked_s", "paused_s", "model_updates", "env_steps_per_s"):
            if k in stats:
                actor[k] = _number(stats, k)
        actor["explore"] = _number(meta, "explore")
        return n

    def _first_batch(self, sender: str, n: int) -> None:
        """Note the first batch in replay, in the log and (atomically) in ``RUN_DIR/first_batch.json``."""
        self.first_batch_s = time.monotonic() - self.started
        write_json_atomic(self.dir / FIRST_BATCH_FILE, {
            "first_batch_s": self.first_batch_s, "time": time.time(), "sender": sender, "transitions": n,
            "replay_size": len(self.replay), "agent_ready": self._agent is not None})
        log.info("learner: first batch from %s after %.2fs", sender, self.first_batch_s)

    def _evaluation(self, msg: Message) -> None:
        returns, lengths = _episodes({"episodes": msg.meta})
        if not returns:
            self.receiver.rejected["eval_meta"] += 1
            return
        self.book.evaluation(returns, lengths, version=msg.version, save_best=False)

    # --- stats --------------------------------------------------------------------------------
    def lag_stats(self) -> dict[str, float]:
        if not self.lags:
            return {}
        lags = np.fromiter(self.lags, dtype=np.int64)
        return {"mean": float(lags.mean()), "p50": float(np.percentile(lags, 50)),
                "p90": float(np.percentile(lags, 90)), "max": int(lags.max())}

    def samples_per_insert(self) -> float:
        return self.book.opt_steps * self.cfg.agent.batch_size / max(self.inserted, 1)

    def perf(self) -> dict[str, float]:
        values = {"perf/replay_size": float(len(self.replay)),
                  "perf/samples_per_insert": self.samples_per_insert(),
                  "perf/bytes_received": float(self.receiver.bytes),
                  "perf/rejected": float(self.rejected_total()), "perf/model_version": float(self.book.version)}
        values.update({f"perf/policy_lag_{k}": v for k, v in self.lag_stats().items()})
        for name, actor in self.per_actor.items():
            if "env_steps_per_s" in actor:
                values[f"actors/{name}/env_steps_per_s"] = actor["env_steps_per_s"]
            values[f"actors/{name}/lost"] = float(actor["lost"])
        for name, proxy in self.proxies.items():
            values[f"proxies/{name}/forwarded"] = _number(proxy, "forwarded")
            values[f"proxies/{name}/bytes_per_s"] = _number(proxy, "bytes_per_s")
        if self.lags:
            self.book.recorder.histogram(self.book.opt_steps, "perf/policy_lag", np.fromiter(self.lags, np.int64))
        return values

    def rejected_total(self) -> int:
        return sum(self.receiver.rejected.values()) + self.schema_rejected

    def summary_extra(self) -> dict[str, Any]:
        per_actor = {}
        for name, a in self.per_actor.items():
            per_actor[name] = {**a, "lag_mean": a["lag_sum"] / max(a["batches"], 1)}
        return {
            "role": "learner", "endpoints": self.endpoints, "replay_size": len(self.replay),
            "transitions_inserted": self.inserted, "samples_per_insert": self.samples_per_insert(),
            "bytes_received": self.receiver.bytes, "models_published": self.published,
            "rate_limiter_pauses": self.pauses, "first_batch_s": self.first_batch_s,
            "policy_lag": {**self.lag_stats(), "histogram": {str(k): v for k, v in sorted(self.lag_counts.items())},
                           "other_line_batches": self.other_line_batches},
            "messages": {"batches_received": self.batches,
                         "batches_lost": sum(a["lost"] for a in self.per_actor.values()),
                         "batches_dropped_old": sum(a["dropped_old"] for a in self.per_actor.values()),
                         "rejected": {**dict(self.receiver.rejected), "schema": self.schema_rejected},
                         "rejected_total": self.rejected_total()},
            "actors": per_actor, "proxies": self.proxies, "auth": auth_counts(self.ctx),
        }

    # --- the loop -----------------------------------------------------------------------------
    def run(self, stop: StopFlag) -> dict[str, Any]:
        """Train until stopped or done; returns the summary. Sockets are closed however it ends."""
        log.info("learner: data on %s, models on %s, evaluations on %s; run dir %s", self.endpoints["data"],
                 self.endpoints["model"], self.endpoints["eval"], self.dir)
        self.publish(new_version=False)
        try:
            return self._loop(stop)
        except BaseException:
            self._close()
            raise

    def _loop(self, stop: StopFlag) -> dict[str, Any]:
        cfg, tc, batch_size = self.cfg, self.cfg.trainer, self.cfg.agent.batch_size
        republish, summarise = Every(cfg.net.republish_s), Every(max(cfg.net.stats_interval_s, 0.5))
        waiting_log, watch_links, ingest_due = Every(10.0), Every(0.25), Every(INGEST_INTERVAL_S)
        while not stop.set and not self.book.should_stop():
            if self._new_subscribers() or republish():
                self.publish(new_version=False)
            if summarise():
                self.book.write_summary(self.summary_extra())
            if watch_links():
                for link in self.links:
                    link.poll()
            ready, warm = self.agent_ready(), len(self.replay) >= tc.warmup
            starving = not (warm and ready)
            spi = self.samples_per_insert()
            throttled = tc.max_samples_per_insert > 0 and spi > tc.max_samples_per_insert
            if starving or throttled:
                self.ingest(timeout=0.1)
            elif ingest_due():
                self.ingest()
            # Warm but the agent still loading also counts (0 samples per insert): actors need not
            # fill replay with data nobody trains on, and their CPU is better spent loading torch.
            pause = warm and tc.min_samples_per_insert > 0 and spi < tc.min_samples_per_insert
            if pause != self.pause:  # tell actors at once, not at the next sync
                self.pause = pause
                self.pauses += pause
                self.publish(new_version=False, refresh=True)
            if starving:
                if waiting_log():
                    log.info("learner: %d/%d warm-up transitions in replay; waiting for %s", len(self.replay),
                             tc.warmup, "actors" if ready else "the agent (torch loading) and actors")
                continue
            if throttled:
                continue
            batch = self.replay.sample(batch_size)
            metrics, priorities = self.agent.update(batch)
            if priorities is not None:
                self.replay.update_priorities(batch["indices"], priorities)
            self.book.opt_step(metrics, perf=self.perf)
            if self.book.opt_steps % tc.sync_interval == 0:
                self.publish(new_version=True)
        if stop.set:
            self.book.stop_reason = f"stopped by {stop.signal_name or 'signal'}"
        return self.finish()

    def finish(self) -> dict[str, Any]:
        self._dispatch(self.receiver.drain(seconds=1.0))  # account for what peers already sent
        self.agent_ready(block=True)  # the final checkpoint needs the agent
        summary = self.book.finish(self.summary_extra())
        print_end_table(summary)
        self._close()
        return summary

    def _close(self) -> None:
        if self.ctx.closed:
            return
        for link in self.links:
            link.close()
        for sock in (self.data, self.evals, self.pub):
            sock.close(linger=0)
        self.ctx.term()


def print_end_table(summary: dict[str, Any]) -> None:
    """border's ``AsyncTrainStat`` and per-actor ``ActorStat`` as a table in the log."""
    lag = summary.get("policy_lag", {})
    msgs = summary.get("messages", {})
    lines = [
        f"{'stop reason':<22}{summary['stop_reason']}",
        f"{'wall time':<22}{summary['wall_s']:.1f} s",
        f"{'opt steps':<22}{summary['opt_steps']} ({summary['opt_steps_per_s']:.0f}/s)",
        f"{'env steps':<22}{summary['env_steps']} ({summary['env_steps_per_s']:.0f}/s)",
        f"{'samples/s':<22}{summary['samples_per_s']:.0f} (per insert {summary.get('samples_per_insert', 0):.2f})",
        f"{'model version':<22}{summary['model_version']}",
        f"{'policy lag':<22}mean {lag.get('mean', float('nan')):.1f}, p90 {lag.get('p90', float('nan')):.0f}, "
        f"max {lag.get('max', '-')}",
        f"{'batches':<22}received {msgs.get('batches_received', 0)}, lost {msgs.get('batches_lost', 0)}, "
        f"rejected {msgs.get('rejected_total', 0)}",
        f"{'best eval return':<22}{summary['best_eval_return']}",
    ]
    header = f"{'actor':<12}{'env steps':>11}{'steps/s':>9}{'batches':>9}{'lost':>6}{'lag':>7}{'blocked s':>11}"
    rows = [f"{name:<12}{int(a.get('env_steps', 0)):>11}{a.get('env_steps_per_s', 0):>9.0f}{a['batches']:>9}"
            f"{a['lost']:>6}{a['lag_mean']:>7.1f}{a.get('blocked_s', 0):>11.1f}"
            for name, a in sorted(summary.get("actors", {}).items())]
    log.info("learner summary\n%s\n%s\n%s", "\n".join(lines), header, "\n".join(rows))


def run_learner(cfg: Config, run_dir: str | None, bind_data: str, bind_model: str, bind_eval: str,
                resume: bool = False) -> int:
    """The ``zmqrl learner`` entry point."""
    with StopFlag() as stop:
        learner = Learner(cfg, run_dir, bind_data, bind_model, bind_eval, resume)
        learner.run(stop)
    return 0
