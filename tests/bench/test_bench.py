"""Tests of ``zmqrl bench``: the command line, rows and their verdicts, the package's layering, a
helper process obeying the rate limiter, and one smoke run of the whole suite.

The smoke run (``--smoke``) exercises every measurement with tiny durations: its figures mean
nothing, but every row must come back with the documented fields and a positive, finite ratio.
It starts real processes (proxy, sinks, feeders, ``zmqrl local`` and ``zmqrl train``).
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import zmq
from hypothesis import given
from hypothesis import strategies as st

from bench_rows import check_schema, check_skipped_cuda, check_verdict, positive_finite
from zmqrl import bench
from zmqrl.bench import feeders, harness, registry, solve
from zmqrl.bench.data import transition_pool
from zmqrl.config.algorithms import ALGORITHMS
from zmqrl.roles.addresses import free_port
from zmqrl.run.rundir import read_json
from zmqrl.wire import SocketOptions, encode_control, encode_model, make_socket, new_incarnation

REPO = Path(__file__).resolve().parents[2]
CARTPOLE = REPO / "configs" / "cartpole_dqn.yaml"


# --- command line -------------------------------------------------------------------------------


def test_the_bench_subcommand_takes_its_flags() -> None:
    from zmqrl.cli import bench as bench_cli
    from zmqrl.cli.app import build_parser

    parser, handlers = build_parser()
    args = parser.parse_args(["bench", "--only", "actor,replay", "--only", "solve", "--json", "out.json",
                              "--quick", "--seeds", "2", "--sb3", "--sb3-python", "/x/python"])
    assert handlers["bench"] is bench_cli.run_bench
    assert args.only == ["actor,replay", "solve"] and args.json == "out.json"
    assert args.quick and args.seeds == 2 and args.sb3 and args.sb3_python == "/x/python"


@pytest.mark.slow
def test_help_lists_every_group() -> None:
    done = subprocess.run([sys.executable, "-m", "zmqrl.cli", "bench", "--help"], capture_output=True, text=True,
                          timeout=60, cwd=REPO)
    assert done.returncode == 0, done.stderr
    for name in registry.GROUPS:
        assert name in done.stdout
    for flag in ("--only", "--quick", "--json", "--sb3", "--sb3-python"):
        assert flag in done.stdout


def test_presets_shorten_and_overrides_apply() -> None:
    full, quick, smoke = (bench.Settings.preset(m) for m in ("full", "quick", "smoke"))
    assert full.seeds == 5 and quick.seeds == 1
    assert smoke.actor_s * smoke.actor_reps < quick.actor_s * quick.actor_reps < full.actor_s * full.actor_reps
    assert quick.solve_budget_s < full.solve_budget_s
    assert smoke.paced_s < quick.paced_s < full.paced_s
    assert bench.Settings.preset("quick", seeds=5, solve_budget_s=None).seeds == 5
    with pytest.raises(ValueError):
        bench.Settings.preset("slow")


def test_unknown_names_and_missing_config_are_refused(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert bench.main(["--only", "actor,warp"]) == 2
    assert "warp" in capsys.readouterr().err
    assert bench.main(["--only", "replay", "--config", str(tmp_path / "nope.yaml")]) == 2
    assert "--config" in capsys.readouterr().err


def test_config_replaces_each_groups_own(tmp_path: Path) -> None:
    ctx = harness.Context(bench.Settings(), tmp_path)
    assert ctx.configs("cartpole_dqn.yaml") == [CARTPOLE]
    ctx = harness.Context(bench.Settings(config=tmp_path / "x.yaml"), tmp_path)
    assert ctx.configs("cartpole_dqn.yaml", "other.yaml") == [tmp_path / "x.yaml"]


# --- rows and verdicts ----------------------------------------------------------------------------


def test_rows_compute_ratio_and_goal() -> None:
    row = bench.make_row("x", 90.0, 100.0, "steps/s", "", (">=", 0.9))
    assert row.ratio == 0.9 and row.goal == ">= 0.9" and row.met is True
    row = bench.make_row("y", 69.0, 48.0, "B", "", ("<=", 1.1))
    assert row.met is False
    row = bench.make_row("z", 2.0, 5.0, "ms", "", (">=", 1.0), inverse=True)
    assert row.ratio == 2.5 and row.met is True
    assert bench.make_row("n", 3.0, 1.5, "s", "").met is None
    skipped = bench.skipped_row("s", "s", "stable-baselines3 not installed", ("<=", 0.5))
    assert skipped.ratio is None and skipped.met is None and skipped.note.startswith("skipped:")
    check_schema(skipped.as_dict())
    with pytest.raises(ValueError):
        bench.make_row("bad", 1.0, 1.0, "", "", ("==", 1.0))


def test_a_row_whose_figures_miss_the_goal_is_not_met() -> None:
    """The case that once read "met": each window's ratio above the goal, the figures' own ratio below it."""
    row = bench.make_row("actor", 21_200.0, 23_893.0, "env steps/s", "", (">=", 0.9))
    assert row.ratio == pytest.approx(0.8873, abs=1e-4) and row.met is False
    just_under = bench.make_row("edge", 89_999.0, 100_000.0, "", "", (">=", 0.9))
    assert just_under.met is False
    bounded = bench.make_row("solve", 10.0, 100.0, "s", "", ("<=", 0.5), complete=False)
    assert bounded.ratio == 0.1 and bounded.met is False  # a capped run's time is only a lower bound


@given(measured=st.floats(1e-3, 1e7), baseline=st.floats(1e-3, 1e7), value=st.floats(0.01, 10.0),
       op=st.sampled_from([">=", "<="]), inverse=st.booleans(), complete=st.booleans())
def test_verdicts_follow_the_rows_own_figures(measured: float, baseline: float, value: float, op: str,
                                              inverse: bool, complete: bool) -> None:
    row = bench.make_row("r", measured, baseline, "", "", (op, value), inverse=inverse, complete=complete)
    m, b = row.measured, row.baseline
    assert m is not None and b is not None and row.ratio is not None
    ratio = b / m if inverse else m / b
    assert math.isclose(row.ratio, ratio, rel_tol=1e-4)
    goal = float(row.goal.split()[1]) if row.goal else math.nan
    meets = row.ratio >= goal if op == ">=" else row.ratio <= goal
    assert row.met is (complete and meets)
    check_schema(row.as_dict())
    check_verdict(row.as_dict())


def test_missing_or_non_finite_figures_give_no_verdict() -> None:
    for measured, baseline in ((None, 1.0), (1.0, None), (math.nan, 1.0), (1.0, math.inf), (0.0, 1.0)):
        row = bench.make_row("r", measured, baseline, "", "", (">=", 0.9))
        assert row.ratio is None and row.met is None, (measured, baseline)


# --- the package -----------------------------------------------------------------------------------


@pytest.mark.slow
def test_the_harness_imports_no_group_and_names_no_algorithm() -> None:
    code = "import sys, zmqrl.bench.harness; print(' '.join(sys.modules))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert done.returncode == 0, done.stderr
    loaded = set(done.stdout.split())
    assert "zmqrl.bench.harness" in loaded
    assert not loaded & set(registry.GROUPS.values()), loaded & set(registry.GROUPS.values())
    assert "torch" not in loaded
    text = Path(harness.__file__).read_text().lower()
    for name in (*ALGORITHMS, "cartpole", "pendulum", "halfcheetah"):
        assert name not in text, name


def test_every_group_module_has_a_run_function() -> None:
    for name in registry.GROUPS:
        assert callable(registry.group(name)), name
    with pytest.raises(KeyError):
        registry.group("warp")


def test_groups_configs_exist_and_every_solve_config_has_an_sb3_peer() -> None:
    from zmqrl.bench import actor, scaling

    for name in (*actor.CONFIGS, *solve.CONFIGS, *scaling.BARE_CONFIGS, scaling.CONFIG):
        assert (REPO / "configs" / name).is_file(), name
    for name in solve.CONFIGS:
        cfg = harness.load_config(REPO / "configs" / name)
        assert cfg.trainer.stop_return is not None, name
        assert (cfg.agent.algo, cfg.env.id) in solve.SB3_PEERS, name


def test_sb3_evaluates_as_often_as_the_config_in_whole_training_rounds() -> None:
    dqn = solve.SB3_PEERS[("dqn", "CartPole-v1")]  # 128 gradient steps every 256 env steps
    assert dqn.eval_every_matched(100) == 256 and dqn.eval_every_matched(128) == 256
    assert dqn.eval_every_matched(129) == 512 and dqn.eval_every_matched(1000) == 2048
    sac = solve.SB3_PEERS[("sac", "Pendulum-v1")]  # one gradient step per env step
    assert sac.eval_every_matched(500) == 500
    assert solve.sb3_cadences(dqn, 100) == [256, solve.SB3_EVAL_EVERY]
    assert solve.sb3_cadences(sac, solve.SB3_EVAL_EVERY) == [solve.SB3_EVAL_EVERY]  # the same cadence runs once
    for name in solve.CONFIGS:  # the shipped configs give SB3 a second, matched cadence
        cfg = harness.load_config(REPO / "configs" / name)
        peer = solve.SB3_PEERS[(cfg.agent.algo, cfg.env.id)]
        assert len(solve.sb3_cadences(peer, cfg.trainer.eval_interval)) == 2, name


def test_solve_rows_judge_the_median_and_the_slowest_seed() -> None:
    def runs(kind: str, walls: list[float], steps: list[int | None]) -> list[solve.SolveRun]:
        return [solve.SolveRun(kind, seed, w, {"env_steps": n} if n else None) for seed, (w, n) in
                enumerate(zip(walls, steps, strict=True))]

    sb3 = runs("sb3", [30.0, 40.0, 50.0, 60.0, 90.0], [20_000] * 5)  # median 50 s
    fast = runs("local", [10.0, 12.0, 20.0, 24.0, 45.0], [30_000, 40_000, 50_000, 60_000, 70_000])
    median_row, slowest = solve.sb3_rows("t", fast, sb3, "")
    assert (median_row.ratio, median_row.met) == (0.4, True) and (slowest.ratio, slowest.met) == (0.9, True)
    one_slow = runs("local", [10.0, 12.0, 20.0, 24.0, 55.0], [1] * 5)  # median fine, slowest seed too slow
    assert [r.met for r in solve.sb3_rows("t", one_slow, sb3, "")] == [True, False]
    unsolved = runs("local", [10.0, 12.0, 20.0, 24.0, 45.0], [1, 1, 1, 1, None])
    assert [r.met for r in solve.sb3_rows("t", unsolved, sb3, "")] == [False, False]
    assert solve._median_steps(fast) == 50_000
    assert solve._median_steps(runs("local", [1.0] * 3, [10, None, None])) is None  # half or more unsolved
    assert solve._median_steps(runs("local", [1.0] * 3, [10, 30, None])) == 30
    assert "4: 45.0 s/70,000" in solve._describe(fast) and "4: 45.0 s unsolved" in solve._describe(unsolved)


def test_solve_notes_give_each_runs_largest_mean_q(tmp_path: Path) -> None:
    """A diverged seed shows in the note: the largest train/q_mean of a real TensorBoard file."""
    from zmqrl.run.trackers.tensorboard import TensorBoardRecorder

    run_dir = tmp_path / "run"
    recorder = TensorBoardRecorder(run_dir / "tb")
    for step, q in ((200, 9.5), (400, 150_000.0), (600, 80.0)):
        recorder.scalars(step, {"train/q_mean": q, "train/loss": 1e9})
    recorder.close()
    assert solve.largest_q(run_dir) == 150_000.0
    assert solve.largest_q(tmp_path / "no-run") is None
    runs = [solve.SolveRun("local", 0, 12.0, {"env_steps": 6000}, q_max=95.2),
            solve.SolveRun("local", 1, 60.0, None, q_max=150_000.0)]
    text = solve._describe(runs)
    assert "per seed (s/env steps (largest mean Q)) 0: 12.0 s/6,000 (Q 95), 1: 60.0 s unsolved (Q 150,000)" in text
    assert "largest mean Q" not in solve._describe([solve.SolveRun("sb3", 0, 9.0, None)])


@pytest.mark.slow
def test_sb3_is_optional(tmp_path: Path) -> None:
    ctx = harness.Context(bench.Settings(sb3=True, sb3_python=str(tmp_path / "no-python")), tmp_path)
    assert solve.sb3_interpreter(ctx) is None
    ctx = harness.Context(bench.Settings(sb3=True, sb3_python="/bin/false"), tmp_path)
    assert solve.sb3_interpreter(ctx) is None
    assert "stable_baselines3" not in sys.modules  # never imported by the suite itself


# --- helper processes ------------------------------------------------------------------------------


@pytest.mark.timeout(120)
@pytest.mark.slow
def test_feeders_wait_for_a_model_and_hold_while_the_learner_asks_for_a_pause(tmp_path: Path) -> None:
    """A learner-row feeder, as a real helper process: no batch before the first model, none while
    control says ``pause``, batches once it is cleared, exactly a grant's ``allow`` when no other
    grant follows, and its paused time reported."""
    cfg = harness.load_config(CARTPOLE)
    pool = transition_pool(cfg, 512)
    pool["priority"] = np.ones(512, np.float32)
    messages = feeders.save_messages(tmp_path / "messages.npz",
                                     [{k: v[lo:lo + 64] for k, v in pool.items()} for lo in range(0, 512, 64)])
    data_addr, model_addr = (f"tcp://127.0.0.1:{free_port()}" for _ in range(2))
    ctx = zmq.Context()
    pull = make_socket(ctx, zmq.PULL, SocketOptions.pull(rcvhwm=64), bind=data_addr)
    pub = make_socket(ctx, zmq.XPUB, SocketOptions.pub(), bind=model_addr)
    inc, version = new_incarnation(), 0
    out = tmp_path / "feed.json"
    received = 0

    def publish(pause: bool, **meta: object) -> None:
        """Control (``pause`` and ``meta``: a grant's allowance), then a model, as the learner sends them."""
        nonlocal version
        pub.send_multipart(encode_control("learner", inc, version + 1, version, {"pause": pause, **meta}))
        pub.send_multipart(encode_model("learner", inc, version, {"w": np.zeros(4, np.float32)}))
        version += 1

    def batches_within(seconds: float, pause: bool | None) -> int:
        """Count batches arriving over ``seconds``, publishing a model (with ``pause``) every 50 ms."""
        nonlocal received
        got, end = 0, time.monotonic() + seconds
        while time.monotonic() < end:
            if pause is not None:
                publish(pause)
            while pull.poll(50, zmq.POLLIN) and time.monotonic() < end:
                pull.recv_multipart()
                got += 1
        received += got
        return got

    try:
        with harness.Procs(tmp_path) as procs:
            feeder = procs.child("feed", feeders.feed, {
                "config": str(CARTPOLE), "connect": data_addr, "models": model_addr, "messages": str(messages),
                "rate": 5000, "sndhwm": 4, "index": 0, "out": str(out), "timeout_s": 60})
            harness.await_subscriber(pub, 30.0)
            assert batches_within(1.0, None) == 0, "a batch before the first model"
            assert batches_within(1.5, True) == 0, "a batch while paused"
            deadline = time.monotonic() + 30.0
            while batches_within(0.2, False) < 5 and time.monotonic() < deadline:
                pass
            assert received >= 5, "no batches after the pause was lifted"
            batches_within(0.5, True)  # paused again: what was on its way arrives
            publish(False, allow=2 * 64, grant=1)  # one grant of two batches, then none for a second
            assert batches_within(1.0, None) == 2, "not the grant's allowance of two batches"
            assert feeder.stop(10.0) == 0, feeder.tail()
        result = read_json(out)
        assert result is not None
        assert result["sent"] >= received and result["paused_s"] >= 0.5, result
    finally:
        pull.close(linger=0)
        pub.close(linger=0)
        ctx.term()


# --- measurements ----------------------------------------------------------------------------------


@pytest.mark.slow
def test_replay_rows(tmp_path: Path) -> None:
    out = tmp_path / "replay.json"
    assert bench.main(["--only", "replay", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())
    assert [r["name"] for r in rows] == ["replay_bytes_cartpole_dqn", "replay_bytes_frames", "replay_bytes_atari",
                                         "replay_bytes_atari_lz4", "replay_sample_atari_lz4",
                                         "replay_bytes_atari_zstd", "replay_sample_atari_zstd"]
    for row in rows:
        check_schema(row)
        check_verdict(row)
        assert positive_finite(row["ratio"]) and (row["met"] is not None) == row["name"].startswith("replay_bytes")
    for row in rows[3::2]:  # replay.compress: a 1M Pong replay in under 1 GiB
        assert row["met"] and row["ratio"] < 0.6 and "GiB" in row["note"], row
    frames = rows[1]
    assert frames["baseline"] == 2 * 4 * 84 * 84  # obs and next_obs stacks of one transition
    assert 84 * 84 / frames["baseline"] < frames["ratio"] < 0.35  # about one frame per transition is kept
    assert "each distinct frame stored once" in frames["note"]
    atari = rows[2]  # real Pong frames at a capacity of 1M: about one 84x84 frame per transition
    assert atari["baseline"] == 2 * 4 * 84 * 84 and 0.05 < atari["ratio"] < 0.35, atari
    assert "capacity 1,000,000" in atari["note"] and "GiB" in atari["note"]


@pytest.mark.slow
def test_envs_rows(tmp_path: Path) -> None:
    """EnvPool against the gymnasium chain, env alone and inside the acting loop (smoke durations:
    the figures are plumbing, the row set and their units are not)."""
    pytest.importorskip("envpool")
    out = tmp_path / "envs.json"
    assert bench.main(["--only", "envs", "--smoke", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())
    assert [r["name"] for r in rows] == ["env_pong_envpool_4", "env_pong_envpool_16", "acting_pong_gymnasium_4",
                                         "acting_pong_envpool_4", "acting_pong_envpool_16", "acting_pong_envpool_32",
                                         "acting_pong_envpool_32_async16"]
    for row in rows:
        check_schema(row)
        check_verdict(row)
        assert row["unit"] == "env steps/CPU-s" and positive_finite(row["measured"]), row
    assert all(r["baseline"] == rows[0]["baseline"] and "gymnasium chain" in r["note"] for r in rows[:2])
    assert all(r["baseline"] == 1500 and r["goal"] == ">= 1" for r in rows[2:])


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_smoke_run_of_the_whole_suite(tmp_path: Path) -> None:
    """Every group in one run of the suite, less the groups whose rows tests of their own run (replay and
    envs above, fanin in test_bench_fanin.py, cnn in test_sprint.py, scale in test_scale.py, rewards in
    test_rewards_bench.py): one process,
    one work directory, rows in order."""
    out = tmp_path / "bench.json"
    started = time.monotonic()
    groups = [name for name in registry.GROUPS if name not in ("replay", "envs", "fanin", "cnn", "scale", "rewards")]
    code = bench.main(["--smoke", "--only", ",".join(groups), "--json", str(out), "--keep", str(tmp_path / "work")])
    elapsed = time.monotonic() - started
    rows = json.loads(out.read_text())
    errors = [r for r in rows if r["note"].startswith("error:")]
    assert code == 0 and not errors, errors
    by_name = {r["name"]: r for r in rows}
    expected = {"actor_cartpole_dqn", "actor_pendulum_sac", "actor_pong_dqn", "transport_cartpole_1024",
                "transport_atari_64", "transport_cartpole_1024_direct", "transport_atari_64_direct",
                "transport_proxy_cpu_paced", "learner_opt_steps",
                "learner_opt_steps_pong", "learner_intake_pong", "learner_bytes_throttled",
                "learner_update_cartpole_dqn", "learner_update_pendulum_sac",
                "actor_cartpole_pomdp_dqn", "actor_cartpole_pomdp_r2d2", "actor_r2d2_vs_dqn_pomdp",
                "learner_update_r2d2_pomdp", "learner_items_r2d2_pomdp",
                "broadcast_1mb", "broadcast_10mb", "startup_s",
                "scaling_1_actors", "scaling_halfcheetah_sac_local_vs_bare", "solve_cartpole_dqn_local_vs_train",
                "solve_pendulum_sac_local_vs_train", "solve_cartpole_dqn_env_steps_local_vs_train",
                "solve_pendulum_sac_env_steps_local_vs_train"}
    assert expected <= set(by_name), expected - set(by_name)
    for row in rows:
        check_schema(row)
        check_verdict(row)
        if check_skipped_cuda(row):
            continue
        if "_env_steps_" in row["name"] and row["measured"] is None:  # smoke runs are too short to solve
            assert "unsolved" in row["note"] and row["met"] is None, row
            continue
        assert positive_finite(row["ratio"]), row
        assert positive_finite(row["measured"]) and positive_finite(row["baseline"]), row
    for kind in ("cartpole_1024", "atari_64"):  # judged against the relay; the direct ratio only reported
        assert by_name[f"transport_{kind}"]["goal"] == ">= 0.9"
        assert by_name[f"transport_{kind}_direct"]["goal"] is None
        assert by_name[f"transport_{kind}"]["measured"] == by_name[f"transport_{kind}_direct"]["measured"]
    paced = by_name["transport_proxy_cpu_paced"]  # the proxy's CPU per batch with its hold vs without
    assert paced["goal"] is None and paced["unit"] == "us" and "net.proxy_hold_ms=0" in paced["note"], paced
    assert "subscribe to its models and control like actors" in by_name["learner_opt_steps"]["note"]
    for name in ("learner_opt_steps_pong", "learner_intake_pong", "learner_bytes_throttled"):  # Pong rows, judged
        assert by_name[name]["goal"] is not None and by_name[name]["met"] is not None, by_name[name]
    update = by_name["learner_update_cartpole_dqn"]  # written-out vs autograd update, each window's pair listed
    assert update["goal"] is None and len(re.findall(r"\d+/\d+", update["note"].split("windows:")[1])) == 2, update
    for name in ("actor_cartpole_dqn", "actor_pendulum_sac", "actor_pong_dqn", "actor_cartpole_pomdp_r2d2"):
        # the sink counts what the actor sent
        found = re.search(r"sink got (\d+)/(\d+) batches", by_name[name]["note"])
        assert found is not None, by_name[name]["note"]
        got, sent = map(int, found.groups())
        assert 0.9 * sent <= got <= sent and sent > 0, by_name[name]["note"]  # (small batches come packed)
    pair = by_name["actor_r2d2_vs_dqn_pomdp"]  # R2D2's actor against DQN's: the two actor rows' figures
    assert (pair["measured"], pair["baseline"]) == (by_name["actor_cartpole_pomdp_r2d2"]["measured"],
                                                    by_name["actor_cartpole_pomdp_dqn"]["measured"]), pair
    assert "NumpyR2D2Policy" in by_name["actor_cartpole_pomdp_r2d2"]["note"]
    items = by_name["learner_items_r2d2_pomdp"]  # steps/s times the batch sizes (32 sequence items, 64 transitions)
    steps = by_name["learner_update_r2d2_pomdp"]
    assert items["measured"] == pytest.approx(32 * steps["measured"], rel=1e-3)
    assert items["baseline"] == pytest.approx(64 * steps["baseline"], rel=1e-3)
    assert elapsed < 450, f"the smoke run took {elapsed:.0f}s"  # ~70 s on 2 idle cores, ~150 s shared


# --- soak -----------------------------------------------------------------------------------------


@pytest.mark.slow
def test_soak_lives_beside_the_bench() -> None:
    for module in ("zmqrl.bench.soak", "zmqrl.bench"):
        done = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True, text=True, timeout=60,
                              cwd=REPO)
        assert done.returncode == 0 and "usage:" in done.stdout, (module, done.stderr)


def test_soak_growth_table_and_slope() -> None:
    from zmqrl.bench import soak

    samples = [{"t": float(t), "rss_mb": {"learner": 100.0 + 0.5 * t, "proxy": None if t < 20 else 50.0}}
               for t in range(0, 70, 10)]
    rows = {r["role"]: r for r in soak.growth_table(samples, ["learner", "proxy", "actor-0"], warmup_s=30.0)}
    learner_row = rows["learner"]
    assert learner_row["start_mb"] == 115.0 and learner_row["end_mb"] == 130.0 and learner_row["growth_mb"] == 15.0
    assert learner_row["mb_per_min"] == pytest.approx(30.0) and learner_row["slope_mb_per_min"] == pytest.approx(30.0)
    assert rows["proxy"]["growth_mb"] == 0.0 and rows["proxy"]["samples"] == 5
    assert rows["actor-0"]["start_mb"] is None and rows["actor-0"]["samples"] == 0
    assert math.isnan(soak.slope_per_min([1.0], [2.0]))
    assert soak.default_warmup_s(600.0) == 120.0 and soak.default_warmup_s(40.0) == 20.0
