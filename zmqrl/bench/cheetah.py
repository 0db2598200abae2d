"""Cheetah group: HalfCheetah's greedy return after the same wall time, APPO against SB3's PPO.

``zmqrl local configs/halfcheetah_appo.yaml --actors 2`` trains for ``solve_budget_s`` seconds
(``trainer.max_seconds``; 600 in a full run), its evaluator scoring the greedy policy every
``trainer.eval_interval`` optimisation steps (the config's, scaled down for a shorter budget); the
rows take its last and its best evaluation from ``summary.json``. With ``--sb3``, then, on the same
machine, Stable-Baselines3's PPO with rl-baselines3-zoo's HalfCheetah hyperparameters (``normalize:
true``: VecNormalize of observations and rewards) trains in the interpreter ``--sb3-python`` names
until that many seconds after its process started, and its policy is scored greedily once, over the
same number of episodes, with the VecNormalize statistics frozen. Goal: zmqrl's greedy return at
least :data:`GOAL` times SB3's (no ratio, and no verdict, while SB3's return is not positive).
The two runs take 2 x ``solve_budget_s`` (20 minutes in a full run); the group runs only with ``--sb3``.

    zmqrl bench --only cheetah --sb3 --sb3-python /tmp/sb3venv/bin/python
"""

from __future__ import annotations

import json
from typing import Any

from zmqrl.bench.harness import (
    BenchError,
    Context,
    Procs,
    Row,
    load_config,
    make_row,
    skipped_row,
    timed_launcher,
    wait_launcher,
    zmqrl_argv,
)
from zmqrl.bench.solve import sb3_interpreter
from zmqrl.run.rundir import read_json

CONFIG = "halfcheetah_appo.yaml"
GOAL = 1.5  # zmqrl's greedy return, at least this many times SB3's
FULL_S = 600.0  # the budget the config's eval_interval is sized for (an evaluation about every 30 s)
ENV_ID = "HalfCheetah-v5"
SB3_STEPS = 1_000_000  # rl-zoo's n_timesteps (the wall-clock stop comes first on 2 cores)
SB3_KWARGS: dict[str, Any] = {  # rl-zoo hyperparams/ppo.yml, HalfCheetah-v3 (SB3's defaults otherwise)
    "n_steps": 512, "batch_size": 64, "gamma": 0.98, "learning_rate": 2.0633e-05, "ent_coef": 0.000401762,
    "clip_range": 0.1, "n_epochs": 20, "gae_lambda": 0.92, "max_grad_norm": 0.8, "vf_coef": 0.58096,
    "policy_kwargs": {"log_std_init": -2, "ortho_init": False, "activation_fn": "ReLU",
                      "net_arch": {"pi": [256, 256], "vf": [256, 256]}},
}
SB3_SOURCE = ("rl-zoo PPO HalfCheetah-v3: normalize true (VecNormalize, its gamma 0.98), 1 env, n_steps 512, "
              "batch 64, 20 epochs, gamma 0.98, gae_lambda 0.92, lr 2.0633e-5, clip 0.1, ent_coef 0.000401762, "
              "vf_coef 0.58096, max_grad_norm 0.8, log_std_init -2, no ortho init, ReLU [256, 256] pi and vf")

_SB3_SCRIPT = r'''
import json, sys, time
start = time.monotonic()
import torch
torch.set_num_threads(1)
import stable_baselines3
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.evaluation import evaluate_policy
from stable_baselines3.common.vec_env import VecNormalize

spec = json.loads(sys.argv[1])
seed = spec["seed"]
kwargs = dict(spec["kwargs"])
policy_kwargs = dict(kwargs.pop("policy_kwargs", {}))
if "activation_fn" in policy_kwargs:
    policy_kwargs["activation_fn"] = getattr(torch.nn, policy_kwargs["activation_fn"])


class StopAtWall(BaseCallback):
    """Stop training once this process has run spec["seconds"] (its imports included)."""

    def _on_step(self):
        return time.monotonic() - start < spec["seconds"]


env = VecNormalize(make_vec_env(spec["env"], n_envs=1, seed=seed), norm_obs=True, norm_reward=True,
                   gamma=kwargs["gamma"])
algo = getattr(stable_baselines3, spec["algo"])
model = algo("MlpPolicy", env, seed=seed, device="cpu", verbose=0, policy_kwargs=policy_kwargs, **kwargs)
model.learn(total_timesteps=spec["steps"], callback=StopAtWall())
trained_s = time.monotonic() - start
eval_env = VecNormalize(make_vec_env(spec["env"], n_envs=1, seed=seed + 1_000_000), training=False,
                        norm_obs=True, norm_reward=False, gamma=kwargs["gamma"])
eval_env.obs_rms = env.obs_rms.copy()  # frozen: the training run's statistics
returns, lengths = evaluate_policy(model, eval_env, n_eval_episodes=spec["episodes"], deterministic=True,
                                   return_episode_rewards=True)
with open(spec["out"], "w") as fh:
    json.dump({"return_mean": float(sum(returns) / len(returns)), "returns": [float(r) for r in returns],
               "env_steps": int(model.num_timesteps), "trained_s": trained_s,
               "wall_s": time.monotonic() - start}, fh)
'''


def eval_interval(configured: int, budget_s: float) -> int:
    """``trainer.eval_interval`` for a run of ``budget_s``: the config's (sized for :data:`FULL_S`), scaled
    down in proportion for a shorter budget so that it still evaluates about as many times."""
    return max(1, round(configured * min(1.0, budget_s / FULL_S)))


def _zmqrl_run(c: Context, budget_s: float, interval: int) -> dict[str, Any]:
    """``zmqrl local --actors 2`` for ``budget_s`` seconds; its summary, with the launcher's wall time added."""
    path = c.configs(CONFIG)[0]
    run_dir = c.path("cheetah-local")
    argv = zmqrl_argv("local", str(path), "--actors", "2", "--run-dir", str(run_dir),
                      "--set", f"trainer.max_seconds={budget_s:g}", "--set", f"trainer.eval_interval={interval}")
    wall, summary = timed_launcher(c, "cheetah-local", argv, run_dir, budget_s + 120.0)
    return {**summary, "launcher_s": wall}


def _sb3_run(c: Context, python: str, budget_s: float, episodes: int) -> dict[str, Any]:
    """SB3's PPO for ``budget_s`` seconds from its process start, then one greedy evaluation; its result."""
    out = c.path("cheetah-sb3.json")
    spec = {"algo": "PPO", "env": ENV_ID, "kwargs": SB3_KWARGS, "steps": SB3_STEPS, "seed": 0,
            "seconds": budget_s, "episodes": episodes, "out": str(out)}
    with Procs(c.logs) as procs:
        proc = procs.start("cheetah-sb3", [python, "-c", _SB3_SCRIPT, json.dumps(spec)])
        code = wait_launcher(proc, budget_s + 300.0)
    result = read_json(out)
    if code != 0 or result is None:
        raise proc.failure("the Stable-Baselines3 run failed")
    return result


def describe_local(summary: dict[str, Any], interval: int, minibatches: int) -> str:
    """The zmqrl run's figures: its evaluations, env steps, updates, wall time."""
    evals = summary.get("evals") or []
    last = evals[-1] if evals else {}
    trail = ", ".join(f"{e['wall_s']:.0f} s: {e['return_mean']:.0f}" for e in evals)
    updates = int(summary.get("opt_steps", 0))
    return (f"`zmqrl local --actors 2` {summary.get('wall_s', 0):.0f} s of training "
            f"({summary.get('launcher_s', 0):.0f} s launch -> exit), {summary.get('env_steps', 0):,} env steps, "
            f"{updates:,} updates ({updates * minibatches:,} gradient steps), {summary.get('evals_total', len(evals))} "
            f"greedy evaluations every {interval:,} updates (last at {last.get('wall_s', 0):.0f} s, "
            f"{last.get('env_steps', 0):,} env steps); returns by training time: {trail}")


def describe_sb3(result: dict[str, Any]) -> str:
    returns = ", ".join(f"{r:.0f}" for r in result["returns"])
    return (f"SB3 PPO ({SB3_SOURCE}) {result['trained_s']:.0f} s from process start, {result['env_steps']:,} env "
            f"steps, then {len(result['returns'])} greedy episodes with VecNormalize frozen: {returns}")


def cheetah_rows(summary: dict[str, Any], sb3: dict[str, Any], note: str) -> list[Row]:
    """zmqrl's last and best greedy return against SB3's (goal >= :data:`GOAL`; no ratio while SB3's is not
    positive) and the env steps each took (reported)."""
    goal = (">=", GOAL)
    baseline = float(sb3["return_mean"])
    if baseline <= 0:
        note = f"SB3's return is not positive: no ratio; {note}"
    return [make_row("cheetah_appo_last_vs_sb3", summary.get("last_eval_return"), baseline, "return",
                     f"zmqrl's last greedy evaluation against SB3's final one; {note}", goal),
            make_row("cheetah_appo_best_vs_sb3", summary.get("best_eval_return"), baseline, "return",
                     f"zmqrl's best greedy evaluation (of all it made) against SB3's final one; {note}", goal),
            make_row("cheetah_appo_env_steps_vs_sb3", float(summary.get("env_steps", 0)), float(sb3["env_steps"]),
                     "env steps", f"env steps in the same wall time; {note}")]


def skipped_rows(reason: str) -> list[Row]:
    """The three rows, not measured."""
    goal = (">=", GOAL)
    return [skipped_row("cheetah_appo_last_vs_sb3", "return", reason, goal),
            skipped_row("cheetah_appo_best_vs_sb3", "return", reason, goal),
            skipped_row("cheetah_appo_env_steps_vs_sb3", "env steps", reason)]


def run(c: Context) -> list[Row]:
    """The rows, with ``--sb3`` only (they compare with SB3; without it nothing runs): skipped where SB3 is not
    installed."""
    if not c.settings.sb3:
        return []
    budget = c.settings.solve_budget_s
    cfg = load_config(c.configs(CONFIG)[0])
    if cfg.env.id != ENV_ID or cfg.agent.algo != "appo":
        raise BenchError(f"the cheetah rows compare APPO on {ENV_ID} with SB3's PPO; got {cfg.agent.algo} on "
                         f"{cfg.env.id}")
    python = sb3_interpreter(c)
    if python is None:
        return skipped_rows("stable-baselines3 not installed (--sb3-python)")
    interval = eval_interval(cfg.trainer.eval_interval, budget)
    episodes = cfg.trainer.eval_episodes
    summary = _zmqrl_run(c, budget, interval)
    sb3 = _sb3_run(c, python, budget, episodes)
    what = f"HalfCheetah-v5 greedy return ({episodes} episodes) after {budget:g} s, one run after the other"
    local = describe_local(summary, interval, int(getattr(cfg.agent, "minibatches", 1)))
    note = f"{what}; {local}; {describe_sb3(sb3)}"
    return cheetah_rows(summary, sb3, note)
