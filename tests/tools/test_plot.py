"""``zmqrl plot``: curves of real runs to a PNG, seeds grouped into mean ± std, clear errors for non-runs."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from zmqrl import cli, config
from zmqrl.run.rundir import RunDirError
from zmqrl.run.train import train
from zmqrl.tools.api import run_local
from zmqrl.tools.plot import AXES, aggregate, plot_runs, read_run

pytestmark = pytest.mark.timeout(180)

REPO = Path(__file__).resolve().parents[2]
SHORT = ["trainer.max_opts=200", "trainer.warmup=100", "trainer.eval_interval=50", "trainer.save_interval=100",
         "trainer.eval_episodes=2", "trainer.record_interval=25", "trainer.stop_return=null",
         "env.max_episode_steps=100"]


def short_run(path: Path, *overrides: str) -> dict[str, Any]:
    cfg = config.load(REPO / "configs" / "cartpole_dqn.yaml", SHORT + list(overrides))
    return train(cfg, path)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two seeds of one config and one run with another learning rate."""
    root = tmp_path_factory.mktemp("plot")
    out = {"s0": root / "s0", "s1": root / "s1", "lr": root / "lr"}
    short_run(out["s0"], "run.seed=0")
    short_run(out["s1"], "run.seed=1")
    short_run(out["lr"], "run.seed=0", "agent.lr=3e-4")
    return out


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def test_plot_one_run_writes_a_png(runs: dict[str, Path], tmp_path: Path,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "curves.png"
    assert cli.main(["plot", str(runs["s0"]), "--out", str(out)]) == 0
    assert png_size(out) == (1080, 900)  # 9 x 7.5 inches at 120 dpi: evaluation and training panels
    assert out.stat().st_size > 20_000  # lines, labels and ticks drawn, not an empty canvas
    stdout = capsys.readouterr().out
    assert f"wrote {out}" in stdout and "cartpole_dqn (seed 0)" in stdout


@pytest.mark.parametrize("axis", list(AXES))
def test_every_axis(runs: dict[str, Path], tmp_path: Path, axis: str) -> None:
    out = tmp_path / f"{axis}.png"
    assert cli.main(["plot", str(runs["s0"]), str(runs["s1"]), "--x", axis, "--out", str(out)]) == 0
    assert png_size(out) == (1080, 900)


def test_curves_come_from_the_runs_records(runs: dict[str, Path]) -> None:
    run = read_run(runs["s0"])
    summary = json.loads((runs["s0"] / "summary.json").read_text())
    evals = summary["evals"]
    assert run.evals.x["opt_steps"].tolist() == [50, 100, 150, 200]
    assert run.evals.x["env_steps"].tolist() == [e["env_steps"] for e in evals]
    assert run.evals.x["wall_s"].tolist() == [e["wall_s"] for e in evals]
    assert run.evals.y.tolist() == pytest.approx([e["return_mean"] for e in evals])
    assert run.train.x["opt_steps"].tolist() == [25, 50, 75, 100, 125, 150, 175, 200]
    env = run.train.x["env_steps"]
    assert np.all(np.diff(env) > 0) and env[-1] == summary["env_steps"]
    assert np.all(np.diff(run.train.x["wall_s"]) > 0)


def test_seeds_form_one_group_drawn_as_mean_and_std(runs: dict[str, Path], tmp_path: Path) -> None:
    groups = plot_runs([runs["s0"], runs["lr"], runs["s1"]], tmp_path / "g.png", x="opt_steps")
    assert [sorted(r.path.name for r in g.runs) for g in groups] == [["s0", "s1"], ["lr"]]
    seeds, other = groups
    assert "2 seeds, mean ± std" in seeds.label
    assert "agent.lr=0.0003" in other.label or "(seed 0)" in other.label
    grid, mean, std = aggregate([r.evals.along("opt_steps") for r in seeds.runs])
    a, b = (r.evals.y for r in seeds.runs)
    assert grid.tolist() == [50, 100, 150, 200]
    assert mean == pytest.approx((a + b) / 2) and std == pytest.approx(np.abs(a - b) / 2)
    assert seeds.stats["final_eval"] == pytest.approx([a[-1], b[-1]])


def test_same_name_different_config_says_how_they_differ(runs: dict[str, Path], tmp_path: Path) -> None:
    groups = plot_runs([runs["s0"], runs["lr"]], tmp_path / "d.png")
    assert [g.label for g in groups] == ["cartpole_dqn (agent.lr=0.0023, seed 0)",
                                         "cartpole_dqn (agent.lr=0.0003, seed 0)"]


@pytest.mark.slow
def test_a_local_run_is_not_a_seed_of_a_train_run(runs: dict[str, Path], tmp_path: Path) -> None:
    """Same config, run by zmqrl local: its own group, and both labels say how each ran."""
    # The evaluator runs beside the learner, so a 200-update budget can end before its first report;
    # stop_return=0 ends the run at that report instead (every CartPole return is at least 1).
    cfg = config.load(REPO / "configs" / "cartpole_dqn.yaml",
                      SHORT + ["run.seed=0", "trainer.max_opts=1000000", "trainer.stop_return=0"])
    summary = run_local(cfg, actors=2, run_dir=tmp_path / "local")  # actor.num_actors=2: a train run's default
    assert summary["stop_reason"] == "evaluation reached stop_return=0.0"
    local = read_run(tmp_path / "local")
    assert local.mode == "local" and read_run(runs["s0"]).mode == "train"
    assert len(local.evals.y) >= 1 and np.all(np.isfinite(local.evals.x["env_steps"]))
    out = tmp_path / "both.png"
    groups = plot_runs([runs["s0"], tmp_path / "local"], out, x="wall_s")
    assert [g.label for g in groups] == [
        "cartpole_dqn (zmqrl train, trainer.max_opts=200, trainer.stop_return=None, seed 0)",
        "cartpole_dqn (zmqrl local, trainer.max_opts=1000000, trainer.stop_return=0.0, seed 0)"]
    assert png_size(out) == (1080, 900)


def test_aggregate_covers_only_where_every_run_has_data() -> None:
    grid, mean, std = aggregate([(np.array([0.0, 10.0, 20.0]), np.array([0.0, 10.0, 20.0])),
                                 (np.array([5.0, 15.0]), np.array([10.0, 20.0]))])
    assert grid.tolist() == [5.0, 10.0, 15.0]
    assert mean.tolist() == pytest.approx([7.5, 12.5, 17.5])
    assert std.tolist() == pytest.approx([2.5, 2.5, 2.5])


def test_not_a_run_directory_exits_2(runs: dict[str, Path], tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    out = tmp_path / "x.png"
    assert cli.main(["plot", str(runs["s0"]), str(empty), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert f"{empty}: not a run directory" in err
    assert cli.main(["plot", str(tmp_path / "missing"), "--out", str(out)]) == 2
    assert "no such directory" in capsys.readouterr().err
    assert not out.exists()


def test_run_with_nothing_recorded_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "fresh"
    run.mkdir()
    config.dump(config.load(None), run / "config.yaml")
    assert cli.main(["plot", str(run), "--out", str(tmp_path / "x.png")]) == 2
    assert "nothing to plot yet" in capsys.readouterr().err
    with pytest.raises(RunDirError, match="nothing to plot"):
        read_run(run)
