"""Callables from Python (an env factory, wrappers, a torso) in files: the format and its checks, envs and
torsos built from them, their hashes in the task signature, what refuses them at start, and the trust line
(only such a file, named by the config, is ever unpickled; nothing received on a socket is)."""

from __future__ import annotations

import argparse
import ast
import json
import pickle
import threading
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch import nn

import zmqrl
from zmqrl import callables, config
from zmqrl.agents.base import Algorithm
from zmqrl.cli.common import take_callables
from zmqrl.config import ConfigError, EnvConfig
from zmqrl.envs.factory import make_env, spaces
from zmqrl.roles.fit import misfit, signature_digest, task_signature
from zmqrl.run import user_callables
from zmqrl.run.acting import make_task
from zmqrl.run.rundir import CALLABLES_DIR
from zmqrl.run.startup import prepare_run_dir
from zmqrl.wire import BATCH, Limits, WireError, decode, encode

REPO = Path(__file__).resolve().parents[2]
CARTPOLE = REPO / "configs" / "cartpole_dqn.yaml"
PENDULUM = REPO / "configs" / "pendulum_sac.yaml"


def coin_env(length: int = 5, size: int = 3) -> type[gym.Env]:
    """An env class made inside a function (as in a notebook cell): cloudpickle writes it by value."""

    class Coin(gym.Env):
        observation_space = gym.spaces.Box(-1.0, 1.0, (size,), np.float32)
        action_space = gym.spaces.Discrete(2)

        def __init__(self, bonus: float = 0.0) -> None:
            self.bonus = bonus

        def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
            super().reset(seed=seed)
            self.t = 0
            return self._obs(), {}

        def _obs(self) -> np.ndarray:
            self.side = int(self.np_random.integers(2))
            return np.array([2 * self.side - 1, *([0.0] * (size - 1))], np.float32)

        def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
            reward = float(int(action) == self.side) + self.bonus
            self.t += 1
            return self._obs(), reward, False, self.t >= length, {}

    return Coin


def write(tmp_path: Path, obj: Any, kind: str = "env", name: str = "") -> Path:
    path = tmp_path / (name or f"{kind}.pkl")
    callables.write(path, obj, kind)
    return path


def torso_factory(width: int = 16) -> Any:
    def make(space: gym.spaces.Box) -> nn.Module:
        return nn.Sequential(nn.Linear(int(np.prod(space.shape)), width), nn.Tanh())
    return make


# --- the file ---------------------------------------------------------------------------------------------


def test_a_lambda_a_closure_and_a_class_from_a_function_round_trip(tmp_path: Path) -> None:
    scale = 3.0
    closure = write(tmp_path, lambda x: x * scale, "env", "closure.pkl")
    cls = write(tmp_path, coin_env(), "env", "class.pkl")
    assert callables.load(closure, "env").obj(2) == 6.0
    loaded = callables.load(cls, "env")
    assert loaded.name == "coin_env.Coin" and loaded.header["python"] == callables.python_version()
    assert loaded.sha256 == callables.sha256(cls) and len(loaded.sha256) == 64
    env = loaded.obj(bonus=0.5)
    obs, _ = env.reset(seed=0)
    assert obs.shape == (3,) and env.step(int(obs[0] > 0))[1] == 1.5


def _marker(path: str) -> None:
    Path(path).write_text("unpickled!")


class _Exploit:
    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return _marker, (self.path,)


def _file_with(tmp_path: Path, header: dict[str, Any], payload: bytes) -> Path:
    path = tmp_path / "forged.pkl"
    path.write_bytes(callables.MAGIC + json.dumps(header).encode() + b"\n" + payload)
    return path


def test_another_python_or_cloudpickle_is_refused_naming_both_before_unpickling(tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    payload = pickle.dumps(_Exploit(str(marker)))
    mine = {"python": callables.python_version(), "cloudpickle": callables.cloudpickle_version()}
    for theirs in ({"python": "3.9", "cloudpickle": mine["cloudpickle"]}, {"python": mine["python"],
                                                                        "cloudpickle": "2.0.0"}):
        path = _file_with(tmp_path, {"kind": "env", "name": "f", **theirs}, payload)
        with pytest.raises(ConfigError) as info:
            callables.load(path, "env", "env.fn")
        text = str(info.value)
        assert text.startswith(f"env.fn: {path}: written by Python {theirs['python']} with cloudpickle "
                               f"{theirs['cloudpickle']}, but this is Python {mine['python']} with cloudpickle "
                               f"{mine['cloudpickle']}"), text
    assert not marker.exists()


def test_a_plain_pickle_a_foreign_kind_or_a_broken_header_is_refused(tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    plain = tmp_path / "plain.pkl"
    plain.write_bytes(pickle.dumps(_Exploit(str(marker))))
    with pytest.raises(ConfigError, match="not a zmqrl callables file"):
        callables.load(plain, "env", "env.fn")
    torso = write(tmp_path, torso_factory(), "network")
    with pytest.raises(ConfigError, match=r"env.fn: .*network.pkl: it holds 'network' \(torso_factory.make\), "
                                          r"not 'env'"):
        callables.load(torso, "env", "env.fn")
    broken = tmp_path / "broken.pkl"
    broken.write_bytes(callables.MAGIC + b"{not json\n" + pickle.dumps(_Exploit(str(marker))))
    with pytest.raises(ConfigError, match="its header is unreadable"):
        callables.load(broken, "env")
    with pytest.raises(ConfigError, match=r"missing.pkl: cannot read it \(No such file"):
        callables.load(tmp_path / "missing.pkl", "env")
    assert not marker.exists()


def test_what_cloudpickle_cannot_pickle_or_not_a_callable_is_a_config_error(tmp_path: Path) -> None:
    lock = threading.Lock()
    cfg = zmqrl.load_config(CARTPOLE)
    with pytest.raises(ConfigError, match="env=: cannot be pickled with cloudpickle"):
        user_callables.save(cfg, tmp_path, {"env": lambda: lock})
    with pytest.raises(ConfigError, match="network: expected a callable returning a torch module"):
        user_callables.save(cfg, tmp_path, {"network": nn.Linear(3, 4).weight})
    with pytest.raises(ConfigError, match="wrappers: each must be a callable"):
        zmqrl.save_callable([lambda env: env, 3], tmp_path / "w.pkl", kind="wrappers")


# --- envs from a file ----------------------------------------------------------------------------------------


def test_make_env_calls_the_factory_with_kwargs_under_the_time_limit_then_every_wrapper(tmp_path: Path) -> None:
    env_file = write(tmp_path, coin_env(length=50))
    wrappers = write(tmp_path, [lambda env: gym.wrappers.TransformReward(env, lambda r: 10 * r)], "wrappers")
    cfg = EnvConfig(id="label", fn=str(env_file), kwargs={"bonus": 0.5}, max_episode_steps=4,
                    wrappers=["float32_obs"], wrappers_fn=str(wrappers))
    env = make_env(cfg)
    obs, _ = env.reset(seed=1)
    rewards, truncated = [], False
    while not truncated:
        obs, reward, _, truncated, _ = env.step(int(obs[0] > 0))
        rewards.append(reward)
    assert rewards == [15.0] * 4  # right each time, 1 + 0.5 bonus, times 10; the time limit at 4, not 50
    assert isinstance(env, gym.wrappers.TransformReward) and isinstance(env.env, gym.wrappers.DtypeObservation)
    assert spaces(cfg)[1] == gym.spaces.Discrete(2)


def test_an_env_factory_that_fails_or_returns_no_env_names_the_key_and_the_file(tmp_path: Path) -> None:
    def broken() -> gym.Env:
        raise RuntimeError("no such level")

    with pytest.raises(ConfigError, match=r"env.fn: test_an_env_.*_the_file.broken from .*env.pkl raised "
                                          r"RuntimeError: no such level") as info:
        make_env(EnvConfig(fn=str(write(tmp_path, broken))))
    assert isinstance(info.value.__cause__, RuntimeError)  # the user's traceback stays reachable
    with pytest.raises(ConfigError, match="env.fn: .*<lambda> from .*returned int, not a gymnasium Env"):
        make_env(EnvConfig(fn=str(write(tmp_path, lambda: 3, name="int.pkl"))))
    with pytest.raises(ConfigError, match="env.backend: envpool runs Atari ids; the env of env.fn"):
        make_env(EnvConfig(fn=str(write(tmp_path, coin_env(), name="coin.pkl")), backend="envpool"))


def test_an_env_that_does_not_fit_the_algorithm_is_refused_at_start_before_any_process(tmp_path: Path) -> None:
    def box_env() -> gym.Env:
        return gym.make("Pendulum-v1")

    cfg = zmqrl.load_config(CARTPOLE)
    with pytest.raises(ConfigError, match=r"env.id: 'Pendulum-v1' has action space Box.*agent.algo=dqn needs a "
                                          r"Discrete one"):
        zmqrl.run_local(cfg, actors=2, run_dir=tmp_path / "run", env=box_env)
    assert not (tmp_path / "run" / "logs").exists()  # nothing launched
    assert (tmp_path / "run" / CALLABLES_DIR / "env.pkl").is_file() and cfg.env.id == "Pendulum-v1"  # its label


# --- the run directory and the signature -----------------------------------------------------------------------


def test_config_yaml_names_the_files_relative_to_the_run_directory(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    cfg = zmqrl.load_config(CARTPOLE)
    digests = user_callables.save(cfg, run_dir, user_callables.objects(env=coin_env(), network=torso_factory()))
    assert cfg.env.fn == str((run_dir / "callables" / "env.pkl").absolute()) and cfg.env.id == "Coin"
    assert digests["network"] == callables.sha256(cfg.agent.network_fn)
    prepare_run_dir(cfg, run_dir)
    saved = config.load(run_dir / "config.yaml")
    assert (saved.env.fn, saved.agent.network_fn, saved.env.wrappers_fn) == ("callables/env.pkl",
                                                                             "callables/network.pkl", "")
    moved = tmp_path / "moved"
    run_dir.rename(moved)  # a run directory moved whole still finds its files
    user_callables.resolve(saved, moved)
    assert saved.env.fn == str(moved / "callables" / "env.pkl") and make_task(saved).obs_space.shape == (3,)


def test_the_signature_carries_each_files_hash_and_a_different_file_is_a_misfit(tmp_path: Path) -> None:
    def task(file: Path, label: str = "whatever") -> dict[str, Any]:
        cfg = zmqrl.load_config(CARTPOLE, [f"env.fn={file}", f"env.id={label}"])
        return task_signature(make_task(cfg))

    first = write(tmp_path, coin_env(), name="a.pkl")
    copy = tmp_path / "copy.pkl"
    copy.write_bytes(first.read_bytes())  # a copy of the file matches; another class (the same code made again) not
    learner, same, other = task(first), task(copy, "Coin"), task(write(tmp_path, coin_env(), name="c.pkl"))
    assert learner["env_id"] is None and learner["network_fn"] is None and len(learner["env_fn"]) == 64
    assert misfit(same, learner) is None and signature_digest(same) == signature_digest(learner)
    problem = misfit(other, learner)
    assert problem == (f"env.fn (the sha256 of its file): {other['env_fn']!r} here, {learner['env_fn']!r} at the "
                       "learner"), problem
    assert signature_digest(other) != signature_digest(learner)
    configured = task_signature(make_task(zmqrl.load_config(CARTPOLE)))
    assert configured["env_id"] == "CartPole-v1" and configured["env_fn"] is None


# --- a torso of the user's own --------------------------------------------------------------------------------


@pytest.mark.parametrize("path, algo", [(CARTPOLE, "dqn"), (PENDULUM, "sac")])
def test_the_heads_sit_on_the_users_torso_and_actors_act_with_torch(tmp_path: Path, path: Path, algo: str) -> None:
    cfg = zmqrl.load_config(path, [f"agent.network_fn={write(tmp_path, torso_factory(16), 'network')}",
                                   "agent.batch_size=8"])
    task = make_task(cfg)
    agent, policy = task.agent(), task.policy(seed=1)  # actor.backend auto: torch, the torso is torch
    assert type(policy).__name__ == {"dqn": "DQNPolicy", "sac": "SACPolicy"}[algo]
    params = agent.params()
    assert params["torso.module.0.weight"].shape == (16, int(np.prod(task.obs_space.shape)))
    assert task.initial_params() is None  # version 0 comes from the learner's agent
    policy.load_params(params)
    obs = np.random.default_rng(0).uniform(-1, 1, (8, *task.obs_space.shape)).astype(np.float32)
    batch = {"obs": obs, "next_obs": obs, "reward": np.ones(8, np.float32), "discount": np.full(8, 0.9, np.float32),
             "action": np.array([task.action_space.sample() for _ in range(8)])}
    before = {k: v.copy() for k, v in params.items() if k.startswith("torso.")}
    agent.update(batch)
    after = agent.params()
    assert any(not np.array_equal(before[k], after[k]) for k in before)  # the torso trains with the heads
    if algo == "sac":  # each critic has its own copy of the torso
        critics = agent.critics.state_dict()  # type: ignore[attr-defined]
        assert {"torsos.0.module.0.weight", "torsos.1.module.0.weight"} <= set(critics)


@pytest.mark.parametrize("name", ["cartpole_iqn.yaml", "cartpole_pomdp_r2d2.yaml"])
def test_iqn_and_r2d2_put_their_heads_on_the_users_torso(tmp_path: Path, name: str) -> None:
    torso = write(tmp_path, torso_factory(8), "network")
    cfg = zmqrl.load_config(REPO / "configs" / name, [f"agent.network_fn={torso}"])
    task = make_task(cfg)
    params = task.agent().params()
    assert params["torso.module.0.weight"].shape == (8, int(np.prod(task.obs_space.shape)))
    policy = task.policy(seed=1)
    policy.load_params(params)
    assert type(policy).__module__.endswith(".agent")  # the torch policy


def test_a_torso_that_does_not_fit_or_a_numpy_backend_or_an_algorithm_without_torsos_is_refused(
        tmp_path: Path) -> None:
    def run_cfg(torso: Any, *more: str) -> config.Config:
        return zmqrl.load_config(CARTPOLE, [f"agent.network_fn={write(tmp_path, torso, 'network', 'n.pkl')}", *more])

    with pytest.raises(ConfigError, match=r"agent.network_fn: .*<lambda> from .*n.pkl fails on a batch of observations "
                                          r"of shape \(2, 4\) \(float32\): RuntimeError"):
        make_task(run_cfg(lambda: nn.Linear(5, 8)))
    with pytest.raises(ConfigError, match=r"maps observations \(2, 4\) to \(2, 4, 3\); it must give float features "
                                          r"\(B, F\)"):
        make_task(run_cfg(lambda: nn.Sequential(nn.Unflatten(1, (4, 1)), nn.Linear(1, 3))))
    with pytest.raises(ConfigError, match="returned str, not a torch module"):
        make_task(run_cfg(lambda: "mlp"))
    with pytest.raises(ConfigError, match="actor.backend: numpy cannot run the torch torso of agent.network_fn"):
        make_task(run_cfg(torso_factory(), "actor.backend=numpy"))

    class NoTorso(Algorithm):
        name = "notorso"

    with pytest.raises(ConfigError, match=r"agent.network_fn: agent.algo=notorso cannot put its heads on a torso of "
                                          r"your own; leave agent.network_fn empty \(algorithms that take one: "
                                          r"dqn, sac, iqn, r2d2"):
        NoTorso().check_torso(run_cfg(torso_factory()), gym.spaces.Box(-1, 1, (4,), np.float32))


def test_a_torso_factory_may_take_the_observation_space_or_nothing(tmp_path: Path) -> None:
    class Torso(nn.Module):
        def __init__(self, space: gym.spaces.Box) -> None:
            super().__init__()
            self.seen = space.shape
            self.net = nn.Sequential(nn.Linear(space.shape[0], 5), nn.ReLU())

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.net(x)  # type: ignore[no-any-return]

    for factory, features in ((Torso, 5), (lambda: nn.Identity(), 4)):
        cfg = zmqrl.load_config(CARTPOLE, [f"agent.network_fn={write(tmp_path, factory, 'network', 't.pkl')}"])
        q = make_task(cfg).agent().q  # type: ignore[attr-defined]
        assert q.head.advantage.in_features == features


# --- the launchers' flags ----------------------------------------------------------------------------------------


def test_env_fn_flags_copy_the_file_into_the_run_directory_and_tell_the_roles(tmp_path: Path) -> None:
    source = write(tmp_path, coin_env(), name="mine.pkl")
    cfg = zmqrl.load_config(CARTPOLE)
    args = argparse.Namespace(env_fn=str(source), wrappers_fn=None, network_fn=None, run_dir=str(tmp_path / "run"))
    overrides = take_callables(args, cfg)
    copied = tmp_path / "run" / "callables" / "env.pkl"
    assert overrides == ["env.fn=callables/env.pkl", "env.id=Coin"]
    assert copied.read_bytes() == source.read_bytes() and cfg.env.fn == str(copied)
    host = zmqrl.load_config(CARTPOLE)
    args.run_dir = str(tmp_path / "host")
    assert take_callables(args, host, copy_in=False) == [f"env.fn={source}", "env.id=Coin"]
    assert not (tmp_path / "host").exists()


def test_a_host_without_the_heads_file_is_told_how_to_give_it_one(tmp_path: Path) -> None:
    from zmqrl.roles.launch.cluster import run_host

    cfg = user_callables.resolve(zmqrl.load_config(CARTPOLE, ["env.fn=callables/env.pkl"]), tmp_path / "host")
    with pytest.raises(ConfigError, match=r"env.fn: .*host/callables/env.pkl: cannot read it .*give it the head's "
                                          r"with zmqrl host --env-fn FILE \(a copy of the head's "
                                          r"RUN_DIR/callables/env.pkl"):
        run_host(cfg, None, [], "127.0.0.1", 1, run_dir=str(tmp_path / "host"))


# --- the trust line ------------------------------------------------------------------------------------------------


def test_a_message_carrying_a_callables_file_is_refused_by_reason_and_never_unpickled(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    marker = tmp_path / "marker"
    data = callables.dumps(lambda: _marker(str(marker)), "env")
    exploit = pickle.dumps(_Exploit(str(marker)))

    def refuse(*_: Any, **__: Any) -> None:
        raise AssertionError("something received was unpickled")

    import cloudpickle
    monkeypatch.setattr(pickle, "loads", refuse)
    monkeypatch.setattr(cloudpickle, "loads", refuse)
    valid = encode(BATCH, sender="actor-0", incarnation="abc", seq=1, version=0,
                   arrays={"fn": np.frombuffer(data, np.uint8)})
    header = json.loads(bytes(valid[0]))
    assert decode([bytes(f) for f in valid], Limits()).arrays["fn"].tobytes() == data  # bytes, and only bytes
    as_object = json.dumps({**header, "arrays": [["fn", "|O", [1]]]}).encode()
    reasons = []
    for frames in ([data], [data, data], [exploit, data], [as_object, data], [bytes(valid[0]), exploit]):
        with pytest.raises(WireError) as info:
            decode(frames, Limits())
        reasons.append(info.value.reason)
    assert reasons == ["header", "header", "header", "dtype", "size"], reasons
    assert not marker.exists()


UNPICKLERS = ("pickle.load", "pickle.loads", "cloudpickle.load", "cloudpickle.loads", "dill.load", "marshal.loads",
              "shelve.open")


def test_only_the_callables_module_unpickles_and_only_env_agent_and_run_code_loads_its_files() -> None:
    """The trust line in the source: the one unpickler is :func:`zmqrl.callables.load`, called with the paths a
    config names (the env factory, the torso builder, the run's own callables), never from wire or role code; every
    other file zmqrl reads back is read without pickles (``allow_pickle=False``, ``weights_only=True``)."""
    unpickling, loaders = [], []
    for path in sorted((REPO / "zmqrl").rglob("*.py")):
        text = path.read_text()
        rel = str(path.relative_to(REPO))
        tree = ast.parse(text)
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                name = ast.unparse(node.func)
                if name in UNPICKLERS:
                    unpickling.append(rel)
                if name == "callables.load":
                    loaders.append(rel)
                if name.endswith("torch.load"):
                    assert any(k.arg == "weights_only" and ast.unparse(k.value) == "True" for k in node.keywords), rel
                if name.endswith("np.load") or name == "numpy.load":
                    assert not any(k.arg == "allow_pickle" and ast.unparse(k.value) != "False"
                                   for k in node.keywords), rel
    assert unpickling == ["zmqrl/callables.py"]
    assert sorted(set(loaders)) == ["zmqrl/agents/torso.py", "zmqrl/envs/factory.py", "zmqrl/run/user_callables.py"]
