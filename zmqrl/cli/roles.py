"""``zmqrl train``, ``local`` and each role's own command: ``learner``, ``proxy``, ``actor``, ``evaluator``."""

from __future__ import annotations

import argparse

from zmqrl.cli.common import (
    ADDR_HELP,
    BIND_HELP,
    Command,
    add_callable_args,
    add_config_args,
    add_supervision_args,
    config_from_run_dir,
    load_config,
    take_callables,
)
from zmqrl.config import ConfigError, NetConfig
from zmqrl.roles.addresses import endpoint, same_host


def run_train(args: argparse.Namespace) -> int:
    from zmqrl.run.train import train

    cfg = load_config(args)
    take_callables(args, cfg)
    summary = train(cfg, args.run_dir, resume=args.resume)
    interrupted = summary["stop_reason"] == "interrupted"
    return 130 if interrupted and args.strict_exit else 0


def run_learner(args: argparse.Namespace) -> int:
    cfg = load_config(args)
    net = cfg.net
    data = endpoint(args.bind_data, net.bind_host, net.data_port, "--bind-data", bind=True,
                    host_key="net.bind_host", port_key="net.data_port")
    model = endpoint(args.bind_model, net.bind_host, net.model_port, "--bind-model", bind=True,
                     host_key="net.bind_host", port_key="net.model_port")
    evals = endpoint(args.bind_eval, net.bind_host, net.eval_port, "--bind-eval", bind=True,
                     host_key="net.bind_host", port_key="net.eval_port")
    if args.bind_snapshot is None and args.bind_model is not None:
        snapshot = same_host(model, "*")  # a free port beside the one given; control names it to every role
    else:
        snapshot = endpoint(args.bind_snapshot, net.bind_host, net.snapshot_port, "--bind-snapshot", bind=True,
                            host_key="net.bind_host", port_key="net.snapshot_port")
    from zmqrl.roles.learner import run_learner as run

    return run(cfg, args.run_dir, data, model, evals, resume=args.resume, bind_snapshot=snapshot)


def snapshot_endpoint(args: argparse.Namespace, net: NetConfig, model: str, flag: str = "--snapshot") -> str | None:
    """Where the stream at ``model`` serves snapshots: ``--snapshot``; else None, and the role takes the
    learner's port from its control."""
    value = getattr(args, flag.lstrip("-").replace("-", "_"))
    if not value:
        return None
    host = model.split("://", 1)[-1].rsplit(":", 1)[0]
    return endpoint(value, host, net.snapshot_port, flag, host_key="the stream's host", port_key="net.snapshot_port")


def run_proxy(args: argparse.Namespace) -> int:
    cfg = load_config(args)
    net = cfg.net
    bind = endpoint(args.bind, net.bind_host, net.proxy_port, "--bind", bind=True,
                    host_key="net.bind_host", port_key="net.proxy_port")
    learner = endpoint(args.learner, net.learner_host, net.data_port, "--learner",
                       host_key="net.learner_host", port_key="net.data_port")
    host = learner.split("://", 1)[-1].rsplit(":", 1)[0]
    models = endpoint(args.models, host, net.model_port, "--models", host_key="the --learner host",
                      port_key="net.model_port")
    relay = None
    if args.relay:
        relay = (endpoint(args.relay, "127.0.0.1", 0, "--relay", bind=True),
                 endpoint(args.relay_snapshot, "127.0.0.1", 0, "--relay-snapshot", bind=True))
    from zmqrl.roles.proxy import run_proxy as run

    return run(cfg, bind, learner, name=args.name, run_dir=args.run_dir, model_addr=models,
               snapshot_addr=snapshot_endpoint(args, net, models), relay=relay)


def run_actor(args: argparse.Namespace) -> int:
    cfg = load_config(args)
    net = cfg.net
    if not 0 <= args.id < cfg.actor.num_actors:
        raise ConfigError(f"--id {args.id} is outside 0..{cfg.actor.num_actors - 1}: ids run from 0 to "
                          f"actor.num_actors - 1 (actor.num_actors={cfg.actor.num_actors}, the total over every "
                          "host; set it with --set actor.num_actors=N)")
    proxy = endpoint(args.proxy, net.proxy_host, net.proxy_port, "--proxy",
                     host_key="net.proxy_host", port_key="net.proxy_port")
    model = endpoint(args.learner, net.learner_host, net.model_port, "--learner",
                     host_key="net.learner_host", port_key="net.model_port")
    from zmqrl.roles.actor import run_actor as run

    return run(cfg, args.id, proxy, model, run_dir=args.run_dir, snapshot_addr=snapshot_endpoint(args, net, model))


def run_evaluator(args: argparse.Namespace) -> int:
    cfg = load_config(args)
    net = cfg.net
    model = endpoint(args.learner, net.learner_host, net.model_port, "--learner",
                     host_key="net.learner_host", port_key="net.model_port")
    host = model.split("://", 1)[-1].rsplit(":", 1)[0]
    report = endpoint(args.report, host, net.eval_port, "--report", host_key="the --learner host",
                      port_key="net.eval_port")
    from zmqrl.roles.evaluator import run_evaluator as run

    return run(cfg, model, report, run_dir=args.run_dir, snapshot_addr=snapshot_endpoint(args, net, model))


def run_local(args: argparse.Namespace) -> int:
    from zmqrl.roles.launch.local import run_local as run

    config_from_run_dir(args)
    cfg = load_config(args, [f"actor.num_actors={args.actors}"])
    extra = take_callables(args, cfg)
    return run(cfg, args.config, args.overrides + extra, args.actors, args.run_dir, evaluator=not args.no_evaluator,
               resume=args.resume, max_restarts=args.max_restarts, fail_fast=args.fail_fast)


def train_args(p: argparse.ArgumentParser) -> None:
    add_config_args(p)
    p.add_argument("--run-dir", help="run directory (default runs/<name>-<time>)")
    p.add_argument("--resume", action="store_true", help="continue from RUN_DIR/checkpoints/latest")
    p.add_argument("--strict-exit", action="store_true", help="exit 130 when interrupted")
    add_callable_args(p)


def learner_args(p: argparse.ArgumentParser) -> None:
    add_config_args(p)
    p.add_argument("--run-dir", help="run directory (default runs/<name>-<time>)")
    p.add_argument("--bind-data", metavar="ADDR", help=f"PULL for batches from proxies; {BIND_HELP}")
    p.add_argument("--bind-model", metavar="ADDR", help=f"PUB for model versions; {BIND_HELP}")
    p.add_argument("--bind-eval", metavar="ADDR", help=f"PULL for evaluator reports; {BIND_HELP}")
    p.add_argument("--bind-snapshot", metavar="ADDR",
                   help="ROUTER where joiners ask for the newest model (default: net.snapshot_port on net.bind_host; "
                        "with --bind-model alone, a free port on its host); " + BIND_HELP)
    p.add_argument("--resume", action="store_true", help="continue from RUN_DIR/checkpoints/latest")


def proxy_args(p: argparse.ArgumentParser) -> None:
    add_config_args(p)
    p.add_argument("--bind", metavar="ADDR", help=f"PULL that actors connect to; {BIND_HELP}")
    p.add_argument("--learner", metavar="ADDR", help=f"the learner's data address; {ADDR_HELP}")
    p.add_argument("--models", metavar="ADDR", help="the learner's model address, to hear when the run is "
                                                    "over (default: the learner's host and net.model_port)")
    p.add_argument("--snapshot", metavar="ADDR", help="where that stream serves snapshots of its newest model "
                                                      "(default: the port the learner's control names)")
    p.add_argument("--relay", metavar="ADDR", help="run this host's relay: its stream of the learner's models "
                                                   "and control binds here (actors subscribe to it); " + BIND_HELP)
    p.add_argument("--relay-snapshot", metavar="ADDR", help="the relay's snapshot ROUTER binds here (default: a "
                                                            "free loopback port)")
    p.add_argument("--name", default="proxy", help="name in the learner's stats (one per proxy)")
    p.add_argument("--run-dir", help="where to write roles/NAME.json at exit (optional)")


def actor_args(p: argparse.ArgumentParser) -> None:
    add_config_args(p)
    p.add_argument("--id", type=int, required=True, help="actor index 0..N-1 (sets its seed and epsilon)")
    p.add_argument("--proxy", metavar="ADDR", help=f"the proxy's address; {ADDR_HELP}")
    p.add_argument("--learner", metavar="ADDR", help=f"the learner's model address, or the host relay's; {ADDR_HELP}")
    p.add_argument("--snapshot", metavar="ADDR", help="where that stream serves snapshots of its newest model "
                                                      "(default: the port the learner's control names)")
    p.add_argument("--run-dir", help="where to write roles/actor-ID.json at exit (optional)")


def evaluator_args(p: argparse.ArgumentParser) -> None:
    add_config_args(p)
    p.add_argument("--learner", metavar="ADDR", help=f"the learner's model address; {ADDR_HELP}")
    p.add_argument("--report", metavar="ADDR", help="the learner's evaluation address (default: the "
                                                   "learner's host and net.eval_port)")
    p.add_argument("--snapshot", metavar="ADDR", help="where that stream serves snapshots of its newest model "
                                                      "(default: the port the learner's control names)")
    p.add_argument("--run-dir", help="where checkpoints/best goes (optional)")


def local_args(p: argparse.ArgumentParser) -> None:
    add_config_args(p)
    p.add_argument("--actors", type=int, default=2, help="number of actor processes (default 2)")
    p.add_argument("--run-dir", help="run directory (default runs/<name>-<time>)")
    p.add_argument("--no-evaluator", action="store_true", help="run without the evaluator")
    p.add_argument("--resume", action="store_true", help="continue the run in RUN_DIR from checkpoints/latest "
                                                         "(CONFIG defaults to RUN_DIR/config.yaml)")
    add_callable_args(p)
    add_supervision_args(p)


COMMANDS = [
    Command("train", "train in one process (no sockets)", train_args, run_train),
    Command("learner", "the learner: replay, optimisation, model publication", learner_args, run_learner),
    Command("proxy", "forward batches from a host's actors to the learner", proxy_args, run_proxy),
    Command("actor", "step envs and send transitions to a proxy", actor_args, run_actor),
    Command("evaluator", "evaluate new model versions greedily and keep the best", evaluator_args, run_evaluator),
    Command("local", "run every role on this machine as separate, supervised processes", local_args, run_local),
]
