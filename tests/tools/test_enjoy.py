"""``zmqrl enjoy``: greedy episodes from any checkpoint of a real run, videos, and clear checkpoint errors."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml

from zmqrl import cli, config
from zmqrl.config import ConfigError
from zmqrl.run.checkpoint import CheckpointError
from zmqrl.run.train import train
from zmqrl.tools.enjoy import load_policy

pytestmark = pytest.mark.timeout(180)

REPO = Path(__file__).resolve().parents[2]
SHORT = ["trainer.max_opts=200", "trainer.warmup=100", "trainer.eval_interval=100", "trainer.save_interval=100",
         "trainer.eval_episodes=3", "trainer.record_interval=50", "trainer.stop_return=null",
         "env.max_episode_steps=100", "run.seed=3"]
RESULT = re.compile(r"^return (\S+) ± (\S+) over (\d+) episodes", re.M)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("enjoy") / "run"
    train(config.load(REPO / "configs" / "cartpole_dqn.yaml", SHORT), path)
    return path


def copy_run(run: Path, dest: Path) -> Path:
    shutil.copytree(run, dest)
    return dest


@pytest.mark.parametrize("which", ["best", "latest", "200"])
def test_enjoy_prints_returns_and_exits_0(run: Path, which: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["enjoy", str(run), "--checkpoint", which, "--episodes", "3", "--seed", "5"]) == 0
    out = capsys.readouterr().out
    assert f"checkpoint {run / 'checkpoints' / which}" in out
    episodes = re.findall(r"^episode +(\d+): return +(\S+) +length (\d+)$", out, re.M)
    assert [int(e[0]) for e in episodes] == [1, 2, 3]
    returns = [float(e[1]) for e in episodes]
    assert all(float(e[1]) == int(e[2]) for e in episodes)  # CartPole: +1 per step
    mean, std, n = RESULT.search(out).groups()  # type: ignore[union-attr]
    assert int(n) == 3 and float(mean) == pytest.approx(np.mean(returns), abs=0.05)
    assert float(std) == pytest.approx(np.std(returns), abs=0.05)
    assert "seeds 5..7" in out


def test_enjoy_repeats_the_evaluation_training_made(run: Path) -> None:
    """Checkpoint 100 is the policy evaluated at opt step 100 with seeds run.seed + 1_000_000 + i."""
    first = json.loads((run / "summary.json").read_text())["evals"][0]
    assert first["opt_steps"] == 100
    policy = load_policy(run, checkpoint=100, backend="torch")
    played = policy.play(episodes=first["episodes"], seed=3 + 1_000_000)
    assert np.mean(played.returns) == pytest.approx(first["return_mean"])
    assert np.std(played.returns) == pytest.approx(first["return_std"])


def test_same_episodes_with_numpy_and_torch(run: Path) -> None:
    a = load_policy(run, "best", backend="numpy").play(episodes=3, seed=11)
    b = load_policy(run, "best", backend="torch").play(episodes=3, seed=11)
    assert a.returns == b.returns and a.lengths == b.lengths


def test_corrupt_agent_pt_exits_2_naming_it(run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = copy_run(run, tmp_path / "run")
    agent = bad / "checkpoints" / "latest" / "agent.pt"
    agent.write_bytes(agent.read_bytes()[:200])
    assert cli.main(["enjoy", str(bad), "--checkpoint", "latest", "--episodes", "1"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert str(agent) in err and "unreadable checkpoint" in err
    with pytest.raises(CheckpointError, match=re.escape(str(agent))):
        load_policy(bad, "latest")


def test_missing_checkpoint_exits_2_listing_what_the_run_has(run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["enjoy", str(run), "--checkpoint", "150"]) == 2
    err = capsys.readouterr().err
    assert str(run / "checkpoints" / "150") in err and "it has best, latest, 100, 200" in err
    assert cli.main(["enjoy", str(run), "--checkpoint", "newest"]) == 2
    assert "--checkpoint: expected best, latest or a number" in capsys.readouterr().err


def test_missing_agent_pt_exits_2(run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = copy_run(run, tmp_path / "run")
    (bad / "checkpoints" / "latest" / "agent.pt").unlink()
    assert cli.main(["enjoy", str(bad), "--checkpoint", "latest"]) == 2
    assert f"{bad / 'checkpoints' / 'latest' / 'agent.pt'}: missing" in capsys.readouterr().err


def test_checkpoint_that_does_not_fit_the_config_exits_2(run: Path, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    bad = copy_run(run, tmp_path / "run")
    data = yaml.safe_load((bad / "config.yaml").read_text())
    data["agent"]["hidden"] = [32, 32]
    (bad / "config.yaml").write_text(yaml.safe_dump(data))
    assert cli.main(["enjoy", str(bad)]) == 2
    err = capsys.readouterr().err
    assert str(bad / "checkpoints" / "best" / "policy.npz") in err and "do not fit" in err


def test_not_a_run_directory_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["enjoy", str(tmp_path)]) == 2
    assert f"{tmp_path}: not a run directory" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="not a run directory"):
        load_policy(tmp_path)


@pytest.mark.skipif(importlib.util.find_spec("moviepy") is None, reason="--video needs moviepy (zmqrl[video])")
@pytest.mark.skipif(importlib.util.find_spec("pygame") is None, reason="CartPole renders with pygame (zmqrl[video])")
@pytest.mark.slow
def test_video_writes_an_mp4_per_episode(run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    videos = tmp_path / "videos"
    assert cli.main(["enjoy", str(run), "--episodes", "2", "--video", str(videos)]) == 0
    files = sorted(videos.glob("*.mp4"))
    assert [f.name for f in files] == ["cartpole_dqn-best-episode-0.mp4", "cartpole_dqn-best-episode-1.mp4"]
    out = capsys.readouterr().out
    for f in files:
        data = f.read_bytes()
        assert data[4:8] == b"ftyp" and len(data) > 1000  # an MP4 container with frames in it
        assert f"video: {f}" in out


@pytest.fixture(scope="module")
def recurrent_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("enjoy-r2d2") / "run"
    train(config.load(REPO / "configs" / "cartpole_pomdp_r2d2.yaml",
                      ["trainer.max_opts=150", "trainer.warmup=64", "trainer.eval_interval=150",
                       "trainer.save_interval=150", "trainer.eval_episodes=4", "trainer.stop_return=null",
                       "trainer.opt_interval=2", "env.max_episode_steps=200", "run.seed=2"]), path)
    return path


def test_a_recurrent_policy_plays_the_evaluation_training_made_with_either_backend(recurrent_run: Path) -> None:
    """R2D2's greedy play keeps its LSTM state through each episode, from the initial state at its start, as
    the evaluator did: checkpoint 150 with the evaluation's seeds gives the evaluation's returns."""
    first = json.loads((recurrent_run / "summary.json").read_text())["evals"][0]
    assert first["opt_steps"] == 150
    for backend in ("numpy", "torch"):
        policy = load_policy(recurrent_run, checkpoint=150, backend=backend)
        played = policy.play(episodes=first["episodes"], seed=2 + 1_000_000)
        assert np.mean(played.returns) == pytest.approx(first["return_mean"]), backend
        assert np.std(played.returns) == pytest.approx(first["return_std"]), backend
    policy = load_policy(recurrent_run, checkpoint=150)
    with pytest.raises(TypeError, match="recurrent"):
        policy.policy.greedy(np.zeros((1, 2), np.float32))
    obs = np.array([[0.01, 0.02], [0.0, -0.03]], np.float32)
    policy.reset()
    start = policy.act(obs)
    policy.act(obs)
    policy.reset()
    assert np.array_equal(policy.act(obs), start)  # from the initial state again
