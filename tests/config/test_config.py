"""Tests for the config schema: loading, validation messages, ``--set`` overrides, dump, CLI errors."""

from __future__ import annotations

import dataclasses
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from zmqrl import cli, config
from zmqrl.config import Config, ConfigError

REPO = Path(__file__).resolve().parents[2]
CARTPOLE_YAML = REPO / "configs" / "cartpole_dqn.yaml"


def write_yaml(tmp_path: Path, data: object, name: str = "cfg.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return path


# ---------------------------------------------------------------- loading


def test_defaults_load_and_equal_the_dataclass_defaults() -> None:
    cfg = config.load(None)
    assert cfg == Config()
    assert cfg.agent.lr == 1e-3 and cfg.agent.hidden == [64, 64]
    assert cfg.env.id == "CartPole-v1" and cfg.trainer.stop_return is None


def test_shipped_cartpole_config_loads() -> None:
    cfg = config.load(CARTPOLE_YAML)
    assert cfg.run.name == "cartpole_dqn"
    assert cfg.env.id == "CartPole-v1" and cfg.env.num_envs == 4
    assert cfg.agent.hidden == [256, 256] and cfg.agent.n_step == 3
    assert cfg.replay.capacity == 50_000 and cfg.replay.prioritized is True
    assert cfg.trainer.stop_return == 475.0 and isinstance(cfg.trainer.stop_return, float)
    assert cfg.actor.n_buffer == 64
    # keys the file leaves out keep their defaults
    assert cfg.net == Config().net


def test_empty_file_gives_defaults(tmp_path: Path) -> None:
    path = tmp_path / "empty.yaml"
    path.write_text("# nothing here\n")
    assert config.load(path) == Config()


def test_empty_section_gives_section_defaults(tmp_path: Path) -> None:
    assert config.load(write_yaml(tmp_path, {"agent": None})) == Config()


def test_missing_file_names_it(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError, match="nope.yaml") as info:
        config.load(missing)
    assert str(missing) in str(info.value)


def test_invalid_yaml_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("agent: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML") as info:
        config.load(path)
    assert str(path) in str(info.value)


def test_top_level_must_be_a_mapping(tmp_path: Path) -> None:
    path = write_yaml(tmp_path, [1, 2, 3])
    with pytest.raises(ConfigError, match="mapping") as info:
        config.load(path)
    assert str(path) in str(info.value)


def test_section_must_be_a_mapping(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="agent: expected a mapping"):
        config.load(write_yaml(tmp_path, {"agent": 3}))


# ---------------------------------------------------------------- unknown keys


def test_unknown_key_names_key_file_and_closest_valid_key(tmp_path: Path) -> None:
    path = write_yaml(tmp_path, {"agent": {"lrr": 0.1}})
    with pytest.raises(ConfigError) as info:
        config.load(path)
    msg = str(info.value)
    assert "'lrr'" in msg
    assert str(path) in msg
    assert "agent" in msg
    assert "did you mean 'lr'" in msg


def test_unknown_key_without_close_match_lists_valid_keys(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        config.load(write_yaml(tmp_path, {"replay": {"zzzzzzzz": 1}}))
    msg = str(info.value)
    assert "'zzzzzzzz'" in msg and "did you mean" not in msg
    for key in ("capacity", "prioritized", "alpha", "beta0"):
        assert key in msg


def test_unknown_section_names_it_and_suggests(tmp_path: Path) -> None:
    path = write_yaml(tmp_path, {"agnt": {"lr": 0.1}})
    with pytest.raises(ConfigError) as info:
        config.load(path)
    msg = str(info.value)
    assert "'agnt'" in msg and str(path) in msg and "did you mean 'agent'" in msg


# ---------------------------------------------------------------- types


def test_wrong_type_names_key_and_expected_type(tmp_path: Path) -> None:
    path = write_yaml(tmp_path, {"agent": {"batch_size": "abc"}})
    with pytest.raises(ConfigError) as info:
        config.load(path)
    msg = str(info.value)
    assert "agent.batch_size" in msg and "expected int" in msg and "'abc'" in msg
    assert str(path) in msg


def test_int_is_accepted_for_float_fields_and_becomes_float(tmp_path: Path) -> None:
    cfg = config.load(write_yaml(tmp_path, {"agent": {"lr": 1, "max_grad_norm": 5}, "trainer": {"stop_return": 200}}))
    assert cfg.agent.lr == 1.0 and type(cfg.agent.lr) is float
    assert type(cfg.agent.max_grad_norm) is float
    assert cfg.trainer.stop_return == 200.0 and type(cfg.trainer.stop_return) is float


def test_integral_float_is_accepted_for_int_fields_and_becomes_int(tmp_path: Path) -> None:
    cfg = config.load(write_yaml(tmp_path, {"agent": {"batch_size": 32.0}, "env": {"max_episode_steps": 7.0}}))
    assert cfg.agent.batch_size == 32 and type(cfg.agent.batch_size) is int
    assert cfg.env.max_episode_steps == 7 and type(cfg.env.max_episode_steps) is int


def test_fractional_float_is_rejected_for_int_fields(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"agent\.batch_size: expected int"):
        config.load(write_yaml(tmp_path, {"agent": {"batch_size": 32.5}}))


@pytest.mark.parametrize(("section", "key"), [("agent", "batch_size"), ("agent", "lr"),
                                              ("env", "max_episode_steps"), ("trainer", "stop_return")])
def test_bool_is_never_a_number(tmp_path: Path, section: str, key: str) -> None:
    with pytest.raises(ConfigError, match=rf"{section}\.{key}: expected"):
        config.load(write_yaml(tmp_path, {section: {key: True}}))


def test_number_is_not_a_bool(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"agent\.dueling: expected bool"):
        config.load(write_yaml(tmp_path, {"agent": {"dueling": 1}}))


def test_list_items_are_checked_with_their_index(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"agent\.hidden\[1\]: expected int"):
        config.load(write_yaml(tmp_path, {"agent": {"hidden": [32, "x"]}}))
    with pytest.raises(ConfigError, match=r"agent\.hidden: expected a list"):
        config.load(write_yaml(tmp_path, {"agent": {"hidden": 32}}))


def test_optional_fields_take_null(tmp_path: Path) -> None:
    cfg = config.load(write_yaml(tmp_path, {"env": {"max_episode_steps": None}, "trainer": {"stop_return": None}}))
    assert cfg.env.max_episode_steps is None and cfg.trainer.stop_return is None


def test_non_optional_field_rejects_null(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"agent\.lr: expected float"):
        config.load(write_yaml(tmp_path, {"agent": {"lr": None}}))


# ---------------------------------------------------------------- --set overrides


def test_set_overrides_are_typed() -> None:
    cfg = config.load(CARTPOLE_YAML, ["agent.lr=3e-4", "agent.hidden=[32, 32]", "agent.dueling=false",
                                      "trainer.stop_return=null", "run.name=exp.1"])
    assert cfg.agent.lr == pytest.approx(3e-4) and type(cfg.agent.lr) is float
    assert cfg.agent.hidden == [32, 32]
    assert cfg.agent.dueling is False
    assert cfg.trainer.stop_return is None
    assert cfg.run.name == "exp.1"
    # untouched values come from the file
    assert cfg.agent.batch_size == 64 and cfg.replay.capacity == 50_000


def test_set_works_without_a_file_and_later_overrides_win() -> None:
    cfg = config.load(None, ["agent.batch_size=16", "agent.batch_size=8"])
    assert cfg.agent.batch_size == 8


def test_set_into_a_section_missing_from_the_file(tmp_path: Path) -> None:
    path = write_yaml(tmp_path, {"run": {"seed": 5}})
    cfg = config.load(path, ["net.data_port=0"])
    assert cfg.run.seed == 5 and cfg.net.data_port == 0


@pytest.mark.parametrize(("text", "key", "value"), [
    ("agent.lr=3e-4", "agent.lr", "3e-4"),  # YAML 1.1 text; the schema makes it a float (see above)
    ("agent.lr=1E-3", "agent.lr", "1E-3"),
    ("trainer.max_opts=100", "trainer.max_opts", 100),
    ("run.device=cuda:1", "run.device", "cuda:1"),
    ("run.name= spaced ", "run.name", "spaced"),
    ("run.name=", "run.name", ""),
    ("env.kwargs={render_mode: rgb_array}", "env.kwargs", {"render_mode": "rgb_array"}),
])
def test_parse_override_values(text: str, key: str, value: object) -> None:
    assert config.parse_override(text) == (key, value)


def test_set_without_equals_is_an_error() -> None:
    with pytest.raises(ConfigError, match="expected key=value"):
        config.load(None, ["agent.lr"])


def test_set_unknown_key_suggests_the_closest() -> None:
    with pytest.raises(ConfigError) as info:
        config.load(CARTPOLE_YAML, ["agent.lrr=0.1"])
    msg = str(info.value)
    assert "agent.lrr" in msg and "did you mean 'lr'" in msg


def test_set_unknown_section_suggests_the_closest() -> None:
    with pytest.raises(ConfigError, match="did you mean 'trainer'"):
        config.load(None, ["trainr.max_opts=5"])


def test_set_key_needs_exactly_one_dot() -> None:
    with pytest.raises(ConfigError, match="expected section.key"):
        config.load(None, ["lr=0.1"])
    with pytest.raises(ConfigError, match="expected section.key"):
        config.load(None, ["agent.lr.x=0.1"])


def test_set_bad_type_is_reported_with_the_key() -> None:
    with pytest.raises(ConfigError, match=r"with --set\): agent\.batch_size: expected int"):
        config.load(CARTPOLE_YAML, ["agent.batch_size=abc"])


def test_set_unreadable_yaml_value() -> None:
    with pytest.raises(ConfigError, match="agent.hidden: cannot read value"):
        config.load(None, ["agent.hidden=[1, 2"])


# ---------------------------------------------------------------- ranges and choices


@pytest.mark.parametrize(("overrides", "fragment"), [
    (["agent.gamma=1.5"], "agent.gamma must be within [0, 1]"),
    (["agent.gamma=0"], "agent.gamma must be > 0"),
    (["replay.capacity=0"], "replay.capacity must be > 0"),
    (["agent.lr=-1e-3"], "agent.lr must be > 0"),
    (["agent.loss=l1"], "agent.loss must be one of huber, mse"),
    (["agent.network=resnet"], "agent.network must be one of mlp, nature_cnn"),
    (["run.log_level=loud"], "run.log_level must be one of"),
    (["agent.eps_end=-0.1"], "agent.eps_end must be within [0, 1]"),
    (["trainer.warmup=-1"], "trainer.warmup must be >= 0"),
    (["net.proxy_hold_ms=-5"], "net.proxy_hold_ms must be >= 0"),
    (["net.data_port=70000"], "net.data_port must be a port number"),
    (["agent.batch_size=64", "replay.capacity=32", "trainer.warmup=64"], "exceeds replay.capacity"),
    (["agent.batch_size=64", "trainer.warmup=10"], "trainer.warmup (10) must be at least agent.batch_size (64)"),
    (["trainer.min_samples_per_insert=32", "trainer.max_samples_per_insert=4"],
     "trainer.min_samples_per_insert (32) exceeds trainer.max_samples_per_insert (4)"),
    (["replay.device=gpu"], "replay.device must be one of auto, cpu, cuda"),
    (["replay.device=cuda", "run.device=cpu"], "replay.device: cuda keeps replay on the learner's CUDA device, but "
                                                "run.device is cpu"),
    (["replay.device=cuda", "run.device=auto", "agent.algo=r2d2", "replay.sequence_length=8", "replay.burn_in=2",
      "replay.overlap=2"], "replay.device: agent.algo=r2d2 builds its sequences' targets from sampled items on "
                           "the host"),
])
def test_range_checks(overrides: list[str], fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        config.load(None, overrides)
    assert fragment in str(info.value)


def test_a_rate_limiter_that_would_pause_and_wait_at_once_is_refused_where_a_new_user_sets_it() -> None:
    """The shipped CartPole config (min 32) with --set trainer.max_samples_per_insert=4: refused at load,
    naming both keys (it used to crawl: 2,092 transitions in 240 s); either key off, or min <= max, loads."""
    with pytest.raises(ConfigError) as info:
        config.load(CARTPOLE_YAML, ["trainer.max_samples_per_insert=4"])
    assert "trainer.min_samples_per_insert (32)" in str(info.value) and "max_samples_per_insert (4)" in str(info.value)
    assert str(CARTPOLE_YAML) in str(info.value)
    for ok in (["trainer.max_samples_per_insert=0"], ["trainer.max_samples_per_insert=32"],
               ["trainer.max_samples_per_insert=4", "trainer.min_samples_per_insert=0"]):
        cfg = config.load(CARTPOLE_YAML, ok)
        assert cfg.trainer.max_samples_per_insert in (0, 4, 32)


def test_range_check_names_the_file(tmp_path: Path) -> None:
    path = write_yaml(tmp_path, {"agent": {"gamma": 1.5}})
    with pytest.raises(ConfigError, match="agent.gamma") as info:
        config.load(path)
    assert str(path) in str(info.value)


def test_boundary_values_are_accepted() -> None:
    cfg = config.load(None, ["agent.gamma=1.0", "agent.tau=1.0", "agent.eps_end=0", "trainer.save_interval=0",
                             "agent.max_grad_norm=0", "net.data_port=0", "net.model_port=65535"])
    assert cfg.agent.gamma == 1.0 and cfg.trainer.save_interval == 0 and cfg.net.model_port == 65535


# ---------------------------------------------------------------- dump and flat views


def test_dump_load_round_trip(tmp_path: Path) -> None:
    cfg = config.load(CARTPOLE_YAML, ["agent.lr=3e-4", "agent.hidden=[32, 16]", "env.kwargs={a: 1}",
                                      "env.max_episode_steps=200", "trainer.stop_return=null",
                                      "env.wrappers=[float32_obs]"])
    path = tmp_path / "resolved.yaml"
    config.dump(cfg, path)
    again = config.load(path)
    assert again == cfg
    assert again is not cfg
    # the dump is plain YAML with every section
    data = yaml.safe_load(path.read_text())
    assert set(data) == {f.name for f in dataclasses.fields(Config)}


def test_to_flat_dict_has_every_field_once() -> None:
    flat = config.to_flat_dict(Config())
    expected = sum(len(dataclasses.fields(getattr(Config(), f.name))) for f in dataclasses.fields(Config))
    assert len(flat) == expected
    assert flat["agent.lr"] == 1e-3 and flat["run.seed"] == 0


# ---------------------------------------------------------------- the CLI


def run_cli(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "zmqrl.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120)


@pytest.mark.slow
def test_cli_missing_config_file_exits_2_with_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "BADFILE.yaml"
    proc = run_cli("train", str(bad), "--run-dir", str(tmp_path / "run"))
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "config error" in lines[0] and str(bad) in lines[0]
    assert not (tmp_path / "run").exists()


def test_cli_bad_set_exits_2_naming_the_key(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code = cli.main(["train", str(CARTPOLE_YAML), "--run-dir", str(tmp_path / "run"), "--set", "agent.lrr=0.1"])
    assert code == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert "agent.lrr" in err and "did you mean 'lr'" in err
    assert not (tmp_path / "run").exists()


def test_cli_bad_value_in_file_exits_2_naming_key_and_file(capsys: pytest.CaptureFixture[str],
                                                            tmp_path: Path) -> None:
    path = write_yaml(tmp_path, {"agent": {"batch_size": "abc"}})
    code = cli.main(["train", str(path)])
    assert code == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1
    assert "agent.batch_size" in err and str(path) in err and "expected int" in err


def test_cli_set_without_equals_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["train", "--set", "agent.lr"]) == 2
    err = capsys.readouterr().err
    assert "agent.lr" in err and "key=value" in err


@pytest.mark.slow
def test_cli_resume_without_checkpoint_exits_2_naming_it(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc = run_cli("train", str(CARTPOLE_YAML), "--run-dir", str(run_dir), "--resume")
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "checkpoint error" in proc.stderr and str(run_dir / "checkpoints" / "latest") in proc.stderr


def test_override_number_like_text_stays_text_for_str_fields() -> None:
    cfg = config.load(CARTPOLE_YAML, ["run.name=1e3", "agent.lr=1e-3"])
    assert cfg.run.name == "1e3" and cfg.agent.lr == pytest.approx(1e-3)


@pytest.mark.slow
def test_cli_taken_port_exits_98_naming_the_address(tmp_path: Path) -> None:
    """A role whose bind address is taken says which and exits 98, the code `zmqrl local` retries on."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        addr = f"tcp://127.0.0.1:{squatter.getsockname()[1]}"
        proc = run_cli("proxy", str(CARTPOLE_YAML), "--run-dir", str(tmp_path / "run"), "--bind", addr,
                       "--learner", "tcp://127.0.0.1:1")
    assert proc.returncode == 98, proc.stderr
    assert "Traceback" not in proc.stderr
    assert addr in proc.stderr and "Address already in use" in proc.stderr, proc.stderr


# ---------------------------------------------------------------- where replay lives


def test_replay_device_resolves_to_the_host_or_the_learners_cuda_device(monkeypatch: pytest.MonkeyPatch) -> None:
    """``auto``: the learner's device where it is CUDA, else the host (and always the host for sequences);
    ``cuda`` without CUDA is an error naming the key; ``cpu`` is the host."""
    import torch

    from zmqrl.run.startup import replay_device

    for overrides in (["replay.device=cpu"], ["replay.device=auto", "run.device=cpu"],
                      ["replay.device=cpu", "run.device=auto"],
                      ["replay.device=auto", "run.device=auto", "agent.algo=r2d2", "replay.sequence_length=8",
                       "replay.burn_in=2", "replay.overlap=2"]):
        assert replay_device(config.load(None, overrides)) is None, overrides
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert replay_device(config.load(None, ["replay.device=auto", "run.device=auto"])) is None
    with pytest.raises(ConfigError, match=r"replay.device: cuda requested but no CUDA device is available"):
        replay_device(config.load(None, ["replay.device=cuda", "run.device=auto"]))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # as on a GPU host (nothing is allocated here)
    assert replay_device(config.load(None, ["replay.device=auto", "run.device=cuda:1"])) == "cuda:1"
    assert replay_device(config.load(None, ["replay.device=cuda", "run.device=auto"])) == "cuda"


@pytest.mark.slow
def test_on_a_host_without_a_gpu_driver_auto_decides_without_torch() -> None:
    """The learner starts inserting before torch has loaded: ``auto`` with ``run.device: auto`` needs no torch
    where no GPU driver is present (nor with ``CUDA_VISIBLE_DEVICES`` empty)."""
    code = ("import sys; from zmqrl import config; from zmqrl.run.startup import make_replay_from; "
            "r = make_replay_from(config.load(None, ['run.device=auto', 'replay.device=auto'])); "
            "sys.exit(2 if 'torch' in sys.modules else 0 if type(r).__name__ == 'PrioritizedReplay' else 3)")
    env = {**__import__("os").environ, "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0, done.stderr


def test_the_bench_can_put_replay_on_the_cpus_torch() -> None:
    from zmqrl.replay.device import PrioritizedDeviceReplay
    from zmqrl.run.startup import make_replay_from

    cfg = config.load(CARTPOLE_YAML, ["replay.capacity=100"])
    replay = make_replay_from(cfg, torch_device="cpu", sum_tree="device")
    assert isinstance(replay, PrioritizedDeviceReplay) and replay.sum_tree == "device"
    assert replay.device.type == "cpu" and replay.capacity == 100
