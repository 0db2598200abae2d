"""Callables from Python in real runs: an env class made inside a test function solved through ``run_local``
with two actors (every role loads it from the run directory), played again through ``zmqrl.load_policy`` and
resumed from a moved run directory; a torso of the user's own trained through ``run_train``; a head and a
host whose env files differ (the host exits 2 naming both hashes, before it acts); a class from a script's
``__main__`` built in another process."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from torch import nn

import zmqrl
from procs import REPO, Procs, role_env, wait_for, zmqrl_argv
from zmqrl import callables, config
from zmqrl.roles.addresses import free_port
from zmqrl.run.rundir import read_json

pytestmark = pytest.mark.slow

CARTPOLE = REPO / "configs" / "cartpole_dqn.yaml"
CELLS = 10
# The chain below on CartPole's DQN, smaller and quicker: solved is a greedy walk to the chain's end (return 1),
# which a random network does with chance 2^-9 and the near-greedy actor's random walk rarely finds by itself.
SOLVE = ["trainer.stop_return=1.0", "trainer.warmup=200", "trainer.eval_episodes=2", "env.max_episode_steps=40",
         "agent.hidden=[64, 64]", "actor.eps_decay_steps=500", "trainer.max_opts=20000", "trainer.max_seconds=120",
         "trainer.min_samples_per_insert=8", "run.seed=0"]


def chain_cfg(*more: str) -> config.Config:
    return zmqrl.load_config(CARTPOLE, [*SOLVE, *more])


@pytest.mark.timeout(300)
def test_an_env_class_made_in_the_test_is_solved_through_run_local_with_two_actors(tmp_path: Path) -> None:
    class Chain(gym.Env):
        """Walk along a chain of cells from its first; reward 1 on reaching its last, which ends the episode."""

        observation_space = gym.spaces.Box(0.0, 1.0, (CELLS,), np.float32)
        action_space = gym.spaces.Discrete(2)  # 0: a step back (none at the first cell), 1: a step on

        def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
            super().reset(seed=seed)
            self.cell = 0
            return self._obs(), {}

        def _obs(self) -> np.ndarray:
            obs = np.zeros(CELLS, np.float32)
            obs[self.cell] = 1.0
            return obs

        def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
            self.cell = max(0, self.cell + (1 if int(action) == 1 else -1))
            end = self.cell == CELLS - 1
            return self._obs(), float(end), end, False, {}

    run_dir = tmp_path / "run"
    cfg = chain_cfg()
    started = time.monotonic()
    summary = zmqrl.run_local(cfg, actors=2, run_dir=run_dir, env=Chain)
    took = time.monotonic() - started
    print(f"\nChain of {CELLS} through run_local, 2 actors: solved in {took:.1f} s from the call "
          f"({summary['opt_steps']} opt steps, {summary['env_steps']} env steps)")
    assert summary["stop_reason"] == "evaluation reached stop_return=1.0", summary["stop_reason"]
    assert set(summary["actors"]) == {"actor-0", "actor-1"} and cfg.env.id == "Chain"
    saved = config.load(run_dir / "config.yaml")
    assert saved.env.fn == "callables/env.pkl" and saved.env.id == "Chain"

    # zmqrl enjoy's policy finds the env in the run directory and walks the chain
    policy = zmqrl.load_policy(run_dir, checkpoint="best")
    episodes = policy.play(episodes=2)
    assert episodes.returns == [1.0, 1.0] and episodes.lengths == [CELLS - 1] * 2, episodes


@pytest.mark.timeout(300)
def test_a_run_with_a_pickled_env_resumes_from_its_moved_run_directory(tmp_path: Path) -> None:
    cells = 16

    def make_lake() -> gym.Env:  # a closure over `cells`, made inside the test: FrozenLake's cell one-hot
        env = gym.make("FrozenLake-v1", map_name="4x4", is_slippery=False)
        return gym.wrappers.TransformObservation(env, lambda s: np.eye(cells, dtype=np.float32)[s],
                                                 gym.spaces.Box(0.0, 1.0, (cells,), np.float32))

    run_dir = tmp_path / "run"
    cfg = chain_cfg("trainer.stop_return=null", "trainer.max_opts=150", "trainer.latest_interval_s=1",
                    "trainer.eval_interval=100000")
    first = zmqrl.run_local(cfg, actors=1, run_dir=run_dir, env=make_lake, evaluator=False)
    assert first["opt_steps"] == 150 and cfg.env.id == "FrozenLake-v1"
    moved = tmp_path / "moved"
    run_dir.rename(moved)  # config.yaml names callables/env.pkl relative to the run directory
    out = subprocess.run([sys.executable, "-m", "zmqrl.cli", "local", "--resume", "--run-dir", str(moved),
                          "--actors", "1", "--no-evaluator", "--set", "trainer.max_opts=300"],
                         capture_output=True, text=True, timeout=240, env=role_env(), cwd=REPO)
    assert out.returncode == 0, out.stderr[-3000:]
    summary = read_json(moved / "summary.json") or {}
    assert summary["opt_steps"] == 300 and summary["stop_reason"] == "reached max_opts=300", summary
    log = (moved / "logs" / "learner.log").read_text()
    assert "resumed from" in log and "at opt step 150" in log, log[-2000:]
    assert f"make_lake ({moved / 'callables' / 'env.pkl'}, sha256" in out.stderr, out.stderr[-3000:]


def test_a_torso_of_the_users_own_trains_through_run_train(tmp_path: Path) -> None:
    def make_torso(space: gym.spaces.Box) -> nn.Module:  # observations (B, 4) -> features (B, 256)
        return nn.Sequential(nn.Linear(space.shape[0], 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU())

    # solved as the config says (475 over 10 greedy episodes); zmqrl train is reproducible from its seed: seed 0
    # solves at 2,750 opt steps (8 s), seeds 1 and 2 at 8,000 and 4,250
    cfg = zmqrl.load_config(CARTPOLE, ["trainer.max_opts=15000", "trainer.eval_interval=250", "trainer.max_seconds=150",
                                       "run.seed=0"])
    summary = zmqrl.run_train(cfg, run_dir=tmp_path / "run", network=make_torso)
    print(f"\nCartPole with a torso of the user's own through run_train: {summary['stop_reason']} at "
          f"{summary['opt_steps']} opt steps, {summary['wall_s']:.1f} s")
    assert summary["stop_reason"] == "evaluation reached stop_return=475.0", summary["stop_reason"]
    policy = zmqrl.load_policy(tmp_path / "run", checkpoint="best")
    assert type(policy.policy).__name__ == "DQNPolicy"  # torch: the torso is the user's
    assert "torso.module.0.weight" in policy.policy.params()


@pytest.mark.timeout(300)
def test_a_host_whose_env_file_differs_from_the_heads_exits_2_naming_both_hashes(tmp_path: Path,
                                                                                   procs: Procs) -> None:
    def make_env() -> gym.Env:
        return gym.make("CartPole-v1")

    def make_other() -> gym.Env:  # the same spaces, another file
        return gym.make("CartPole-v1", max_episode_steps=300)

    mine, theirs = tmp_path / "env.pkl", tmp_path / "other.pkl"
    zmqrl.save_callable(make_env, mine)
    zmqrl.save_callable(make_other, theirs)
    run_dir = tmp_path / "head"
    procs.sweep_args.append(str(run_dir))
    ports = {k: free_port() for k in ("data", "model", "eval", "snapshot")}
    overrides = ["trainer.stop_return=null", "trainer.warmup=200", "trainer.max_opts=300", "trainer.eval_interval=100",
                 "trainer.eval_episodes=2", "actor.num_actors=2", "net.stats_interval_s=0.5",
                 *(f"net.{k}_port={p}" for k, p in ports.items())]
    head = procs.start("head", zmqrl_argv("head", "--run-dir", str(run_dir), "--env-fn", str(mine),
                                          overrides=overrides))
    bad = procs.start("bad-host", zmqrl_argv("host", "--learner", "127.0.0.1", "--actors", "1", "--first-id", "1",
                                             "--name", "bad", "--run-dir", str(tmp_path / "bad"), "--env-fn",
                                             str(theirs), overrides=overrides))
    assert bad.wait(timeout=180) == 2, procs.describe()
    log = (tmp_path / "bad" / "logs" / "actor-1.log").read_text()
    mine_hash, their_hash = callables.sha256(mine), callables.sha256(theirs)
    assert (f"env.fn (the sha256 of its file): '{their_hash}' here, '{mine_hash}' at the learner" in log), log[-3000:]
    assert (read_json(tmp_path / "bad" / "roles" / "actor-1.json") or {}).get("transitions", 0) == 0

    # a host with a copy of the head's file (here: its own run directory's) acts for it until the run ends
    good = procs.start("good-host", zmqrl_argv("host", "--learner", "127.0.0.1", "--actors", "1", "--name", "good",
                                               "--run-dir", str(tmp_path / "good"), "--env-fn",
                                               str(run_dir / "callables" / "env.pkl"), overrides=overrides))
    wait_for(lambda: head.returncode is not None, 180, "the head to finish", procs.describe)
    assert head.returncode == 0 and good.wait(timeout=60) == 0, procs.describe()
    summary = read_json(run_dir / "summary.json") or {}
    assert summary["opt_steps"] == 300 and list(summary["actors"]) == ["actor-0"], summary


def test_a_class_defined_in_a_scripts_main_loads_in_another_process(tmp_path: Path) -> None:
    script = tmp_path / "notebook.py"  # as a notebook's cells run: in __main__, importable nowhere else
    script.write_text(textwrap.dedent("""
        import sys

        import gymnasium as gym
        import numpy as np

        import zmqrl

        SIDE = 3.0

        class Flip(gym.Env):
            observation_space = gym.spaces.Box(-5.0, 5.0, (2,), np.float32)
            action_space = gym.spaces.Discrete(2)

            def reset(self, *, seed=None, options=None):
                super().reset(seed=seed)
                return np.full(2, SIDE, np.float32), {}

            def step(self, action):
                return np.full(2, -SIDE, np.float32), float(action), True, False, {}

        print(zmqrl.save_callable(Flip, sys.argv[1]))
    """))
    file = tmp_path / "flip.pkl"
    wrote = subprocess.run([sys.executable, str(script), str(file)], capture_output=True, text=True, timeout=120,
                           env=role_env(), cwd=tmp_path)
    assert wrote.returncode == 0, wrote.stderr
    code = ("import sys; from zmqrl.config import EnvConfig; from zmqrl.envs.factory import make_env; "
            "env = make_env(EnvConfig(fn=sys.argv[1])); obs, _ = env.reset(seed=0); "
            "print(type(env.unwrapped).__name__, obs.tolist(), env.step(1)[1])")
    loaded = subprocess.run([sys.executable, "-c", code, str(file)], capture_output=True, text=True, timeout=120,
                            env=role_env(), cwd=REPO)
    assert loaded.returncode == 0, loaded.stderr
    assert loaded.stdout.split("\n")[0] == "Flip [3.0, 3.0] 1.0", loaded.stdout
    assert wrote.stdout.strip() == callables.sha256(file)
