"""Learner: owns replay and the agent; trains on what actors send and publishes versioned models.

Recipe: build the agent, replay and bookkeeping (shared with ``zmqrl train``), bind the data
PULL, the evaluation PULL and the model XPUB, start a receiver thread that decodes and
validates messages into a bounded inbox, then loop: move what arrived into replay, optimise,
update priorities, and every ``trainer.sync_interval`` steps publish the model with the next
version. The latest model is re-published when a subscriber appears and every
``net.republish_s`` seconds, so late joiners never wait for the next sync.
"""

from __future__ import annotations

import collections
import logging
import queue
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import zmq

from zmqrl.agents import make_agent, resolve_device
from zmqrl.bookkeeping import Bookkeeper, prepare_run_dir
from zmqrl.checkpoint import write_json_atomic
from zmqrl.config import Config
from zmqrl.envs import check_env, spaces
from zmqrl.lifecycle import StopFlag, seed_everything
from zmqrl.roles.common import Every, auth_counts, limits, new_context, options, read_json
from zmqrl.train import make_replay_from, require_checkpoint, restore_replay
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


class Receiver(threading.Thread):
    """Receives, decodes and validates messages off the optimisation thread, into a bounded inbox.

    The inbox is bounded: when the learner falls behind, the receiver stops reading, ZeroMQ's
    queues fill, and back-pressure reaches the actors. Memory stays bounded everywhere.
    """

    def __init__(self, data: zmq.Socket, evals: zmq.Socket, cfg: Config, inbox_size: int = 256) -> None:
        super().__init__(name="receiver", daemon=True)
        self.data, self.evals = data, evals
        self.data_limits = limits(cfg.net, BATCH, STATS)
        self.eval_limits = limits(cfg.net, EVAL)
        self.inbox: queue.Queue[Message] = queue.Queue(maxsize=inbox_size)
        self.rejected: collections.Counter[str] = collections.Counter()
        self.bytes = 0
        self.stopping = threading.Event()
        self.ratelog = RateLimitedLog(log, interval=10.0)

    def run(self) -> None:
        poller = zmq.Poller()
        poller.register(self.data, zmq.POLLIN)
        poller.register(self.evals, zmq.POLLIN)
        while not self.stopping.is_set():
            for sock, _ in poller.poll(100):
                lim = self.data_limits if sock is self.data else self.eval_limits
                for _ in range(256):
                    try:
                        frames = sock.recv_multipart(zmq.NOBLOCK, copy=False)
                    except zmq.Again:
                        break
                    self._accept(frames, lim, "data" if sock is self.data else "eval")
                    if self.stopping.is_set():
                        return

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

    def _accept(self, frames: list[Any], lim: Any, where: str) -> None:
        msg = self._decode(frames, lim, where)
        while msg is not None and not self.stopping.is_set():
            try:
                self.inbox.put(msg, timeout=0.1)
                return
            except queue.Full:
                continue

    def stop(self) -> None:
        self.stopping.set()
        self.join(timeout=5)

    def drain(self, seconds: float) -> list[Message]:
        """After :meth:`stop`: what is still queued on the data socket, read for at most ``seconds``."""
        messages: list[Message] = []
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            try:
                frames = self.data.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                break
            msg = self._decode(frames, self.data_limits, "data")
            if msg is not None:
                messages.append(msg)
        return messages


class Learner:
    """One learner process."""

    def __init__(self, cfg: Config, run_dir: str | Path | None, bind_data: str, bind_model: str,
                 bind_eval: str, resume: bool = False) -> None:
        torch.set_num_threads(1)
        self.started = time.monotonic()
        self.cfg = cfg
        seed_everything(cfg.run.seed)
        check_env(cfg.env)
        self.device = resolve_device(cfg.run.device)
        require_checkpoint(run_dir or cfg.run.run_dir, resume)
        self.dir = prepare_run_dir(cfg, run_dir)
        obs_space, act_space = spaces(cfg.env)
        self.agent = make_agent(cfg.agent, obs_space, act_space, device=self.device, seed=cfg.run.seed)
        self.replay = make_replay_from(cfg)
        self.book = Bookkeeper(cfg, self.dir, self.agent, extra_state=lambda: {"replay": self.replay.state_dict()},
                               replay=self.replay)
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
            self._last_params = encode_model("learner", self.incarnation, self.book.version, self.agent.params(),
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
    def ingest(self, timeout: float = 0.0, max_messages: int = 64) -> int:
        """Move up to ``max_messages`` received messages into replay; returns transitions inserted."""
        inserted = 0
        for i in range(max_messages):
            try:
                msg = self.receiver.inbox.get(timeout=timeout) if i == 0 and timeout else \
                    self.receiver.inbox.get_nowait()
            except queue.Empty:
                break
            inserted += self._dispatch(msg)
        return inserted

    def _dispatch(self, msg: Message) -> int:
        if msg.kind == BATCH:
            return self._insert(msg)
        if msg.kind == STATS:
            self.proxies[msg.sender] = msg.meta
        elif msg.kind == EVAL:
            self._evaluation(msg)
        return 0

    def _insert(self, msg: Message) -> int:
        accept, lost = self.sequences.observe(msg.sender, msg.incarnation, msg.seq)
        actor = self.per_actor.setdefault(msg.sender, {"batches": 0, "transitions": 0, "lost": 0,
                                                       "dropped_old": 0, "incarnations": 0, "lag_sum": 0})
        actor["lost"] += lost
        if not accept:
            actor["dropped_old"] += 1
            return 0
        arrays = dict(msg.arrays)
        priorities = arrays.pop("priority", None)
        try:
            self.replay.add(arrays, priorities=priorities)
        except (ValueError, IndexError) as exc:
            self.schema_rejected += 1
            self.ratelog.warn(f"schema-{msg.sender}", f"learner: batch from {msg.sender} does not fit replay: {exc}")
            return 0
        n = len(arrays["reward"])
        self.inserted += n
        self.batches += 1
        if self.first_batch_s is None:
            self.first_batch_s = time.monotonic() - self.started
            log.info("learner: first batch from %s after %.2fs", msg.sender, self.first_batch_s)
        meta = msg.meta
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
        actor["epsilon"] = _number(meta, "epsilon")
        return n

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
        values = {"perf/replay_size": float(len(self.replay)), "perf/inbox_depth": float(self.receiver.inbox.qsize()),
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
        cfg, tc, batch_size = self.cfg, self.cfg.trainer, self.cfg.agent.batch_size
        log.info("learner: data on %s, models on %s, evaluations on %s; run dir %s", self.endpoints["data"],
                 self.endpoints["model"], self.endpoints["eval"], self.dir)
        self.receiver.start()
        self.publish(new_version=False)
        republish, summarise = Every(cfg.net.republish_s), Every(max(cfg.net.stats_interval_s, 0.5))
        waiting_log, watch_links = Every(10.0), Every(0.25)
        while not stop.set and not self.book.should_stop():
            if self._new_subscribers() or republish():
                self.publish(new_version=False)
            if summarise():
                self.book.write_summary(self.summary_extra())
            if watch_links():
                for link in self.links:
                    link.poll()
            starving = len(self.replay) < tc.warmup
            spi = self.samples_per_insert()
            throttled = tc.max_samples_per_insert > 0 and spi > tc.max_samples_per_insert
            self.ingest(timeout=0.1 if (starving or throttled) else 0.0)
            pause = not starving and tc.min_samples_per_insert > 0 and spi < tc.min_samples_per_insert
            if pause != self.pause:  # tell actors at once, not at the next sync
                self.pause = pause
                self.pauses += pause
                self.publish(new_version=False, refresh=True)
            if starving:
                if waiting_log():
                    log.info("learner: %d/%d warm-up transitions in replay; waiting for actors", len(self.replay),
                             tc.warmup)
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
        self.receiver.stop()
        self.ingest(max_messages=self.receiver.inbox.qsize())
        for msg in self.receiver.drain(seconds=1.0):  # account for what peers already sent
            self._dispatch(msg)
        summary = self.book.finish(self.summary_extra())
        print_end_table(summary)
        for link in self.links:
            link.close()
        for sock in (self.data, self.evals, self.pub):
            sock.close(linger=0)
        self.ctx.term()
        return summary


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
    started = time.monotonic()
    with StopFlag() as stop:
        learner = Learner(cfg, run_dir, bind_data, bind_model, bind_eval, resume)
        log.info("learner: ready in %.1fs", time.monotonic() - started)
        learner.run(stop)
    return 0
