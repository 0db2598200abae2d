"""The run configuration's schema: one dataclass per section, a comment per field (its meaning).

The same schema checks YAML files, command-line overrides, the resolved ``config.yaml`` written
to the run directory and the hyperparameter table in TensorBoard (:mod:`zmqrl.config.load`). A
leaf: algorithms import :class:`AgentConfig` from here, and an algorithm's own ``agent:`` section
is found by name in :mod:`zmqrl.config.algorithms`, which imports nothing of zmqrl.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar


class ConfigError(ValueError):
    """A configuration problem, with a message that names the key and the file."""


@dataclass
class RunConfig:
    """What this run is and where it writes."""

    name: str = "run"  # a label for logs and the summary
    seed: int = 0  # base seed: envs, networks, replay sampling and actors derive theirs from it
    device: str = "cpu"  # torch device of the learner: cpu, cuda, cuda:1, or auto
    torch_threads: int = 1  # CPU threads of the learner's torch (and `zmqrl train`'s); 1 leaves other cores to actors
    run_dir: str = ""  # run directory; empty means runs/<name>-<timestamp>
    log_level: str = "info"  # debug, info, warning, error
    trackers: list[str] = field(default_factory=lambda: ["tensorboard"])  # any of tensorboard, mlflow, wandb
    mlflow_uri: str = ""  # MLflow tracking server; empty: $MLFLOW_TRACKING_URI
    mlflow_experiment: str = ""  # MLflow experiment; empty: run.name
    wandb_project: str = "zmqrl"  # W&B project
    wandb_entity: str = ""  # W&B team or user; empty: $WANDB_ENTITY or the account's default
    wandb_mode: str = "offline"  # offline (files in RUN_DIR/wandb; `wandb sync` uploads), online, disabled
    artifact_max_mb: float = 100.0  # MLflow and W&B: run-directory files larger than this are not sent


@dataclass
class EnvConfig:
    """Which environment to build and how."""

    id: str = "CartPole-v1"  # gymnasium id
    kwargs: dict[str, Any] = field(default_factory=dict)  # passed to gymnasium.make
    wrappers: list[str] = field(default_factory=list)  # applied in order: atari, frame_stack, ...
    num_envs: int = 4  # envs stepped together, one batched forward per step
    max_episode_steps: int | None = None  # overrides the registered time limit
    frame_stack: int = 4  # frames stacked by the frame_stack wrapper
    backend: str = "auto"  # gymnasium, envpool, or auto: EnvPool for Atari ids where it is installed
    threads: int = 1  # EnvPool worker threads per process (one actor per core: 1)
    batch: int = 0  # EnvPool: act for the `batch` envs that are ready while the rest step (async); 0: all, each step
    fn: str = ""  # callables file of an env factory (run_local(cfg, env=...) writes it); env.id is then a label
    wrappers_fn: str = ""  # a callables file of wrappers, each env -> env, applied after env.wrappers
    reward_scale: float | str = 1.0  # rewards times this at each update (returns stay the game's); auto: to reward_rms
    reward_rms: float | None = None  # RMS of stored rewards the config was tuned at: auto's target; 10x off warns


@dataclass
class AgentConfig:
    """Fields every algorithm has; each algorithm's section subclasses this (``agent.algo`` picks it).

    Class attributes ``CHOICES``, ``POSITIVE``, ``UNIT_INTERVAL`` and ``NON_NEGATIVE`` of a subclass
    name its own keys (without ``agent.``) for the range checks; ``SEQUENCES`` says that the algorithm
    trains on sequence items (``replay.sequence_length`` > 0) rather than on transitions.
    """

    algo: str = "dqn"  # the algorithm: a name from `zmqrl config` (zmqrl.config.algorithms.ALGORITHMS)
    gamma: float = 0.99  # discount factor
    n_step: int = 3  # n-step returns
    batch_size: int = 64  # items (transitions, or sequences for R2D2) per optimisation step
    compile: str = "auto"  # learner updates: graph (one CUDA graph each), none (eager), auto (graph on CUDA, else none)
    network_fn: str = ""  # callables file of a torch torso under the algorithm's heads (network=...); acts with torch

    CHOICES: ClassVar[dict[str, tuple[str, ...]]] = {}
    POSITIVE: ClassVar[tuple[str, ...]] = ()
    UNIT_INTERVAL: ClassVar[tuple[str, ...]] = ()
    NON_NEGATIVE: ClassVar[tuple[str, ...]] = ()
    SEQUENCES: ClassVar[bool] = False


def agent_config_class(algo: str) -> type[AgentConfig]:
    """The ``agent:`` dataclass of an algorithm (looked up in the registry, torch-free)."""
    from zmqrl.config.algorithms import config_class

    return config_class(algo)


def _default_agent() -> AgentConfig:
    return agent_config_class("dqn")()


@dataclass
class ReplayConfig:
    """The replay buffer on the learner."""

    capacity: int = 100_000  # items kept: transitions, or sequence items for a recurrent agent
    prioritized: bool = True  # prioritized replay (sum-tree) instead of uniform
    alpha: float = 0.6  # priority exponent
    beta0: float = 0.4  # initial importance-sampling exponent
    beta_steps: int = 20_000  # optimisation steps over which beta anneals to 1
    priority_eps: float = 1e-6  # added to |td error| before the exponent
    dedup_frames: bool = True  # store each distinct uint8 image frame of obs/next_obs once
    compress: str = "none"  # none, lz4 or zstd: replay's frames kept compressed in host memory (unpacked to sample)
    device: str = "auto"  # where replay keeps items, gathers batches: cpu, cuda, auto (the learner's if CUDA, else cpu)
    sequence_length: int = 0  # trained steps per sequence item of a recurrent agent (R2D2: 80); 0: transitions
    burn_in: int = 40  # steps before each sequence that only warm up the recurrent state, untrained (R2D2: 40)
    overlap: int = 40  # steps each sequence shares with the next: one starts every sequence_length - overlap steps


@dataclass
class TrainerConfig:
    """Intervals and limits shared by the single-process trainer and the learner."""

    warmup: int = 1000  # items (transitions, or sequence items) in replay before optimisation starts
    opt_interval: int = 1  # env steps (sequence items for sequences) per optimisation step, single-process only
    max_opts: int = 50_000  # optimisation steps, then stop
    max_seconds: float = 0.0  # wall-clock limit in seconds; 0 means none
    stop_return: float | None = None  # stop as soon as an evaluation mean reaches this
    eval_interval: int = 1000  # optimisation steps between evaluations
    eval_episodes: int = 10  # greedy episodes per evaluation
    eval_seeds: list[int] = field(default_factory=list)  # [] = fresh each evaluation; else one per episode, each time
    eval_epsilon: float = 0.0  # chance of a random action when evaluating (Atari: 0.001, so no game stalls)
    record_interval: int = 100  # optimisation steps between records (train/, perf/, cost/)
    save_interval: int = 10_000  # optimisation steps between numbered checkpoints; 0 disables
    latest_interval_s: float = 60.0  # seconds between refreshes of checkpoints/latest; 0 = only at save_interval
    checkpoint_replay: bool = False  # also save replay contents (copied in memory, written off the training loop)
    sync_interval: int = 50  # optimisation steps between model publications (distributed)
    max_policy_lag: int = 0  # on-policy (impala, appo): segments more versions old than this are dropped; 0 = none
    max_samples_per_insert: float = 0.0  # learner waits for data above this ratio (items sampled / inserted); 0 = off
    min_samples_per_insert: float = 0.0  # learner stops taking data below this ratio (actors block); 0 = off


@dataclass
class ActorConfig:
    """Distributed actors (Ape-X style)."""

    n_buffer: int = 256  # items (transitions, or sequence items) per message sent to the proxy
    eps: float = 0.4  # base exploration rate eps
    eps_alpha: float = 7.0  # actor i of N explores with eps ** (1 + eps_alpha * i / (N - 1))
    eps_decay_steps: int = 0  # each actor starts at agent.eps_start and reaches its eps above after this many
    #                           of its own env steps (linearly); 0 = its eps from the first step, as in Ape-X
    num_actors: int = 2  # N in the formula above; the local launcher sets it
    eps_per_env: bool = False  # the formula over env slots, not actors: actor i's env j is i * env.num_envs + j
    compute_priorities: bool = True  # send initial priorities computed with the local model
    send_hwm: int = 16  # batches queued towards the proxy before send blocks
    backend: str = "auto"  # policy forward in actors and the evaluator: auto (numpy for MLPs), numpy, torch
    device: str = "cpu"  # where an actor's policy runs: cpu, or cuda (cuda:N, auto): its forward on the host's GPU
    nice: int = 0  # raise the actor process's niceness so the learner wins a shared CPU (0 = unchanged)


@dataclass
class NetConfig:
    """Addresses, ports and socket limits of a distributed run."""

    learner_host: str = "127.0.0.1"  # where actors, proxies and evaluators find the learner
    proxy_host: str = "127.0.0.1"  # where actors find their proxy
    bind_host: str = "127.0.0.1"  # interface the learner and proxy bind on (0.0.0.0 = all)
    data_port: int = 5555  # learner PULL (proxies connect here); 0 picks a free port
    model_port: int = 5556  # learner PUB of model versions; 0 picks a free port
    proxy_port: int = 5557  # proxy PULL (actors connect here); 0 picks a free port
    eval_port: int = 5558  # learner PULL for evaluator reports; 0 picks a free port
    snapshot_port: int = 5559  # learner ROUTER: a joiner asks here for the newest model and control; 0 picks a free one
    relay: bool = True  # actors take models and control from their host's relay (once per host); false: the learner's
    max_message_mb: float = 256.0  # messages larger than this are refused
    heartbeat_ms: int = 500  # ZeroMQ heartbeat interval on model and evaluation links
    heartbeat_timeout_ms: int = 2000  # peer considered gone after this silence
    data_keepalive_s: int = 60  # data links (no heartbeats) drop a silent peer after about this many seconds
    republish_s: float = 30.0  # the learner sends its model again this often (a role also asks for one it missed)
    stats_interval_s: float = 2.0  # roles report counters this often
    peer_wait_s: float = 0.0  # give up waiting for a peer after this; 0 waits forever
    max_peers: int = 1024  # senders a learner or proxy keeps counters for; newcomers beyond are refused and counted
    peer_idle_s: float = 600.0  # a sender silent this long may be forgotten to make room for a new one
    proxy_hold_ms: float = 10.0  # a proxy reads its actors' batches in bursts this far apart (0: each at once)
    proxy_merge: int = 32  # a proxy joins up to this many batches of a burst into one message (1: each as it came)
    compress: str = "none"  # none, lz4 or zstd: image frames of batches compressed on the wire
    security: str = "none"  # none, or curve: CurveZMQ encryption plus a client-key allow-list on every socket
    keys_dir: str = ""  # directory of key files made by `zmqrl keygen` (needed for curve)
    server_key: str = "server"  # key pair that sockets which bind (learner, proxy) use: KEYS_DIR/NAME.key(_secret)
    client_key: str = ""  # this process's key pair for sockets that connect; empty: the server_key pair
    allowed_clients_dir: str = ""  # public keys (*.key) servers admit; empty: KEYS_DIR/clients


@dataclass
class Config:
    """A whole run."""

    run: RunConfig = field(default_factory=RunConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    agent: AgentConfig = field(default_factory=_default_agent)
    replay: ReplayConfig = field(default_factory=ReplayConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    actor: ActorConfig = field(default_factory=ActorConfig)
    net: NetConfig = field(default_factory=NetConfig)


CHOICE_KEYS: dict[str, tuple[str, ...]] = {
    "run.log_level": ("debug", "info", "warning", "error"),
    "run.wandb_mode": ("offline", "online", "disabled"),
    "actor.backend": ("auto", "numpy", "torch"),
    "net.security": ("none", "curve"),
    "net.compress": ("none", "lz4", "zstd"),
    "replay.compress": ("none", "lz4", "zstd"),
    "replay.device": ("auto", "cpu", "cuda"),
    "env.backend": ("auto", "gymnasium", "envpool"),
    "agent.compile": ("auto", "none", "graph"),
}
POSITIVE_KEYS = {
    "run.torch_threads", "run.artifact_max_mb",
    "env.num_envs", "env.frame_stack", "env.threads", "agent.gamma", "agent.n_step", "agent.batch_size",
    "replay.capacity", "replay.beta_steps",
    "trainer.opt_interval", "trainer.max_opts", "trainer.eval_interval", "trainer.eval_episodes",
    "trainer.record_interval", "trainer.sync_interval", "actor.n_buffer", "actor.num_actors",
    "actor.send_hwm", "net.max_message_mb", "net.heartbeat_ms", "net.heartbeat_timeout_ms",
    "net.republish_s", "net.stats_interval_s", "net.data_keepalive_s", "net.max_peers", "net.proxy_merge",
}
UNIT_INTERVAL_KEYS = {"agent.gamma", "replay.alpha", "replay.beta0", "actor.eps", "trainer.eval_epsilon"}
NON_NEGATIVE_KEYS = {"trainer.warmup", "trainer.save_interval", "trainer.max_seconds", "trainer.max_samples_per_insert",
                 "trainer.min_samples_per_insert", "trainer.max_policy_lag", "actor.nice", "trainer.latest_interval_s",
                 "actor.eps_alpha",
                 "actor.eps_decay_steps", "replay.sequence_length", "replay.burn_in", "replay.overlap",
                 "net.peer_wait_s", "net.peer_idle_s", "net.proxy_hold_ms"}
