"""The launchers of a cluster's machines: ``zmqrl head`` (the learner and the evaluator) and ``zmqrl host``
(one proxy and N actors)."""

from __future__ import annotations

import argparse

from zmqrl.cli.common import (
    Command,
    add_callable_args,
    add_config_args,
    add_supervision_args,
    config_from_run_dir,
    load_config,
    take_callables,
)


def run_head(args: argparse.Namespace) -> int:
    from zmqrl.roles.launch.cluster import run_head as run

    config_from_run_dir(args)
    cfg = load_config(args)
    extra = take_callables(args, cfg)
    return run(cfg, args.config, args.overrides + extra, args.run_dir, bind=args.bind, evaluator=not args.no_evaluator,
               resume=args.resume, auto_resume=args.auto_resume, max_restarts=args.max_restarts,
               fail_fast=args.fail_fast)


def run_host(args: argparse.Namespace) -> int:
    from zmqrl.roles.launch.cluster import run_host as run

    cfg = load_config(args)
    extra = take_callables(args, cfg, copy_in=False)  # used where they lie: a copy here, or on a shared file system
    return run(cfg, args.config, args.overrides + extra, args.learner, args.actors, args.first_id, args.run_dir,
               name=args.name, max_restarts=args.max_restarts, fail_fast=args.fail_fast)


def head_args(p: argparse.ArgumentParser) -> None:
    add_config_args(p)
    p.add_argument("--run-dir", required=True, help="run directory (on a cluster: shared, or on a volume that "
                                                    "outlives the head)")
    p.add_argument("--bind", metavar="HOST", help="interface the learner binds (default net.bind_host; 0.0.0.0 for "
                                                  "every interface, so other machines reach it)")
    p.add_argument("--resume", action="store_true", help="continue the run in RUN_DIR from checkpoints/latest "
                                                         "(CONFIG defaults to RUN_DIR/config.yaml)")
    p.add_argument("--auto-resume", action="store_true", help="resume when RUN_DIR holds a checkpoint, start fresh "
                                                              "otherwise (for schedulers that restart or requeue)")
    p.add_argument("--no-evaluator", action="store_true", help="run without the evaluator")
    add_callable_args(p)
    add_supervision_args(p)


def host_args(p: argparse.ArgumentParser) -> None:
    add_config_args(p)
    p.add_argument("--learner", required=True, metavar="HOST",
                   help="the learner machine's name or address (ports: net.data_port and net.model_port)")
    p.add_argument("--actors", type=int, required=True, metavar="N", help="actor processes on this machine")
    p.add_argument("--first-id", type=int, default=0, metavar="K", help="id of this machine's first actor (default 0)")
    p.add_argument("--run-dir", help="where logs, role stats and the launcher's status go (default "
                                     "runs/<name>-host-<host name>)")
    p.add_argument("--name", help="this host's name in the run (default SHORT_HOSTNAME-FIRST_ID); its proxy is "
                                  "proxy-NAME")
    add_callable_args(p, where="a copy of the head's RUN_DIR/callables/ file, or its path on a shared file system")
    add_supervision_args(p)


COMMANDS = [
    Command("head", "a cluster's learner machine: the learner and the evaluator, supervised", head_args, run_head,
            "Run the learner and the evaluator on this machine, restarting them when they die (the learner with "
            "--resume from RUN_DIR/checkpoints/latest). The learner binds net.data_port, net.model_port, "
            "net.eval_port and net.snapshot_port; hosts need all but net.eval_port."),
    Command("host", "a cluster's actor machine: one proxy and N actors, supervised", host_args, run_host,
            "Run one proxy (on loopback) and N actors on this machine, restarting them when they die. Actor ids are "
            "FIRST_ID..FIRST_ID+N-1 and must be below actor.num_actors, the number of actors over all hosts."),
]
