"""Learner: owns replay and the agent; trains on what actors send and publishes versioned models.

Recipe: build replay and bookkeeping (shared with ``zmqrl train``), bind the data PULL, the
evaluation PULL and the XPUB of its stream, start the intake and the publisher beside the loop,
then loop: insert the ready work the intake hands over, sample, optimise, write priorities one
step late, and every ``trainer.sync_interval`` steps hand the publisher the model with the next
version; stop, and tell every role the run is over.

The learner is three parts, each in its own module, and a message goes through them forward only:

* the **intake** (:mod:`~zmqrl.roles.intake`, a thread): receives, decodes, checks and accounts
  for what arrives (sequences, allowances, evaluation admission) and hands ready batches and
  evaluations to the loop through a bounded queue;
* the **loop** (here): inserts that work between steps (:mod:`~zmqrl.roles.inserts`), counts it
  (:mod:`~zmqrl.roles.peers`), trains, and decides what every role is asked (the rate limiter of
  :mod:`~zmqrl.roles.ratelimit`); it never waits on a socket;
* the **publisher** (:mod:`~zmqrl.roles.publisher`, a thread): sends a model only with a new
  version, to new subscribers and every ``net.republish_s``; control (pause, allowance and grant,
  quota, done) in messages of a few hundred bytes of its own.

A step's results are read one step late: the loop samples batch k+1, then writes step k's
priorities and counts it, then queues step k+1 (:class:`~zmqrl.core.DefersUpdates`), so on CUDA the
device runs a step while the host samples the next batch instead of waiting for it. Each step's
priorities reach replay exactly once, in order; items that new batches took the place of since
the step's batch was sampled keep their own (``sampled_at``), so inserts land between steps with a
step pending. The pending step is settled first wherever the agent or replay is read as a whole:
before a model is made, before the summary, before the waits of a learner starved or throttled,
at the end, and before the sample that would follow a step whose count brings a checkpoint or
``max_opts`` (so a checkpoint's replay has drawn no batch its agent has not trained on).

Startup does not wait for torch (seconds to import on a small machine): where the algorithm can
draw its version-0 parameters with numpy, the learner publishes them, starts receiving and
inserting into the (numpy-only) replay at once, and imports torch and builds the agent in a
background thread; the agent adopts those same parameters, so every actor acts with the model
the learner trains. Optimisation starts once the agent is built and replay holds
``trainer.warmup`` transitions. Resuming, and other networks, build the agent first. Replay on the
learner's CUDA device (``replay.device``) is made of torch tensors: torch loads before it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import zmq

from zmqrl import __version__
from zmqrl.config import Config
from zmqrl.core import Agent, DefersUpdates, OnPolicyStore, PendingUpdate
from zmqrl.replay.prioritized import priority_counts
from zmqrl.roles.addresses import same_host
from zmqrl.roles.admission import EvalAdmission
from zmqrl.roles.fit import signature_digest, task_signature
from zmqrl.roles.inserts import ReplayWriter
from zmqrl.roles.intake import Arrived, Evaluation, Intake
from zmqrl.roles.net import PROXY_QUEUE, auth_counts, limits, options
from zmqrl.roles.peers import PeerAccounts
from zmqrl.roles.publisher import ControlState, Publisher
from zmqrl.roles.ratelimit import Allowances, SamplesPerInsert
from zmqrl.roles.skeleton import RoleProcess, serve
from zmqrl.roles.snapshots import SnapshotServer
from zmqrl.run.acting import make_task
from zmqrl.run.bookkeeping import Rate, replay_values
from zmqrl.run.lifecycle import Background, Every, StopFlag, seed_everything
from zmqrl.run.record import print_run_table
from zmqrl.run.rundir import FIRST_BATCH_FILE, FIRST_UPDATE_FILE, RunDir, read_json, restart_counts, write_json_atomic
from zmqrl.run.startup import open_run
from zmqrl.wire import BATCH, EVAL, HELLO, STATS, Message, SocketOptions, bound_address, encode_model

log = logging.getLogger("zmqrl")

REGRANT_S = 0.05  # while the learner waits for data (max_samples_per_insert), it grants actors more this often
TAKE_PER_STEP = 8  # ready batches inserted between two steps at most (the rest after the next step)
IDLE_WAIT_S = 0.1  # a learner with nothing to do waits this long at most for ready work


class Learner(RoleProcess):
    """One learner process."""

    def __init__(self, cfg: Config, run_dir: str | Path | None, bind_data: str, bind_model: str,
                 bind_eval: str, resume: bool = False, bind_snapshot: str | None = None) -> None:
        self.started = time.monotonic()
        self.cfg = cfg
        seed_everything(cfg.run.seed)
        self.task = make_task(cfg)
        self.spec = self.task.batch_spec()
        self.limiter = SamplesPerInsert(cfg.trainer, cfg.agent.batch_size)
        self._insert_rate = Rate()
        self._initial = None if resume else self.task.initial_params()
        self._agent: Agent | None = None
        self._update: Callable[[Mapping[str, np.ndarray]], PendingUpdate] | None = None  # the agent's, deferred
        # the step whose results are unread: its pending results, sampled indices and replay's count then
        self._pending: tuple[PendingUpdate, np.ndarray, int] | None = None
        self._builder: Background[Agent] = Background(self._build_agent, name="agent-builder")
        self._deferred: list[Evaluation] = []  # evaluations that came before the agent
        # The agent is built now (before anything is written or bound) to resume, or where the algorithm
        # cannot draw its version-0 parameters without torch; otherwise in the background.
        run = open_run(cfg, run_dir, self.spec, resume=resume,
                       agent=self._make_agent if self._initial is None else None,
                       restore=lambda point: self.limiter.load_state_dict(point.state.get("rate_limiter", {})),
                       extra_state=lambda: {"replay": self.replay.state_dict(),
                                            "rate_limiter": self.limiter.state_dict()}, label="learner")
        self.dir, self.replay, self.book = run.dir, run.replay, run.book
        self.rewards = run.rewards  # the factor on stored rewards at every update (zmqrl.run.rewards)
        self.rundir = RunDir(self.dir)
        if run.agent is not None:
            self._adopt(run.agent)
            self.book.open_recorder()
        super().__init__(cfg, "learner", self.dir)  # its context, sockets and close order
        net = cfg.net
        data_opts = options(net, SocketOptions.pull(limits(net, BATCH, STATS, HELLO), rcvhwm=64), data_path=True)
        self.data = self.socket(zmq.PULL, data_opts, bind=bind_data, link="data peers on {address}")
        # No heartbeats on sockets a peer can fill (the evaluations PULL, the XPUB's subscriptions): with
        # its queue full libzmq stops reading a connection, and a heartbeat on a connection the peer then
        # reset ends in libzmq's assertion !_io_error (zeromq/libzmq #4364). A peer's own heartbeats still
        # let it be dropped when it goes silent.
        self.evals = self.socket(zmq.PULL, options(net, SocketOptions.pull(limits(net, EVAL)), data_path=True),
                                 bind=bind_eval)
        self.pub = self.socket(zmq.XPUB, options(net, SocketOptions.pub(), data_path=True), bind=bind_model,
                               link="model subscribers on {address}")
        self.pub.setsockopt(zmq.XPUB_VERBOSE, 1)
        # joiners ask here for the newest control and model, which go to them alone (the Clone pattern)
        self.snap = self.socket(zmq.ROUTER, options(net, SocketOptions.snapshot_server(), data_path=True),
                                bind=bind_snapshot or same_host(bind_model, "*"))
        self.endpoints = {"data": bound_address(self.data), "model": bound_address(self.pub),
                          "eval": bound_address(self.evals), "snapshot": bound_address(self.snap)}
        self._write_endpoints()
        # batches made before the allowance came into force may still be queued on the way (an actor's,
        # its proxy's and this socket's queues): that much of each sender's unstamped data is taken
        in_flight = (cfg.actor.send_hwm + 2 * PROXY_QUEUE) * cfg.actor.n_buffer
        self.allowances = Allowances(net.max_peers, net.peer_idle_s, unstamped=in_flight)
        self.signature = task_signature(self.task)
        snapshots = SnapshotServer(self.snap, "learner", net.republish_s, burst=net.max_peers)
        self.publisher = Publisher(self.pub, self.incarnation, signature_digest(self.signature), self.allowances,
                                   net.republish_s, snapshots)
        self.intake = Intake(self.data, self.evals, cfg, self.spec, value_limits=self.task.value_limits(),
                             allowances=self.allowances, admission=EvalAdmission(cfg, self.dir),
                             incarnation=self.incarnation, now=self.book.point, published=lambda: self.book.version,
                             fingerprint=bool(getattr(self.replay, "frame_keys", ())),
                             batch_problem=self.task.batch_problem)
        # an on-policy algorithm's store (a FIFO of segments) keeps each one's model version, drops those too old
        # and pauses the actors while it is full
        self.on_policy = self.replay if isinstance(self.replay, OnPolicyStore) else None
        self.writer = ReplayWriter(self.replay, net.max_peers, net.peer_idle_s,
                                   frames_per_item=self.task.new_frames_per_item(),
                                   version_of=self._version_of if self.on_policy is not None else None)
        # env steps an actor has taken but not yet sent as items: its batch being filled, its adder's
        # windows, and the batches of one send (several go out together)
        per_item = self.task.env_steps_per_item()
        buffered = 4 * (cfg.actor.n_buffer * per_item + cfg.env.num_envs * self.task.env_steps_held())
        self.peers = PeerAccounts(net.max_peers, net.peer_idle_s, step_slack=buffered, steps_per_item=per_item)
        self.updates_skipped = 0  # optimisation steps not applied: their loss or gradients were not finite
        self.models_withheld = 0  # models not published: their parameters were not finite
        self.batches = 0
        self.first_batch_s: float | None = None
        self.first_update_s: float | None = None
        self._denormals_before: bool | None = None  # whether denormals were flushed before _first_update flushed them
        self._threads = False  # the intake and the publisher run (from run() on)
        if self._agent is None:
            self._builder.start()
            log.info("learner: sockets bound after %.1fs; building the agent in the background",
                     time.monotonic() - self.started)

    # --- the agent ----------------------------------------------------------------------------
    def _make_agent(self) -> Agent:
        """Import torch and build the agent, adopting the published version-0 parameters if any."""
        import torch

        from zmqrl.agents.torch_util import resolve_device

        torch.set_num_threads(self.cfg.run.torch_threads)
        torch.manual_seed(self.cfg.run.seed)
        agent = self.task.agent(device=resolve_device(self.cfg.run.device), seed=self.cfg.run.seed)
        if self._initial is not None:
            agent.adopt_initial(self._initial)
        return agent

    def _build_agent(self) -> Agent:
        """In the background while data comes in: the agent, and the TensorBoard writer opened."""
        agent = self._make_agent()
        self.book.open_recorder()
        return agent

    def _adopt(self, agent: Agent) -> None:
        import torch

        torch.set_num_threads(self.cfg.run.torch_threads)  # (per thread in some builds: this one trains)
        self._agent = agent
        self._update = deferred_update(agent)
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
        self._ask()  # without the quota: actors held by it go on
        deferred, self._deferred = self._deferred, []
        for evaluation in deferred:
            self._record(evaluation)
        return True

    @property
    def agent(self) -> Agent:
        """The agent, waiting for the background build if it is still under way."""
        self.agent_ready(block=True)
        assert self._agent is not None
        return self._agent

    def _write_endpoints(self) -> None:
        path = self.rundir.endpoints
        data = read_json(path) or {}
        data["learner"] = self.endpoints
        write_json_atomic(path, data)

    # --- what every role is asked, and models ------------------------------------------------
    def _ask(self, grant: bool = False) -> None:
        """Hand the publisher what every role is asked now (:class:`~zmqrl.roles.publisher.ControlState`):
        the rate limiter's pause; while the agent is still being built with the limiter on, a ``quota``
        (each actor makes at most ``trainer.warmup`` transitions until control without one comes:
        importing torch can stall this loop for a good part of a second, too late to ask for a pause);
        once it trains on a warm replay, the ``allowance`` each grant gives every actor
        (:meth:`SamplesPerInsert.allowance`), so a slow iteration of this loop cannot let actors run on
        unbounded before its pause goes out. ``grant``: a new grant even if nothing else changed."""
        quota = self.cfg.trainer.warmup if self._agent is None and self.limiter.min_ratio > 0 else None
        allowance = self.limiter.allowance() if quota is None else None
        self.publisher.post_control(ControlState(self.limiter.paused, allowance, quota,
                                                 reward_scale=self.rewards.factor), grant=grant)

    def publish(self, new_version: bool) -> None:
        """Hand the publisher the current model; with ``new_version`` it first gets the next version
        number (and every actor a new grant). A model whose parameters are not finite is withheld."""
        started = time.perf_counter()
        if self._pending is not None:
            new_version = self._resolve() or new_version  # the model after the pending step, with its count
        params = self._initial if self._agent is None and self._initial is not None else self.agent.params()
        bad = nonfinite_params(params)
        if bad:
            self.models_withheld += 1
            self.ratelog.warn("nonfinite-model", f"learner: not publishing the model of opt step "
                                                 f"{self.book.opt_steps}: {bad} holds non-finite values "
                                                 f"({self.models_withheld} withheld so far)")
        else:
            if new_version:
                self.book.version += 1
            meta = {"opt_steps": self.book.opt_steps, "env_steps": self.book.env_steps,
                    "wall_s": round(self.book.wall_s, 3), "task": self.signature, "zmqrl": __version__}
            frame = encode_model("learner", self.incarnation, self.book.version, params, meta=meta)[0]
            self.publisher.post_model(self.book.version, bytes(frame))
            self._ask(grant=new_version)
        self.book.cost.add("publish", time.perf_counter() - started)

    def _version_of(self, msg: Message) -> int:
        """The model version that acted for a batch, for an on-policy store: its oldest, where this learner's
        version line made it, else -1 (another learner's line: its versions mean nothing here; or a version
        this learner has not published, which no honest actor acted with)."""
        mine = msg.meta.get("model_inc") == self.incarnation and 0 <= msg.version <= self.book.version
        return msg.version if mine else -1

    # --- work in --------------------------------------------------------------------------------
    def _take_in(self, max_items: int | None = TAKE_PER_STEP) -> int:
        """Insert the ready batches the intake handed over (at most ``max_items``), record the admitted
        evaluations; returns the transitions inserted."""
        started = time.perf_counter()
        work = self.intake.handoff.take(max_items)
        if not work:
            return 0
        batches = [w for w in work if isinstance(w, Arrived)]
        if self.on_policy is not None and batches:
            self.on_policy.at_version(self.book.version)  # what a segment's version is measured against
        inserted = sum(self._account(item) for item in self.writer.insert(batches)) if batches else 0
        for w in work:
            if isinstance(w, Evaluation):
                if self._agent is None:
                    self._deferred.append(w)  # recording it opens TensorBoard: that waits for torch
                else:
                    self._record(w)
        self.book.cost.add("insert", time.perf_counter() - started)
        return inserted

    def ingest(self, timeout: float = 0.0) -> int:
        """Take in, on this thread, what has arrived within ``timeout`` seconds and insert it; returns
        the transitions inserted. For a learner whose threads are not running (one driven step by step)."""
        if self._threads:
            raise RuntimeError("Learner.ingest: the intake thread is running (use run)")
        self.intake.poll(timeout)
        inserted = 0
        while len(self.intake.handoff):
            inserted += self._take_in(None)
        return inserted

    def _account(self, item: Arrived) -> int:
        """Counters, episodes and env steps of a batch now in replay; returns its length."""
        msg, n = item.msg, item.rows
        self.limiter.inserted += n
        self.rewards.observe(msg.arrays)
        self.batches += 1
        if self.first_batch_s is None:
            self._first_batch(msg.sender, n)
        steps, returns, lengths = self.peers.account(msg, n, self.book.version, self.incarnation)
        self.book.add_env_steps(steps)
        self.book.add_episodes(returns, lengths)
        return n

    def _record(self, evaluation: Evaluation) -> None:
        self.book.evaluation(evaluation.returns, evaluation.lengths, version=evaluation.version, save_best=False,
                             at=evaluation.at)

    # --- optimisation steps -------------------------------------------------------------------
    def _steps_taken(self) -> int:
        """Optimisation steps taken: those counted and the one pending (its batch already sampled)."""
        return self.book.opt_steps + (self._pending is not None)

    def _resolve(self, save: bool = True) -> bool:
        """Read the pending step's results, if there is one: its priorities into replay, its metrics
        counted (``book.opt_step``: records, and with ``save`` the checkpoints that came due). Returns
        whether its count completes a ``trainer.sync_interval`` (a new version is due: the caller
        publishes it, :meth:`_settle`)."""
        if self._pending is None:
            return False
        pending, indices, sampled_at = self._pending
        self._pending = None
        t0 = time.perf_counter()
        metrics, priorities = pending.result()
        t1 = time.perf_counter()
        if metrics.get("skipped"):
            self._skipped_update()
        if priorities is not None:
            self.replay.update_priorities(indices, priorities, sampled_at=sampled_at)
        self.book.cost.add("wait", t1 - t0)  # the host waiting for the device to finish the step
        self.book.cost.add("priorities", time.perf_counter() - t1)
        self.book.opt_step(metrics, perf=self.perf, save=save)
        if self.first_update_s is None:
            self._first_update()
        return self.book.opt_steps % self.cfg.trainer.sync_interval == 0

    def _settle(self) -> None:
        """:meth:`_resolve` the pending step, and publish the new version its count may bring."""
        if self._resolve():
            self.publish(new_version=True)

    def _settle_first(self) -> bool:
        """Whether the pending step is settled before the next batch is drawn: its count brings a
        checkpoint (whose replay then has drawn no batch its agent has not trained on, so a resume
        goes on exactly) or ``max_opts`` (no batch is drawn beyond the last step)."""
        count = self.book.opt_steps + 1
        return count >= self.cfg.trainer.max_opts or self.book.save_due_at(count)

    def _skipped_update(self) -> None:
        """An optimisation step the agent did not apply (its loss or gradients were not finite): counted,
        logged at most once per interval."""
        self.updates_skipped += 1
        self.ratelog.warn("skipped-update", f"learner: optimisation step {self.book.opt_steps + 1} not applied: "
                                            f"its loss or gradients were not finite ({self.updates_skipped} so far)")

    def _first_batch(self, sender: str, n: int) -> None:
        """Note the first batch in replay, in the log and (atomically) in ``RUN_DIR/first_batch.json``."""
        self.first_batch_s = time.monotonic() - self.started
        write_json_atomic(self.dir / FIRST_BATCH_FILE, {
            "first_batch_s": self.first_batch_s, "time": time.time(), "sender": sender, "transitions": n,
            "replay_size": len(self.replay), "agent_ready": self._agent is not None})
        log.info("learner: first batch from %s after %.2fs", sender, self.first_batch_s)

    def _first_update(self) -> None:
        """Note the first optimisation step, in the log and (atomically) in ``RUN_DIR/first_update.json``;
        from here on this thread trains, so it flushes denormal floats (restored when ``run`` returns)."""
        from zmqrl.agents.torch_util import flush_denormals

        self._denormals_before = flush_denormals()
        self.first_update_s = time.monotonic() - self.started
        write_json_atomic(self.dir / FIRST_UPDATE_FILE, {
            "first_update_s": self.first_update_s, "time": time.time(), "opt_steps": self.book.opt_steps,
            "replay_size": len(self.replay)})
        log.info("learner: first optimisation step after %.2fs", self.first_update_s)

    # --- stats --------------------------------------------------------------------------------
    @property
    def inserted(self) -> int:
        """Transitions inserted into replay over the run."""
        return self.limiter.inserted

    def samples_per_insert(self) -> float:
        return self.limiter.ratio(self.book.opt_steps)

    def perf(self) -> dict[str, float]:
        intake = self.intake.summary()
        values = {**replay_values(self.replay), "perf/samples_per_insert": self.samples_per_insert(),
                  "perf/transitions_inserted_per_s": self._insert_rate.read(self.limiter.inserted),
                  "perf/bytes_received": float(intake["bytes_received"]),
                  "perf/bytes_published": float(self.publisher.bytes_sent),
                  "perf/rejected": float(self._rejected(intake)), "perf/model_version": float(self.book.version),
                  "perf/intake_queue": float(intake["handoff"]["items"]),
                  "perf/intake_cpu_s": float(intake["cpu_s"])}
        values.update(self.peers.perf(intake))
        if self.peers.lags:
            self.book.recorder.histogram(self.book.opt_steps, "perf/policy_lag",
                                         np.fromiter(self.peers.lags, np.int64))
        return values

    def _rejected(self, intake: dict[str, Any]) -> int:
        return int(intake["rejected_total"]) + self.writer.rejected + self.writer.rejected_frames

    def rejected_total(self) -> int:
        return self._rejected(self.intake.summary())

    def summary_extra(self) -> dict[str, Any]:
        intake = self.intake.summary()
        peers = self.peers.summary(intake)
        published = self.publisher.stats()
        return {
            "role": "learner", "endpoints": self.endpoints, "replay_size": len(self.replay),
            "replay_device": str(getattr(self.replay, "device", "host")),
            "replay_item": self.task.replay_item,  # what replay_size, transitions_inserted and the limiter count
            "replay_frames_per_item": round(getattr(self.replay, "frames_held", 0) / max(len(self.replay), 1), 3),
            "transitions_inserted": self.limiter.inserted,
            "reward_scale": self.rewards.factor, "reward_rms_measured": self.rewards.measured_rms,
            "transitions_inserted_per_s": self.limiter.inserted / max(self.book.wall_s, 1e-9),
            "samples_per_insert": self.samples_per_insert(),
            "bytes_received": intake["bytes_received"], "wire": intake["wire"],
            "models_published": published["models_published"], "publisher": published,
            "models_withheld": self.models_withheld, "updates_skipped": self.updates_skipped,
            "rate_limiter_pauses": self.limiter.pauses, "first_batch_s": self.first_batch_s,
            "first_update_s": self.first_update_s,
            "intake": {"cpu_s": intake["cpu_s"], **intake["handoff"]},
            "policy_lag": {**peers.pop("policy_lag"), "updates_per_version": self.cfg.trainer.sync_interval},
            "messages": {"batches_received": self.batches, "bundles_received": intake["bundles_received"],
                         "batches_lost": intake["batches_lost"], "batches_dropped_old": intake["batches_dropped_old"],
                         "over_allowance_transitions": intake["over_allowance_transitions"],
                         "rejected": {**intake["rejected"], "replay": self.writer.rejected,
                                      "frames_unshared": self.writer.rejected_frames},
                         "rejected_total": self._rejected(intake), "peers_refused": intake["peers_refused"],
                         "refused_names": intake["refused_names"], "config_mismatches": intake["config_mismatches"]},
            "priorities": priority_counts(self.replay), "restarts": restart_counts(self.dir),
            **({"store": self.on_policy.summary()} if self.on_policy is not None else {}),
            **peers, "auth": auth_counts(self.ctx),
        }

    # --- the loop -----------------------------------------------------------------------------
    def run(self, stop: StopFlag) -> dict[str, Any]:
        """Train until stopped or done; returns the summary."""
        log.info("learner: data on %s, models on %s, evaluations on %s; run dir %s", self.endpoints["data"],
                 self.endpoints["model"], self.endpoints["eval"], self.dir)
        tc = self.cfg.trainer
        log.info("learner: replay counts %ss: capacity %d, warm-up %d, batches of %d, samples per insert %s",
                 self.task.replay_item, self.cfg.replay.capacity, tc.warmup, self.cfg.agent.batch_size,
                 f"{tc.min_samples_per_insert:g}..{tc.max_samples_per_insert or float('inf'):g}")
        self._threads = True
        self.publisher.start()
        self.intake.start()
        self.publish(new_version=False)
        try:
            return self._loop(stop)
        except BaseException:
            self.book.close_recorder(failed=True)
            self.close()
            raise
        finally:
            before, self._denormals_before = self._denormals_before, None
            if before is False:
                from zmqrl.agents.torch_util import flush_denormals

                flush_denormals(False)

    def _loop(self, stop: StopFlag) -> dict[str, Any]:
        tc, batch_size = self.cfg.trainer, self.cfg.agent.batch_size
        summarise = Every(max(self.cfg.net.stats_interval_s, 0.5))
        waiting_log, regrant = Every(10.0), Every(REGRANT_S)
        cost, handoff = self.book.cost, self.intake.handoff
        while not stop.set and not self.book.should_stop():
            self.intake.check()
            self.publisher.check()
            self._take_in()
            if self.on_policy is not None:
                self.on_policy.at_version(self.book.version)  # segments too many versions old are dropped
            if summarise():
                self._settle()  # the summary counts every step taken, its priorities written
                self.book.write_summary(self.summary_extra())
            ready, warm = self.agent_ready(), len(self.replay) >= tc.warmup
            if warm and self.rewards.settle_due and self.rewards.settle("learner: "):
                self.rewards.level_priorities(self.replay)  # (no step pending: the first comes after warm-up)
                # (the factor reaches actors, for their priorities, with the control _ask posts below)
            starving = not (warm and ready)
            throttled = self.limiter.throttled(self._steps_taken())
            self.limiter.update_pause(self._steps_taken(), warm,
                                      full=self.on_policy is not None and self.on_policy.full)
            self._ask(grant=throttled and self.limiter.allowance() is not None and regrant())
            if starving or throttled:
                self._settle()  # no step left pending while the loop waits
                if starving and waiting_log():
                    log.info("learner: %d/%d warm-up %ss in replay; waiting for %s", len(self.replay), tc.warmup,
                             self.task.replay_item, "actors" if ready else "the agent (torch loading) and actors")
                t0 = time.perf_counter()
                handoff.wait(REGRANT_S if throttled else IDLE_WAIT_S)
                cost.add("idle", time.perf_counter() - t0)
                continue
            if self._pending is not None and self._settle_first():
                self._settle()
                continue  # the stop, the limiter and the rest see the step counted
            # Batch k+1 is drawn while the device may still run step k; step k's results are read after.
            t0 = time.perf_counter()
            sampled_at = self.replay.num_added
            batch = self.rewards.scale(self.replay.sample(batch_size))
            cost.add("sample", time.perf_counter() - t0)
            if self._resolve(save=False):  # (no checkpoint came due: _settle_first would have settled it)
                self.publish(new_version=True)
            assert self._update is not None  # (the agent is ready)
            t1 = time.perf_counter()
            self._pending = (self._update(batch), batch["indices"], sampled_at)
            cost.add("update", time.perf_counter() - t1)
        if stop.set:
            self.book.stop_reason = f"stopped by {stop.signal_name or 'signal'}"
        return self.finish()

    def finish(self) -> dict[str, Any]:
        """A clean stop: take in what peers already sent, final checkpoint and summary, then tell every
        role on the stream that the run is over (they exit 0)."""
        self._settle()  # the last step's priorities and count, before the final checkpoint and summary
        if self._threads:
            self.intake.stop(drain_s=1.0)
        else:
            self.intake.poll(0.0)
        while len(self.intake.handoff):
            self._take_in(None)
        self.agent_ready(block=True)  # the final checkpoint needs the agent
        summary = self.book.finish(self.summary_extra())
        print_run_table(summary, self.dir, "learner summary")
        if self._threads:
            self.publisher.finish(self.book.stop_reason or "finished")
        self.close(linger_ms=1000)  # the last message leaves before the context goes
        return summary

    def close(self, linger_ms: int = 0) -> None:
        """Stop the intake and the publisher, then close the sockets and the context; the stream may flush
        ``linger_ms`` (``finish``, the clean stop, lets its last message, the end of the run, leave)."""
        self.intake.stop()
        self.publisher.stop()
        self.set_linger(self.pub, linger_ms)
        super().close()


def run_learner(cfg: Config, run_dir: str | None, bind_data: str, bind_model: str, bind_eval: str,
                resume: bool = False, bind_snapshot: str | None = None) -> int:
    """The ``zmqrl learner`` entry point."""
    serve(lambda: Learner(cfg, run_dir, bind_data, bind_model, bind_eval, resume, bind_snapshot))
    return 0


def deferred_update(agent: Agent) -> Callable[[Mapping[str, np.ndarray]], PendingUpdate]:
    """``agent.update_deferred`` (:class:`~zmqrl.core.DefersUpdates`), or for an agent without it, its
    ``update`` with the results already read."""
    if isinstance(agent, DefersUpdates):
        return agent.update_deferred
    from zmqrl.agents.torch_util import PendingStep

    return lambda batch: PendingStep.resolved(*agent.update(batch))


def nonfinite_params(params: Any) -> str:
    """The name of the first parameter array holding NaN or an infinity ("" when all are finite)."""
    for name, value in params.items():
        array = np.asarray(value)
        if array.dtype.kind == "f" and not np.isfinite(np.add.reduce(array, axis=None, dtype=np.float64)):
            if not np.isfinite(array).all():
                return str(name)
    return ""
