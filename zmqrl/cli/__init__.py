"""The ``zmqrl`` command: one subcommand per role, plus train, local and tools."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable

from zmqrl.run.lifecycle import catch_stop_signals_early, ignore_stop_signals

ROLE_COMMANDS = ("learner", "proxy", "actor", "evaluator")  # processes that launchers start and stop
LAUNCHER_COMMANDS = ("local", "head", "host")  # processes that start and stop roles
RUN_COMMANDS = ("train",)  # a whole run in one process, which saves its final checkpoint after its loop


def _role_process(argv: list[str] | None) -> bool:
    """Whether this is a role's own process (``zmqrl ROLE ...`` from the command line)."""
    return argv is None and len(sys.argv) > 1 and sys.argv[1] in ROLE_COMMANDS


def _signal_aware_process(argv: list[str] | None) -> bool:
    """Whether this process (a role, a launcher or ``zmqrl train``, from the command line) ends on a stop signal
    with its own code: the signal is remembered while it starts and after its loop, ignored once its work is done."""
    return _role_process(argv) or (argv is None and len(sys.argv) > 1
                                    and sys.argv[1] in (*LAUNCHER_COMMANDS, *RUN_COMMANDS))


if __name__ == "__main__" and _role_process(None):  # ``python -m zmqrl.cli ROLE``, as launchers start roles:
    catch_stop_signals_early()  # before the imports below (0.2 s), in which a stop signal would kill it

from zmqrl import config as config_mod  # noqa: E402
from zmqrl.config import Config, ConfigError  # noqa: E402
from zmqrl.roles.common import EXIT_ADDRESS_IN_USE, endpoint  # noqa: E402
from zmqrl.run.checkpoint import CheckpointError  # noqa: E402
from zmqrl.run.record import setup_logging  # noqa: E402
from zmqrl.wire import SocketSetupError  # noqa: E402

log = logging.getLogger("zmqrl")


def _add_config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", nargs="?", help="YAML config file (defaults when omitted)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config value, e.g. --set agent.lr=3e-4 (repeatable)")


def _load(args: argparse.Namespace, extra: list[str] | None = None) -> Config:
    cfg = config_mod.load(args.config, list(extra or []) + args.overrides)
    setup_logging(cfg.run.log_level, getattr(args, "role_label", args.command))
    return cfg


def cmd_train(args: argparse.Namespace) -> int:
    from zmqrl.run.train import train

    cfg = _load(args)
    summary = train(cfg, args.run_dir, resume=args.resume)
    interrupted = summary["stop_reason"] == "interrupted"
    return 130 if interrupted and args.strict_exit else 0


def cmd_learner(args: argparse.Namespace) -> int:
    cfg = _load(args)
    net = cfg.net
    data = endpoint(args.bind_data, net.bind_host, net.data_port, "--bind-data", bind=True,
                    host_key="net.bind_host", port_key="net.data_port")
    model = endpoint(args.bind_model, net.bind_host, net.model_port, "--bind-model", bind=True,
                     host_key="net.bind_host", port_key="net.model_port")
    evals = endpoint(args.bind_eval, net.bind_host, net.eval_port, "--bind-eval", bind=True,
                     host_key="net.bind_host", port_key="net.eval_port")
    from zmqrl.roles.learner import run_learner

    return run_learner(cfg, args.run_dir, data, model, evals, resume=args.resume)


def cmd_proxy(args: argparse.Namespace) -> int:
    cfg = _load(args)
    net = cfg.net
    bind = endpoint(args.bind, net.bind_host, net.proxy_port, "--bind", bind=True,
                    host_key="net.bind_host", port_key="net.proxy_port")
    learner = endpoint(args.learner, net.learner_host, net.data_port, "--learner",
                       host_key="net.learner_host", port_key="net.data_port")
    host = learner.split("://", 1)[-1].rsplit(":", 1)[0]
    models = endpoint(args.models, host, net.model_port, "--models", host_key="the --learner host",
                      port_key="net.model_port")
    from zmqrl.roles.proxy import run_proxy

    return run_proxy(cfg, bind, learner, name=args.name, run_dir=args.run_dir, model_addr=models)


def cmd_actor(args: argparse.Namespace) -> int:
    cfg = _load(args)
    net = cfg.net
    if not 0 <= args.id < cfg.actor.num_actors:
        raise ConfigError(f"--id {args.id} is outside 0..{cfg.actor.num_actors - 1}: ids run from 0 to "
                          f"actor.num_actors - 1 (actor.num_actors={cfg.actor.num_actors}, the total over every "
                          "host; set it with --set actor.num_actors=N)")
    proxy = endpoint(args.proxy, net.proxy_host, net.proxy_port, "--proxy",
                     host_key="net.proxy_host", port_key="net.proxy_port")
    model = endpoint(args.learner, net.learner_host, net.model_port, "--learner",
                     host_key="net.learner_host", port_key="net.model_port")
    from zmqrl.roles.actor import run_actor

    return run_actor(cfg, args.id, proxy, model, run_dir=args.run_dir)


def cmd_evaluator(args: argparse.Namespace) -> int:
    cfg = _load(args)
    net = cfg.net
    model = endpoint(args.learner, net.learner_host, net.model_port, "--learner",
                     host_key="net.learner_host", port_key="net.model_port")
    host = model.split("://", 1)[-1].rsplit(":", 1)[0]
    report = endpoint(args.report, host, net.eval_port, "--report", host_key="the --learner host",
                      port_key="net.eval_port")
    from zmqrl.roles.evaluator import run_evaluator

    return run_evaluator(cfg, model, report, run_dir=args.run_dir)


def cmd_local(args: argparse.Namespace) -> int:
    from zmqrl.cli.cluster import config_from_run_dir
    from zmqrl.roles.local import run_local

    config_from_run_dir(args)
    cfg = _load(args, [f"actor.num_actors={args.actors}"])
    return run_local(cfg, args.config, args.overrides, args.actors, args.run_dir, evaluator=not args.no_evaluator,
                     resume=args.resume, max_restarts=args.max_restarts, fail_fast=args.fail_fast)


def build_parser() -> tuple[argparse.ArgumentParser, dict[str, Callable[[argparse.Namespace], int]]]:
    parser = argparse.ArgumentParser(prog="zmqrl", description="Distributed off-policy RL on ZeroMQ.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    handlers: dict[str, Callable[[argparse.Namespace], int]] = {}

    p = sub.add_parser("train", help="train in one process (no sockets)")
    _add_config_args(p)
    p.add_argument("--run-dir", help="run directory (default runs/<name>-<time>)")
    p.add_argument("--resume", action="store_true", help="continue from RUN_DIR/checkpoints/latest")
    p.add_argument("--strict-exit", action="store_true", help="exit 130 when interrupted")
    handlers["train"] = cmd_train

    addr_help = ("tcp://HOST:PORT, HOST:PORT or HOST (the port then comes from the config's net section); HOST "
                 "a host name, an IPv4 address or a bracketed IPv6 one, PORT 1..65535")
    bind_help = f"{addr_help}; binding, HOST may also be * or 0.0.0.0 (every interface) and PORT 0 (a free one)"
    p = sub.add_parser("learner", help="the learner: replay, optimisation, model publication")
    _add_config_args(p)
    p.add_argument("--run-dir", help="run directory (default runs/<name>-<time>)")
    p.add_argument("--bind-data", metavar="ADDR", help=f"PULL for batches from proxies; {bind_help}")
    p.add_argument("--bind-model", metavar="ADDR", help=f"PUB for model versions; {bind_help}")
    p.add_argument("--bind-eval", metavar="ADDR", help=f"PULL for evaluator reports; {bind_help}")
    p.add_argument("--resume", action="store_true", help="continue from RUN_DIR/checkpoints/latest")
    handlers["learner"] = cmd_learner

    p = sub.add_parser("proxy", help="forward batches from a host's actors to the learner")
    _add_config_args(p)
    p.add_argument("--bind", metavar="ADDR", help=f"PULL that actors connect to; {bind_help}")
    p.add_argument("--learner", metavar="ADDR", help=f"the learner's data address; {addr_help}")
    p.add_argument("--models", metavar="ADDR", help="the learner's model address, to hear when the run is "
                                                    "over (default: the learner's host and net.model_port)")
    p.add_argument("--name", default="proxy", help="name in the learner's stats (one per proxy)")
    p.add_argument("--run-dir", help="where to write roles/NAME.json at exit (optional)")
    handlers["proxy"] = cmd_proxy

    p = sub.add_parser("actor", help="step envs and send transitions to a proxy")
    _add_config_args(p)
    p.add_argument("--id", type=int, required=True, help="actor index 0..N-1 (sets its seed and epsilon)")
    p.add_argument("--proxy", metavar="ADDR", help=f"the proxy's address; {addr_help}")
    p.add_argument("--learner", metavar="ADDR", help=f"the learner's model address; {addr_help}")
    p.add_argument("--run-dir", help="where to write roles/actor-ID.json at exit (optional)")
    handlers["actor"] = cmd_actor

    p = sub.add_parser("evaluator", help="evaluate new model versions greedily and keep the best")
    _add_config_args(p)
    p.add_argument("--learner", metavar="ADDR", help=f"the learner's model address; {addr_help}")
    p.add_argument("--report", metavar="ADDR", help="the learner's evaluation address (default: the "
                                                   "learner's host and net.eval_port)")
    p.add_argument("--run-dir", help="where checkpoints/best goes (optional)")
    handlers["evaluator"] = cmd_evaluator

    p = sub.add_parser("local", help="run every role on this machine as separate, supervised processes")
    _add_config_args(p)
    p.add_argument("--actors", type=int, default=2, help="number of actor processes (default 2)")
    p.add_argument("--run-dir", help="run directory (default runs/<name>-<time>)")
    p.add_argument("--no-evaluator", action="store_true", help="run without the evaluator")
    p.add_argument("--resume", action="store_true", help="continue the run in RUN_DIR from checkpoints/latest "
                                                         "(CONFIG defaults to RUN_DIR/config.yaml)")
    from zmqrl.cli.cluster import add_supervision_args
    from zmqrl.cli.cluster import register as register_cluster

    add_supervision_args(p)
    handlers["local"] = cmd_local
    register_cluster(sub, handlers)
    from zmqrl.bench.soak import register as register_soak
    from zmqrl.cli.keys import register as register_keygen

    register_keygen(sub, handlers)
    register_soak(sub, handlers)
    from zmqrl.bench import register as register_bench

    register_bench(sub, handlers)
    from zmqrl.cli import config as config_cli
    from zmqrl.tools import enjoy, plot
    for module in (plot, enjoy, config_cli):
        module.register(sub, handlers)
    return parser, handlers


def main(argv: list[str] | None = None) -> int:
    if _signal_aware_process(argv):  # stop signals are remembered from its start and ignored once its work is done
        catch_stop_signals_early()
        try:
            return _main(argv)
        finally:
            ignore_stop_signals()
    return _main(argv)


def _main(argv: list[str] | None) -> int:
    parser, handlers = build_parser()
    args = parser.parse_args(argv)
    try:
        return handlers[args.command](args)
    except ConfigError as exc:
        print(f"zmqrl {args.command}: config error: {exc}", file=sys.stderr)
        return 2
    except SocketSetupError as exc:
        print(f"zmqrl {args.command}: {exc}", file=sys.stderr)
        return EXIT_ADDRESS_IN_USE if exc.address_in_use else 2
    except CheckpointError as exc:
        print(f"zmqrl {args.command}: checkpoint error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"zmqrl {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
