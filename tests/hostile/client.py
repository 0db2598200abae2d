"""A hostile peer of a running job: every kind of bad message that was reported, paced, in turn.

(One module past 450 lines: each attack kind reads beside the client state it drives; the messages
themselves are built in :mod:`hostile.messages`.)

The hostile soak (:mod:`hostile.soak`) starts it against a ``zmqrl local`` job; it can also be run
by hand, from a checkout, against any CartPole job whose run directory it can read::

    python tests/hostile client configs/cartpole_dqn.yaml --run-dir runs/x --seconds 120

It reads the addresses from ``RUN_DIR/endpoints.json`` (the learner's ``data`` and ``eval``
sockets, the proxy's ``bind``) and, for ``--seconds``, gives each attack kind ``--slot-s``
seconds in turn, sending at most ``--rate`` messages per second in all (a heavy message counts
for several), at the lowest CPU priority, so that on a small machine it does not simply take the
honest roles' CPU. Each kind is one generator function below (:data:`KINDS`); each ``yield``
hands the pacer the number of message slots just used. What each kind sent (per target), what
could not be sent (the receiver's queue full) and the order of the turns go to ``--out``
(``RUN_DIR/hostile.json`` by default), rewritten every second and at the end.

The batches are CartPole-v1's (obs float32 (n, 4), action int64, reward, next_obs, discount
float32, optional priority float32). Headers that carry numbers Python's ``json`` cannot hold
(``1e400``) are written by hand (:class:`Literal`); NaN and Infinity are what ``json`` writes
for Python's own. This module never imports torch.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time
from collections.abc import Callable, Generator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import numpy as np
import zmq

from batches import CARTPOLE_N
from hostile.messages import (
    Array,
    arrays_of,
    bad_value_batches,
    batch_meta,
    forged_eval_frames,
    junk_bytes,
    long_name,
    many_frames_message,
    message,
    number_metas,
    sane_arrays,
    zero_shape_arrays,
)
from zmqrl.roles.net import new_context, options
from zmqrl.run.rundir import read_json, write_json_atomic
from zmqrl.wire import (
    BATCH,
    EVAL,
    HELLO,
    STATS,
    SocketOptions,
    encode,
    encode_hello,
    eval_meta,
    make_socket,
    new_incarnation,
    pack,
)

HELP = "Send a running job every kind of bad message, paced, and count what was sent."

LEARNER_DATA, LEARNER_EVAL, PROXY = "learner-data", "learner-eval", "proxy"
DATA_TARGETS = (LEARNER_DATA, PROXY)  # where batches go: the learner directly, and through the proxy
MAX_SEQ = 2**63 - 1
EVAL_BURST = 200  # eval_flood: messages per connection before it is dropped
TWIN_STEP = 100_000  # seq_hijack: env steps each twin batch claims beyond the last
SUMMARY_EVERY_S = 2.0  # how often the real actors' incarnations are read from summary.json
WRITE_EVERY_S = 1.0


# --- the client ----------------------------------------------------------------------------------

def tcp_host_port(address: str) -> tuple[str, int]:
    """``tcp://HOST:PORT`` as (host, port)."""
    parts = urlsplit(address)
    if parts.scheme != "tcp" or parts.hostname is None or parts.port is None:
        raise ValueError(f"not a tcp:// address: {address!r}")
    return parts.hostname, parts.port


def read_endpoints(run_dir: Path) -> dict[str, str] | None:
    """The three targets' addresses from ``RUN_DIR/endpoints.json``, once all are there."""
    data = read_json(run_dir / "endpoints.json") or {}
    learner, proxy = data.get("learner") or {}, data.get("proxy") or {}
    found = {LEARNER_DATA: learner.get("data"), LEARNER_EVAL: learner.get("eval"), PROXY: proxy.get("bind")}
    return found if all(isinstance(v, str) for v in found.values()) else None  # type: ignore[return-value]


class Pacer:
    """At most ``rate`` message slots per second, on average, from the first call."""

    def __init__(self, rate: float) -> None:
        self.interval = 1.0 / rate
        self.next = time.monotonic()

    def wait(self, slots: int) -> None:
        self.next = max(self.next, time.monotonic() - 1.0) + slots * self.interval  # (a stall: at most 1 s made up)
        delay = self.next - time.monotonic()
        if delay > 0:
            time.sleep(delay)


class Hostile:
    """The sockets, counters and per-sender sequence numbers the kinds share."""

    def __init__(self, cfg: Any, run_dir: Path, endpoints: Mapping[str, str], many_frames: int = 200_000,
                 seed: int = 0) -> None:
        self.run_dir, self.endpoints, self.many_frames = run_dir, dict(endpoints), many_frames
        self.rng = np.random.default_rng(seed)
        self.ctx = new_context(cfg.net)  # the config's security, if any: an insider with a valid key
        self.push_options = options(cfg.net, SocketOptions.push(sndhwm=1000, linger_ms=0), data_path=True)
        self.sockets = {name: self.connect(name) for name in (LEARNER_DATA, LEARNER_EVAL, PROXY)}
        self.inc = new_incarnation()
        self.seqs: dict[tuple[str, str, str], int] = {}
        self.kind = ""
        self.counts: dict[str, dict[str, Any]] = {}
        self._actors: list[tuple[str, str]] = []
        self._actors_read = -SUMMARY_EVERY_S

    def connect(self, target: str) -> zmq.Socket:
        return make_socket(self.ctx, zmq.PUSH, self.push_options, connect=self.endpoints[target])

    def close(self) -> None:
        for sock in self.sockets.values():
            sock.close(linger=0)
        self.ctx.term()

    # --- counting
    def count(self, what: str, target: str, n: int = 1) -> None:
        entry = self.counts.setdefault(self.kind, {"sent": 0, "unsent": 0, "errors": 0, "targets": {}})
        entry[what] += n
        if what == "sent":
            entry["targets"][target] = entry["targets"].get(target, 0) + n

    def error(self, text: str) -> None:
        self.count("errors", "")
        self.counts[self.kind]["last_error"] = text[:300]

    # --- sending
    def next_seq(self, sender: str, inc: str, target: str) -> int:
        key = (sender, inc, target)
        self.seqs[key] = seq = self.seqs.get(key, -1) + 1
        return seq

    def sender(self, target: str) -> str:
        """This kind's own sender name towards ``target`` (one sequence per name and target)."""
        return f"hostile-{self.kind}@{target}"

    def send(self, target: str, frames: list[Any], sock: zmq.Socket | None = None) -> bool:
        """Send without blocking; counted as sent, or unsent when the receiver's queue is full."""
        try:
            (sock or self.sockets[target]).send_multipart(frames, zmq.NOBLOCK)
        except zmq.Again:
            self.count("unsent", target)
            return False
        self.count("sent", target)
        return True

    def send_batch(self, target: str, arrays: list[Array], meta: Mapping[str, Any], sender: str | None = None,
                   inc: str | None = None, seq: int | None = None, kind: str = BATCH) -> bool:
        """A message of ``arrays`` and ``meta`` with this kind's name and the next sequence number; packed
        into one frame towards the proxy, as actors send theirs."""
        sender, inc = sender or self.sender(target), inc or self.inc
        seq = self.next_seq(sender, inc, target) if seq is None else seq
        frames: list[Any] = message(kind, sender, inc, seq, 0, arrays, meta)
        return self.send(target, [pack(frames)] if target == PROXY else frames)

    def tcp(self, target: str, payload: bytes = b"") -> None:
        """A plain TCP connection to ``target`` that sends ``payload`` (if any) and closes."""
        try:
            with socket.create_connection(tcp_host_port(self.endpoints[target]), timeout=1.0) as conn:
                if payload:
                    conn.sendall(payload)
        except OSError as exc:
            self.error(f"{target}: {exc}")
            return
        self.count("sent", target)

    def real_actors(self) -> list[tuple[str, str]]:
        """(name, incarnation) of the honest actors the learner knows (``actor-*`` in summary.json)."""
        now = time.monotonic()
        if now - self._actors_read >= SUMMARY_EVERY_S:
            self._actors_read = now
            actors = (read_json(self.run_dir / "summary.json") or {}).get("actors") or {}
            found = [(name, a.get("incarnation")) for name, a in actors.items()
                     if name.startswith("actor-") and isinstance(a, dict)]
            self._actors = [(name, inc) for name, inc in found if isinstance(inc, str) and inc]
        return self._actors

    def model_version(self) -> int:
        summary = read_json(self.run_dir / "summary.json") or {}
        version = summary.get("model_version")
        return version if isinstance(version, int) and version >= 0 else 0


# --- the kinds: one generator each; every yield gives the message slots just used ---------------

Gen = Generator[int, None, None]
Kind = Callable[[Hostile], Gen]


def meta_numbers(h: Hostile) -> Gen:
    """NaN, 1e400 and 10**400 in a batch's counters, exploration and episodes, a STATS message's
    counts and an evaluation's returns."""
    while True:
        for kind, meta in number_metas():
            if kind == BATCH:
                for target in DATA_TARGETS:
                    h.send_batch(target, sane_arrays(h.rng), meta)
                    yield 1
            elif kind == STATS:
                h.send_batch(LEARNER_DATA, [], meta, kind=STATS)
                yield 1
            else:
                h.send_batch(LEARNER_EVAL, [], meta, sender="evaluator", kind=EVAL)
                yield 1


def zero_shape(h: Hostile) -> Gen:
    """A batch with an extra array declared [0, 2**62] (zero bytes); the same array on a STATS and a HELLO."""
    while True:
        for target in DATA_TARGETS:
            h.send_batch(target, zero_shape_arrays(h.rng), batch_meta(0))
            yield 1
        h.send_batch(LEARNER_DATA, zero_shape_arrays(h.rng)[-1:], {}, kind=STATS)
        yield 1
        h.send_batch(PROXY, zero_shape_arrays(h.rng)[-1:], {}, kind=HELLO)
        yield 1


def bad_values(h: Hostile) -> Gen:
    """Batches that fit the spec with action 7 (CartPole has 2), a NaN reward, NaN obs, NaN or inf priority."""
    steps = 0
    while True:
        for _, batch in bad_value_batches(h.rng):
            steps += CARTPOLE_N
            for target in DATA_TARGETS:
                h.send_batch(target, arrays_of(batch), batch_meta(steps))
                yield 1


def forged_eval(h: Hostile) -> Gen:
    """Evaluation reports of return 500 (CartPole's best) for versions 0, 1, 2, ..., named "evaluator"."""
    version = 0
    while True:
        h.send(LEARNER_EVAL, forged_eval_frames(h.inc, version, version))
        version += 1
        yield 1


def long_names(h: Hostile) -> Gen:
    """HELLO messages to the proxy from ever new 250-character sender names."""
    i = 0
    while True:
        h.send(PROXY, encode_hello(long_name(i), h.inc, 0, {"role": "actor", "host": "hostile"}))
        i += 1
        yield 1


def tcp_churn(h: Hostile) -> Gen:
    """Plain TCP connect and close, to the proxy's actor port and the learner's data port."""
    while True:
        for target in (PROXY, LEARNER_DATA):
            h.tcp(target)
            yield 1


def junk_handshake(h: Hostile) -> Gen:
    """TCP connections that send garbage instead of a ZMTP greeting, then close."""
    i = 0
    while True:
        for target in (PROXY, LEARNER_DATA, LEARNER_EVAL):
            h.tcp(target, junk_bytes(h.rng, i))
            i += 1
            yield 1


def many_frames(h: Hostile) -> Gen:
    """One message of ``--many-frames`` tiny frames to the learner's data port (paced by its frame count)."""
    seq = 0
    while True:
        h.send(LEARNER_DATA, many_frames_message(h.many_frames, h.inc, seq))
        seq += 1
        yield max(1, h.many_frames // 200)


def flood(h: Hostile) -> Gen:
    """A rogue actor ("hostile-flood") sending valid batches through the proxy as fast as the pacing
    allows, heeding no pause."""
    steps = 0
    while True:
        steps += CARTPOLE_N
        h.send_batch(PROXY, sane_arrays(h.rng), batch_meta(steps), sender="hostile-flood")
        yield 1


def eval_flood(h: Hostile) -> Gen:
    """:data:`EVAL_BURST` plausible evaluation reports from one connection, which is then dropped."""
    while True:
        sock = h.connect(LEARNER_EVAL)
        try:
            inc, version = new_incarnation(), h.model_version()
            for seq in range(EVAL_BURST):
                report = encode(EVAL, sender="hostile-eval_flood", incarnation=inc, seq=seq, version=version,
                                meta=eval_meta(version, [20.0] * 10, [20] * 10))
                h.send(LEARNER_EVAL, report, sock)
                yield 1
        finally:
            sock.close(linger=0)


def seq_hijack(h: Hostile) -> Gen:
    """Batches under each real actor's name and incarnation with seq 2**63-1 (its own batches then look
    old); and one name ("hostile-twin") in two interleaved incarnations claiming ever more env steps."""
    twins, steps = (new_incarnation(), new_incarnation()), 0
    while True:
        for name, inc in h.real_actors():
            for target in DATA_TARGETS:
                h.send_batch(target, sane_arrays(h.rng), batch_meta(0), sender=name, inc=inc,
                             seq=MAX_SEQ)
                yield 1
        for twin in (*twins, *twins):
            steps += TWIN_STEP
            for target in DATA_TARGETS:
                h.send_batch(target, sane_arrays(h.rng), batch_meta(steps),
                             sender=f"hostile-twin@{target}", inc=twin)
                yield 1


KINDS: dict[str, Kind] = {f.__name__: f for f in (meta_numbers, zero_shape, bad_values, forged_eval, long_names,
                                                   tcp_churn, junk_handshake, many_frames, flood, eval_flood,
                                                   seq_hijack)}


# --- running them in turn ------------------------------------------------------------------------

def parse_kinds(text: str) -> list[str]:
    """``all`` or a comma-separated list of :data:`KINDS` names (ValueError naming an unknown one)."""
    if text.strip() == "all":
        return list(KINDS)
    kinds = [k.strip() for k in text.split(",") if k.strip()]
    unknown = [k for k in kinds if k not in KINDS]
    if unknown or not kinds:
        raise ValueError(f"unknown attack kind(s) {unknown or text!r}; known: {', '.join(KINDS)}")
    return kinds


class Run:
    """Give each kind ``slot_s`` seconds in turn for ``seconds``, paced at ``rate`` slots/s; write ``out``."""

    def __init__(self, h: Hostile, kinds: list[str], seconds: float, slot_s: float, rate: float,
                 out: Path | None) -> None:
        self.h, self.kinds, self.seconds, self.slot_s, self.rate, self.out = h, kinds, seconds, slot_s, rate, out
        self.started = time.time()
        self.timeline: list[tuple[float, str]] = []  # (Unix time, kind) at the start of each turn
        self.finished = False

    def report(self) -> dict[str, Any]:
        counts = {kind: self.h.counts.get(kind, {"sent": 0, "unsent": 0, "errors": 0, "targets": {}})
                  for kind in self.kinds}
        return {"pid": os.getpid(), "started": round(self.started, 3), "updated": round(time.time(), 3),
                "finished": self.finished, "seconds": self.seconds, "slot_s": self.slot_s, "rate": self.rate,
                "many_frames": self.h.many_frames, "endpoints": self.h.endpoints, "current": self.h.kind,
                "order": self.kinds, "kinds": counts, "timeline": [[round(t, 3), k] for t, k in self.timeline[-5000:]]}

    def write(self) -> None:
        if self.out is not None:
            write_json_atomic(self.out, self.report())

    def run(self, stop: Any) -> dict[str, Any]:
        pacer = Pacer(self.rate)
        generators: dict[str, Gen] = {}
        end = time.monotonic() + self.seconds
        write_due = 0.0
        try:
            while not stop.set and time.monotonic() < end:
                for kind in self.kinds:
                    slot_end = min(time.monotonic() + self.slot_s, end)
                    if stop.set or time.monotonic() >= end:
                        break
                    self.h.kind = kind
                    self.h.counts.setdefault(kind, {"sent": 0, "unsent": 0, "errors": 0, "targets": {}})
                    self.timeline.append((time.time(), kind))
                    generator = generators.get(kind) or generators.setdefault(kind, KINDS[kind](self.h))
                    while not stop.set:  # at least one message per turn, however late this process runs
                        try:
                            slots = next(generator)
                        except Exception as exc:  # a kind that fails starts over on its next turn
                            self.h.error(f"{type(exc).__name__}: {exc}")
                            generators.pop(kind).close()
                            break
                        pacer.wait(slots)
                        if time.monotonic() >= write_due:
                            self.write()
                            write_due = time.monotonic() + WRITE_EVERY_S
                        if time.monotonic() >= slot_end:
                            break
        finally:
            for generator in generators.values():
                generator.close()
            self.finished = True
            self.write()
        return self.report()


def wait_endpoints(run_dir: Path, seconds: float, stop: Any) -> dict[str, str] | None:
    """The targets' addresses once ``RUN_DIR/endpoints.json`` names them all (None after ``seconds``)."""
    deadline = time.monotonic() + seconds
    while not stop.set:
        found = read_endpoints(run_dir)
        if found is not None or time.monotonic() >= deadline:
            return found
        time.sleep(0.2)
    return None


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", help="the job's YAML config file (CartPole-v1)")
    p.add_argument("--run-dir", required=True, help="the job's run directory (endpoints.json, summary.json)")
    p.add_argument("--seconds", type=float, required=True, help="how long to attack")
    p.add_argument("--rate", type=float, default=300.0, help="message slots per second in all (default 300)")
    p.add_argument("--slot-s", type=float, default=2.0, help="seconds each kind gets per turn (default 2)")
    p.add_argument("--kinds", default="all", help=f"comma-separated kinds, or all (default): {', '.join(KINDS)}")
    p.add_argument("--many-frames", type=int, default=200_000,
                   help="frames in many_frames' message (default 200000)")
    p.add_argument("--out", help="counts as JSON (default RUN_DIR/hostile.json)")
    p.add_argument("--wait-s", type=float, default=60.0, help="how long to wait for endpoints.json (default 60)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config value, as the job did (repeatable)")


def main(argv: list[str] | None = None) -> int:
    """``python tests/hostile client CONFIG --run-dir RUN --seconds N ...``; 0 once the time is up or on
    SIGTERM, 2 for bad arguments or config, 1 when the job's endpoints never appeared."""
    from zmqrl.config import ConfigError, load
    from zmqrl.run.lifecycle import StopFlag

    parser = argparse.ArgumentParser(prog="python tests/hostile client", description=HELP)
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        kinds = parse_kinds(args.kinds)
        cfg = load(args.config, list(args.overrides))
        if cfg.env.id != "CartPole-v1":
            raise ConfigError(f"env.id: the hostile client builds CartPole-v1 batches, the job runs {cfg.env.id!r}")
        if args.rate <= 0 or args.slot_s <= 0 or args.seconds <= 0 or args.many_frames < 2:
            raise ConfigError("--rate, --slot-s and --seconds must be > 0 and --many-frames >= 2")
    except (ConfigError, ValueError) as exc:
        print(f"hostile: {exc}", file=sys.stderr)
        return 2
    run_dir = Path(args.run_dir)
    out = Path(args.out) if args.out else run_dir / "hostile.json"
    try:
        os.nice(19)  # the honest roles come first on a shared CPU
    except OSError:
        pass
    with StopFlag() as stop:
        endpoints = wait_endpoints(run_dir, args.wait_s, stop)
        if endpoints is None:
            print(f"hostile: no learner and proxy addresses in {run_dir / 'endpoints.json'}", file=sys.stderr)
            return 0 if stop.set else 1
        print(f"hostile: {', '.join(kinds)} for {args.seconds:g}s at {args.rate:g} slots/s against {endpoints}",
              flush=True)
        h = Hostile(cfg, run_dir, endpoints, args.many_frames, seed=cfg.run.seed)
        try:
            report = Run(h, kinds, args.seconds, args.slot_s, args.rate, out).run(stop)
        finally:
            h.close()
    for kind, c in report["kinds"].items():
        print(f"hostile: {kind:<15} sent {c['sent']:>8}  unsent {c['unsent']:>6}  errors {c['errors']:>4}"
              + (f"  ({c['last_error']})" if c.get("last_error") else ""), flush=True)
    return 0
