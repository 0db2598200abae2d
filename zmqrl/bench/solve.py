"""Solve group: wall time to the config's ``trainer.stop_return``, per config.

``zmqrl local`` vs ``zmqrl train`` for every config, and with ``--sb3`` vs Stable-Baselines3's
peer of the config's algorithm on its env (rl-baselines3-zoo's hyperparameters) where
:data:`SB3_PEERS` has one, each peer with its own goal. SB3 runs in the interpreter ``--sb3-python``
names (its own venv): the suite itself never imports it.
"""

from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from zmqrl.bench.harness import (
    BenchError,
    Context,
    Procs,
    Row,
    load_config,
    make_row,
    median,
    skipped_row,
    timed_launcher,
    wait_launcher,
    zmqrl_argv,
)
from zmqrl.config import Config
from zmqrl.run.rundir import read_json
from zmqrl.tools.plot import read_scalars

CONFIGS = ("cartpole_dqn.yaml", "pendulum_sac.yaml", "cartpole_appo.yaml")
SB3_GOAL = 0.5  # zmqrl local's median takes at most this share of SB3's median wall time (a peer may set its own)
SAMPLE_GOAL = 2.0  # zmqrl local's median env steps to solve, at most this many times zmqrl train's
SB3_EVAL_EVERY = 1000  # env steps between SB3's greedy evaluations (and the peer's own or matched: sb3_cadences)
SB3_EVAL_EPISODES = 10


@dataclass(frozen=True)
class Sb3Peer:
    """A Stable-Baselines3 algorithm with rl-baselines3-zoo's hyperparameters for one env."""

    algo: str  # the stable_baselines3 class
    steps: int  # rl-zoo's n_timesteps: the run stops there if it has not solved
    kwargs: dict[str, Any] = field(default_factory=dict)  # given to the class; everything else is SB3's default
    source: str = ""
    n_envs: int = 1  # rl-zoo's n_envs: more than one trains on a vectorised env (make_vec_env)
    eval_every: int | None = None  # env steps between evaluations in place of the matched cadence (an
    #                                algorithm without train_freq/gradient_steps, such as PPO)
    goal: float = SB3_GOAL  # zmqrl local's median wall time, at most this share of SB3's median

    def eval_every_matched(self, eval_interval: int) -> int:
        """Env steps between evaluations that see SB3's policy as often, in optimisation steps, as
        ``trainer.eval_interval`` sees zmqrl's: SB3 trains ``gradient_steps`` every ``train_freq`` env
        steps, so this rounds up to whole training rounds (a model between rounds has not changed).
        A peer names both: SB3's defaults differ by algorithm (DQN trains 1 step every 4, SAC 1 every 1)."""
        missing = [key for key in ("train_freq", "gradient_steps") if key not in self.kwargs]
        if missing:
            raise BenchError(f"SB3 peer {self.algo} ({self.source}) does not name {', '.join(missing)}")
        rounds = math.ceil(eval_interval / int(self.kwargs["gradient_steps"]))
        return rounds * int(self.kwargs["train_freq"])


SB3_PEERS: dict[tuple[str, str], Sb3Peer] = {  # (agent.algo, env.id) -> peer
    ("dqn", "CartPole-v1"): Sb3Peer(
        "DQN", 50_000, {"learning_rate": 2.3e-3, "batch_size": 64, "buffer_size": 100_000, "learning_starts": 1000,
                        "gamma": 0.99, "target_update_interval": 10, "train_freq": 256, "gradient_steps": 128,
                        "exploration_fraction": 0.16, "exploration_final_eps": 0.04,
                        "policy_kwargs": {"net_arch": [256, 256]}},
        "rl-zoo DQN CartPole-v1"),
    ("sac", "Pendulum-v1"): Sb3Peer("SAC", 20_000, {"learning_rate": 1e-3, "train_freq": 1, "gradient_steps": 1},
                                    "rl-zoo SAC Pendulum-v1: lr 1e-3, otherwise SB3's defaults (named: one "
                                    "gradient step every env step)"),
    ("appo", "CartPole-v1"): Sb3Peer(
        "PPO", 100_000, {"n_steps": 32, "batch_size": 256, "gae_lambda": 0.8, "gamma": 0.98, "n_epochs": 20,
                         "ent_coef": 0.0, "learning_rate": "lin_1e-3", "clip_range": "lin_0.2"},
        "rl-zoo PPO CartPole-v1: 8 envs, n_steps 32, batch 256, 20 epochs, gamma 0.98, gae_lambda 0.8, "
        "ent_coef 0, linear lr 1e-3 and clip 0.2 (moonshot: 0.5x its median)",
        n_envs=8, eval_every=8192, goal=0.7),
}
LINEAR = "lin_"  # a kwarg "lin_X" is rl-zoo's linear schedule from X to 0 over the run (a callable in SB3)

_SB3_SCRIPT = r'''
import json, sys, time
start = time.monotonic()
import torch
torch.set_num_threads(1)
import gymnasium as gym
import stable_baselines3
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.evaluation import evaluate_policy

spec = json.loads(sys.argv[1])
seed, target = spec["seed"], spec["target"]
evals = []


def linear(start):
    """rl-zoo's linear schedule: ``start`` times the share of the run left."""
    return lambda progress_remaining: progress_remaining * start


prefix = spec["linear"]
kwargs = {key: linear(float(value[len(prefix):])) if isinstance(value, str) and value.startswith(prefix) else value
          for key, value in spec["kwargs"].items()}


class StopAtReturn(BaseCallback):
    """Greedy evaluation of N episodes every K env steps (all envs counted); stop at the first mean >= target."""

    def __init__(self):
        super().__init__()
        self.eval_env = gym.make(spec["env"])
        self.eval_env.reset(seed=seed + 1_000_000)
        self.next_eval = spec["eval_every"]

    def _on_step(self):
        if self.num_timesteps < self.next_eval:
            return True
        while self.next_eval <= self.num_timesteps:
            self.next_eval += spec["eval_every"]
        mean, _ = evaluate_policy(self.model, self.eval_env, n_eval_episodes=spec["eval_episodes"],
                                  deterministic=True)
        evals.append({"env_steps": self.num_timesteps, "return_mean": float(mean),
                      "wall_s": round(time.monotonic() - start, 2)})
        return mean < target


algo = getattr(stable_baselines3, spec["algo"])
env = make_vec_env(spec["env"], n_envs=spec["n_envs"], seed=seed) if spec["n_envs"] > 1 else gym.make(spec["env"])
model = algo("MlpPolicy", env, seed=seed, device="cpu", verbose=0, **kwargs)
model.learn(total_timesteps=spec["steps"], callback=StopAtReturn())
solved = next((e for e in evals if e["return_mean"] >= target), None)
with open(spec["out"], "w") as fh:
    json.dump({"solved": solved, "evals": evals, "wall_s": time.monotonic() - start}, fh)
'''


@dataclass
class SolveRun:
    """One training run to the stop return: wall time from launch to exit and what it reported."""

    kind: str
    seed: int
    wall_s: float
    solved: dict[str, Any] | None
    cap_s: float | None = None
    q_max: float | None = None  # the largest mean Q the learner recorded (train/q_mean); None for SB3


def _solve_once(c: Context, path: Path, tag: str, kind: str, seed: int, cap_s: float) -> SolveRun:
    """``zmqrl local --actors 2`` or ``zmqrl train`` with ``trainer.max_seconds`` as the cap, timed launch->exit."""
    run_dir = c.path(f"solve-{tag}-{kind}-{seed}")
    common = [str(path), "--run-dir", str(run_dir), "--set", f"run.seed={seed}",
              "--set", f"trainer.max_seconds={max(1.0, cap_s - 4):.0f}"]
    argv = zmqrl_argv("local", *common, "--actors", "2") if kind == "local" else zmqrl_argv("train", *common)
    wall, summary = timed_launcher(c, f"solve-{tag}-{kind}-{seed}", argv, run_dir, cap_s + 60.0)
    return SolveRun(kind, seed, wall, summary.get("solved"), cap_s, largest_q(run_dir))


def largest_q(run_dir: Path) -> float | None:
    """The largest ``train/q_mean`` a run wrote to TensorBoard, or None without one.

    Returns cap Q (near 100 on CartPole at gamma 0.99), so a value far past that marks a run whose
    Q-values diverged, one of the two ways a CartPole seed ends up slow (the other: slow learning
    with Q in range).
    """
    values = read_scalars(run_dir / "tb", ("train/q_mean",)).get("train/q_mean", {}).values()
    return max(values) if values else None


def sb3_interpreter(c: Context) -> str | None:
    """The interpreter that has stable_baselines3 (``--sb3-python`` or this one), or None."""
    python = c.settings.sb3_python or sys.executable
    try:
        with Procs(c.logs) as procs:
            code = procs.start("sb3-import", [python, "-c", "import stable_baselines3"]).wait(120.0)
    except OSError:
        return None
    return python if code == 0 else None


def sb3_cadences(peer: Sb3Peer, eval_interval: int) -> list[int]:
    """SB3's evaluation cadences in env steps: every SB3_EVAL_EVERY, and the peer's own
    (:attr:`Sb3Peer.eval_every`) or else as often as the zmqrl config evaluates
    (:meth:`Sb3Peer.eval_every_matched`) where that differs. Frequent evaluation finds the first
    solving model sooner but, run inline, stops SB3's training while it runs; the rows take whichever
    cadence gives SB3 the lower median."""
    own = peer.eval_every if peer.eval_every is not None else peer.eval_every_matched(eval_interval)
    return sorted({SB3_EVAL_EVERY, own})


def _sb3_once(c: Context, python: str, peer: Sb3Peer, env_id: str, target: float, tag: str, seed: int,
              eval_every: int) -> SolveRun:
    out = c.path(f"sb3-{tag}-{seed}-every{eval_every}.json")
    spec = {"algo": peer.algo, "env": env_id, "kwargs": peer.kwargs, "linear": LINEAR, "n_envs": peer.n_envs,
            "steps": peer.steps, "seed": seed, "target": target, "eval_every": eval_every,
            "eval_episodes": SB3_EVAL_EPISODES, "out": str(out)}
    with Procs(c.logs) as procs:
        start = time.monotonic()
        proc = procs.start(f"sb3-{tag}-{seed}-every{eval_every}", [python, "-c", _SB3_SCRIPT, json.dumps(spec)])
        code = wait_launcher(proc, 1800.0)
        wall = time.monotonic() - start
    result = read_json(out)
    if code != 0 or result is None:
        raise proc.failure("the Stable-Baselines3 run failed")
    return SolveRun("sb3", seed, wall, result.get("solved"))


def _env_steps(run: SolveRun) -> float | None:
    return float(run.solved["env_steps"]) if run.solved else None


def _describe(runs: list[SolveRun]) -> str:
    """Solved count, median and spread of wall time and env steps, and each seed's figures."""
    solved = [r for r in runs if r.solved]
    walls = [r.wall_s for r in runs]
    text = f"solved {len(solved)}/{len(runs)}, median {median(walls):.1f} s (range {min(walls):.1f}-{max(walls):.1f})"
    steps = [s for s in map(_env_steps, runs) if s is not None]
    if steps:
        text += f", {median(steps):,.0f} env steps (range {min(steps):,.0f}-{max(steps):,.0f})"
    per = ", ".join(f"{r.seed}: {r.wall_s:.1f} s" + (f"/{_env_steps(r):,.0f}" if r.solved else " unsolved")
                    + (f" (Q {r.q_max:,.0f})" if r.q_max is not None else "") for r in runs)
    largest = " (largest mean Q)" if any(r.q_max is not None for r in runs) else ""
    return f"{text}; per seed (s/env steps{largest}) {per}"


def _median_steps(runs: list[SolveRun]) -> float | None:
    """Median env steps to solve, counting an unsolved run at infinity (None when half or more are unsolved)."""
    steps = sorted(s if s is not None else math.inf for s in map(_env_steps, runs))
    value = median(steps)
    return value if math.isfinite(value) else None


def measure(c: Context, path: Path) -> list[Row]:
    """Wall time from launch to exit at the first greedy evaluation >= the config's stop return, and
    the env steps it took, over seeds 0..seeds-1.

    The capped runs share ``solve_budget_s``: each gets the budget left divided by the runs left,
    so a fast run leaves more to the next. A run that hits its cap counts at its wall time (a lower
    bound); the note says how many did, and a row with such a run on the zmqrl side is never met.
    """
    s = c.settings
    cfg = load_config(path)
    tag, target = cfg.run.name, cfg.trainer.stop_return
    if target is None:
        raise BenchError(f"{path.name}: trainer.stop_return is not set; the solve rows time runs to it")
    plan = [(kind, seed) for seed in range(s.seeds) for kind in ("local", "train")]
    budget_end = time.monotonic() + s.solve_budget_s
    runs: dict[str, list[SolveRun]] = {"local": [], "train": []}
    for i, (kind, seed) in enumerate(plan):
        cap = max(6.0, (budget_end - time.monotonic()) / (len(plan) - i))
        runs[kind].append(_solve_once(c, path, tag, kind, seed, cap))
    local, train = runs["local"], runs["train"]
    local_s = median([r.wall_s for r in local])
    local_done = all(r.solved for r in local)
    caps = sorted({round(r.cap_s or 0) for r in local + train})
    what = f"{path.name} ({cfg.env.id}) to a greedy eval mean >= {target:g}, launch -> exit, seeds 0..{s.seeds - 1}"
    note = (f"{what}; `zmqrl local --actors 2` {_describe(local)}; `zmqrl train` {_describe(train)}; unsolved runs "
            f"count at their capped wall time (caps {caps} s of a {s.solve_budget_s:.0f} s budget)")
    rows = [make_row(f"solve_{tag}_local_vs_train", local_s, median([r.wall_s for r in train]), "s", note),
            make_row(f"solve_{tag}_env_steps_local_vs_train", _median_steps(local), _median_steps(train), "env steps",
                     f"median env steps to solve (an unsolved run counts as infinite); {note}",
                     ("<=", SAMPLE_GOAL), complete=local_done)]
    if s.sb3:
        rows.extend(_versus_sb3(c, cfg, path, tag, target, what, local))
    return rows


def _versus_sb3(c: Context, cfg: Config, path: Path, tag: str, target: float, what: str,
                local: list[SolveRun]) -> list[Row]:
    """The median row (goal <= the peer's goal, a share of SB3's median) and the slowest-seed row (no slower than
    SB3's median)."""
    name, slowest_name = f"solve_{tag}_local_vs_sb3", f"solve_{tag}_local_slowest_vs_sb3"
    peer = SB3_PEERS.get((cfg.agent.algo, cfg.env.id))
    python = sb3_interpreter(c) if peer is not None else None
    reason = (f"no Stable-Baselines3 peer for {cfg.agent.algo} on {cfg.env.id}" if peer is None
              else "stable-baselines3 not installed (--sb3-python)" if python is None else "")
    if peer is None or python is None:
        goal = peer.goal if peer is not None else SB3_GOAL
        return [skipped_row(name, "s", reason, ("<=", goal)), skipped_row(slowest_name, "s", reason, ("<=", 1.0))]
    by_cadence = {every: [_sb3_once(c, python, peer, cfg.env.id, target, tag, seed, every)
                          for seed in range(c.settings.seeds)]
                  for every in sb3_cadences(peer, cfg.trainer.eval_interval)}
    every, sb3 = min(by_cadence.items(), key=lambda item: median([r.wall_s for r in item[1]]))
    runs = "; ".join(f"every {e:,} steps: {_describe(r)}" for e, r in by_cadence.items())
    note = (f"{what}; `zmqrl local` evaluates every {cfg.trainer.eval_interval:,} optimisation steps: "
            f"{_describe(local)}; SB3 {peer.algo} ({peer.source}), {peer.n_envs} env(s), greedy eval of "
            f"{SB3_EVAL_EPISODES} episodes, at most {peer.steps:,} steps, against its faster cadence (every "
            f"{every:,} steps): {runs}; never met while a zmqrl run is unsolved")
    return sb3_rows(tag, local, sb3, note, peer.goal)


def sb3_rows(tag: str, local: list[SolveRun], sb3: list[SolveRun], note: str, goal: float = SB3_GOAL) -> list[Row]:
    """``zmqrl local``'s median wall time against SB3's (goal <= ``goal``), and its slowest seed against
    SB3's median (goal <= 1); neither is met while a ``zmqrl local`` run is unsolved."""
    sb3_s = median([r.wall_s for r in sb3])
    local_done = all(r.solved for r in local)
    return [make_row(f"solve_{tag}_local_vs_sb3", median([r.wall_s for r in local]), sb3_s, "s", f"medians; {note}",
                     ("<=", goal), complete=local_done),
            make_row(f"solve_{tag}_local_slowest_vs_sb3", max(r.wall_s for r in local), sb3_s, "s",
                     f"the slowest `zmqrl local` seed vs SB3's median; {note}", ("<=", 1.0), complete=local_done)]


def run(c: Context) -> list[Row]:
    return [row for path in c.configs(*CONFIGS) for row in measure(c, path)]
