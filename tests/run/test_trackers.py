"""Trackers against the real things: an MLflow tracking server on loopback (its own database) read back
through MLflow's client, W&B's offline run files, TensorBoard's event files; a real ``zmqrl train`` run
recording to all three; and the failure isolation that keeps a tracker from ever stopping training."""

from __future__ import annotations

import json
import logging
import math
import os
import signal
import struct
import subprocess
import sys
import time
import urllib.request
import uuid
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from procs import wait_for
from zmqrl.config import Config, ConfigError
from zmqrl.roles.addresses import free_port
from zmqrl.run.trackers import TrackerError, check_trackers, open_recorders, run_tags
from zmqrl.run.trackers.background import Background
from zmqrl.run.trackers.common import finite, flatten
from zmqrl.run.trackers.fanout import FanOut
from zmqrl.run.trackers.mlflow_tracker import MLflowRecorder, mlflow_key

pytest.importorskip("mlflow")
pytest.importorskip("wandb")

SERVER_START_S = 180.0  # measured 16-25 s on 2 shared cores; generous for a loaded machine


# --- helpers -----------------------------------------------------------------------------------
class MlflowServer:
    """``mlflow server`` on 127.0.0.1 with its own SQLite database and artifact folder."""

    def __init__(self, root: Path, port: int | None = None, telemetry: bool = False) -> None:
        self.root = root
        self.telemetry = telemetry
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = root / "server.log"

    def start(self) -> MlflowServer:
        self.root.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        if not self.telemetry:
            env.update(MLFLOW_DISABLE_TELEMETRY="true", DO_NOT_TRACK="true")
        cmd = [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", f"sqlite:///{self.root}/mlflow.db",
               "--artifacts-destination", str(self.root / "artifacts"), "--host", "127.0.0.1",
               "--port", str(self.port), "--workers", "1"]
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=self.root, env=env,
                                         start_new_session=True)  # its own group: the workers go with it
        t0 = time.monotonic()
        wait_for(lambda: self._healthy() or self.proc.poll() is not None, SERVER_START_S, "mlflow server /health")
        if self.proc.poll() is not None:
            raise RuntimeError(f"mlflow server exited {self.proc.returncode}:\n{self.log.read_text()[-3000:]}")
        self.start_s = time.monotonic() - t0
        return self

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=1) as r:
                return r.status == 200
        except OSError:
            return False

    def kill(self) -> None:
        """Gone at once, as a crashed server or a lost link."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(2)  # its graceful shutdown can take 10 s; nothing here needs it
        except subprocess.TimeoutExpired:
            self.kill()


# the tests on the module's server, to run on one worker so that it starts once (16-25 s) in a run of the suite
# (tests/conftest.py names the group in their ids, which pytest-xdist's own hook cannot under pytest 9.2)
ONE_SERVER = pytest.mark.xdist_group("mlflow-server")


@pytest.fixture(scope="module")
def module_mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MlflowServer]:
    server = MlflowServer(tmp_path_factory.mktemp("mlflow-server")).start()
    print(f"mlflow server ready in {server.start_s:.1f} s")
    yield server
    server.stop()


@pytest.fixture
def mlflow_server(module_mlflow_server: MlflowServer) -> MlflowServer:
    """The module's server, started again on its address if a test before this one left it down (the
    server-gone test, last in the module, kills it)."""
    if module_mlflow_server.proc is None or module_mlflow_server.proc.poll() is not None:
        module_mlflow_server.start()
    return module_mlflow_server


@pytest.fixture(autouse=True)
def quiet_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Nothing leaves loopback or lands in the home directory."""
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
    monkeypatch.setenv("DO_NOT_TRACK", "true")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    for var in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR"):
        monkeypatch.setenv(var, str(tmp_path / "wandb-home" / var.lower()))
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)


def make_run_dir(root: Path, big_bytes: int = 0) -> Path:
    run_dir = root / f"cartpole-{uuid.uuid4().hex[:8]}"
    (run_dir / "checkpoints" / "best").mkdir(parents=True)
    (run_dir / "checkpoints" / "latest").mkdir(parents=True)
    (run_dir / "config.yaml").write_text("run:\n  name: cartpole\nenv:\n  id: CartPole-v1\n")
    (run_dir / "checkpoints" / "best" / "model.pt").write_bytes(bytes(range(256)) * 4)
    (run_dir / "checkpoints" / "latest" / "model.pt").write_bytes(b"latest")  # not an artifact
    if big_bytes:
        (run_dir / "checkpoints" / "best" / "replay.npz").write_bytes(b"\0" * big_bytes)
    return run_dir


LONG = "x" * 7000
FLAT = {
    "run.name": "cartpole", "run.seed": 3, "env.id": "CartPole-v1", "env.kwargs": {"render_mode": None, "g": 9.8},
    "env.wrappers": ["atari", "frame_stack"], "agent.algo": "dqn", "agent.lr": 0.00025, "agent.double": True,
    "agent.note": LONG, "agent.odd[key]": "a", **{f"extra.p{i:03d}": i for i in range(150)},
}


def values_at(step: int) -> dict[str, float]:
    vals = {f"train/m{i:02d}": step * 0.5 + i for i in range(20)}
    vals["train/nan"] = math.nan  # left out, as TensorBoard's recorder does
    vals["train/none"] = None  # type: ignore[assignment]
    return vals


STEPS = [0, 10, 20, 30, 40]


def tags_of(cfg: Config, run_dir: Path) -> dict[str, str]:
    return run_tags(cfg, run_dir)


def mlflow_fan(run_dir: Path, params: dict[str, Any], tags: dict[str, str], url: str, experiment: str,
               artifact_max_mb: float = 100.0) -> tuple[FanOut, Background]:
    """An MLflow recorder on its own thread, as open_recorders makes it, with ``params`` of our choosing."""
    def opener() -> MLflowRecorder:
        return MLflowRecorder(run_dir, params, tags, tracking_uri=url, experiment=experiment, run_name=run_dir.name,
                              artifact_max_mb=artifact_max_mb)

    bg = Background("mlflow", opener, transient=MLflowRecorder.transient)
    return FanOut([bg]), bg


def wandb_fan(run_dir: Path, params: dict[str, Any], tags: dict[str, str]) -> FanOut:
    from zmqrl.run.trackers.wandb_tracker import WandbRecorder

    def opener() -> WandbRecorder:
        return WandbRecorder(run_dir, params, tags, project="zmqrl-test", group="cartpole", run_name=run_dir.name)

    return FanOut([Background("wandb", opener, transient=WandbRecorder.transient)])


# --- MLflow ------------------------------------------------------------------------------------
@pytest.mark.slow
@ONE_SERVER
@pytest.mark.timeout(300)
def test_mlflow_records_read_back(mlflow_server: MlflowServer, tmp_path: Path,
                                  cartpole_cfg: Callable[..., Config]) -> None:
    from mlflow import MlflowClient

    run_dir = make_run_dir(tmp_path, big_bytes=4096)
    experiment = f"exp-{uuid.uuid4().hex[:8]}"
    fan, _ = mlflow_fan(run_dir, FLAT, tags_of(cartpole_cfg(), run_dir), mlflow_server.url, experiment,
                        artifact_max_mb=2048 / 2**20)  # 2 KB: the 4 KB replay.npz is left out
    fan.text("config", "```\nrun.name: cartpole\n```")
    for step in STEPS:
        fan.scalars(step, values_at(step))
    (run_dir / "summary.json").write_text(json.dumps({"best_eval_return": 195.5}))
    fan.hparams(FLAT, {"best_eval_return": 195.5, "env_steps": 1000.0, "missing": math.nan})
    fan.artifacts(run_dir)
    fan.close()
    stats = fan.stats()["mlflow"]
    assert stats["sent"] == len(STEPS) and stats["dropped"] == 0 and stats["rejected"] == 0, stats

    client = MlflowClient(mlflow_server.url)
    state = json.loads((run_dir / "trackers.json").read_text())["mlflow"]
    run = client.get_run(state["run_id"])
    assert client.get_experiment(run.info.experiment_id).name == experiment
    assert run.info.status == "FINISHED"
    assert run.info.run_name == run_dir.name
    # params: flattened, lists as JSON, the long value cut to MLflow's limit, odd keys made valid, >100 in all
    params = run.data.params
    assert params["env.id"] == "CartPole-v1" and params["run.seed"] == "3" and params["agent.lr"] == "0.00025"
    assert params["agent.double"] == "True"
    assert params["env.kwargs.render_mode"] == "None" and params["env.kwargs.g"] == "9.8"
    assert params["env.wrappers"] == '["atari", "frame_stack"]'
    assert params["agent.note"] == "x" * 5997 + "..." and len(params["agent.note"]) == 6000
    assert params["agent.odd_key_"] == "a"
    assert all(params[f"extra.p{i:03d}"] == str(i) for i in range(150))
    # tags
    tags = run.data.tags
    assert tags["zmqrl.env_id"] == "CartPole-v1" and tags["zmqrl.algo"] == "dqn"
    assert tags["zmqrl.version"] and tags["zmqrl.run_dir"] == str(run_dir.resolve())
    # metrics at their steps, exact values; NaN and None left out
    for i in range(20):
        history = client.get_metric_history(run.info.run_id, f"train/m{i:02d}")
        assert sorted((m.step, m.value) for m in history) == [(s, s * 0.5 + i) for s in STEPS]
    assert client.get_metric_history(run.info.run_id, "train/nan") == []
    assert client.get_metric_history(run.info.run_id, "train/none") == []
    final = client.get_metric_history(run.info.run_id, "hparam/best_eval_return")
    assert [(m.step, m.value) for m in final] == [(STEPS[-1], 195.5)]
    assert "hparam/missing" not in run.data.metrics
    # artifacts: the small files, byte for byte; the big one and checkpoints/latest left out
    listed = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert listed == {"checkpoints", "config.yaml", "summary.json", "text"}, listed
    best = {a.path for a in client.list_artifacts(run.info.run_id, "checkpoints/best")}
    assert best == {"checkpoints/best/model.pt"}
    assert {a.path for a in client.list_artifacts(run.info.run_id, "checkpoints")} == {"checkpoints/best"}
    got = Path(client.download_artifacts(run.info.run_id, "", str(tmp_path / "download")))
    for rel in ("config.yaml", "summary.json", "checkpoints/best/model.pt"):
        assert (got / rel).read_bytes() == (run_dir / rel).read_bytes(), rel
    assert (got / "text" / "config.md").read_text() == "```\nrun.name: cartpole\n```"


@pytest.mark.slow
@ONE_SERVER
@pytest.mark.timeout(300)
def test_mlflow_resumed_run_continues(mlflow_server: MlflowServer, tmp_path: Path,
                                      caplog: pytest.LogCaptureFixture) -> None:
    from mlflow import MlflowClient

    run_dir = make_run_dir(tmp_path)
    fan, _ = mlflow_fan(run_dir, {"agent.lr": 0.1, "trainer.max_opts": 100}, {}, mlflow_server.url, "resume")
    fan.scalars(50, {"train/loss": 1.0})
    fan.close()
    first = json.loads((run_dir / "trackers.json").read_text())["mlflow"]["run_id"]

    caplog.set_level(logging.INFO, logger="zmqrl")
    fan, _ = mlflow_fan(run_dir, {"agent.lr": 0.1, "trainer.max_opts": 200, "agent.new": 7}, {}, mlflow_server.url,
                        "resume")
    fan.scalars(150, {"train/loss": 0.5})
    fan.close()
    assert json.loads((run_dir / "trackers.json").read_text())["mlflow"]["run_id"] == first
    client = MlflowClient(mlflow_server.url)
    run = client.get_run(first)
    assert run.info.status == "FINISHED"
    assert run.data.params == {"agent.lr": "0.1", "trainer.max_opts": "100", "agent.new": "7"}
    assert [(m.step, m.value) for m in client.get_metric_history(first, "train/loss")] == [(50, 1.0), (150, 0.5)]
    assert any("keep the old ones: trainer.max_opts" in r.getMessage() for r in caplog.records)
    assert any(f"continuing run {first}" in r.getMessage() for r in caplog.records)


@pytest.mark.timeout(120)
def test_mlflow_unreachable_from_the_start(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                           cartpole_cfg: Callable[..., Config],
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """No server at all: opening is retried in the background, training calls are prompt, close bounded."""
    import zmqrl.run.trackers as trackers

    monkeypatch.setattr(trackers, "CLOSE_TIMEOUT_S", 3.0)
    monkeypatch.setattr(trackers, "QUEUE_SIZE", 20)
    caplog.set_level(logging.INFO, logger="zmqrl")
    run_dir = make_run_dir(tmp_path)
    cfg = cartpole_cfg("run.trackers=[mlflow]", f"run.mlflow_uri=http://127.0.0.1:{free_port()}")
    t0 = time.monotonic()
    fan = open_recorders(cfg, run_dir)
    for step in range(100):
        fan.scalars(step, values_at(step))
    assert time.monotonic() - t0 < 1.0
    wait_for(lambda: any("mlflow: opening failed" in r.getMessage() for r in caplog.records), 60, "the failure")
    t0 = time.monotonic()
    fan.close()
    assert time.monotonic() - t0 < 3.0 + 2.0
    snap = fan.stats()["mlflow"]
    assert snap["sent"] == 0 and snap["dropped"] == 100 and snap["pending"] == 0, snap


# --- W&B offline ---------------------------------------------------------------------------------
def wandb_records(path: Path) -> Iterator[object]:
    """The records of a ``.wandb`` file (a LevelDB-style log of protobuf ``Record`` messages)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    ident, magic, version = struct.unpack("<4sHB", data[:7])
    assert (ident, magic, version) == (b":W&B", 0xBEE1, 0), (ident, magic, version)
    block, pos, pending = 32768, 7, b""
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:  # a block's tail too short for a header is padding
            pos += left
            continue
        crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if kind == 0 and length == 0:
            pos += left
            continue
        chunk = data[pos + 7:pos + 7 + length]
        pos += 7 + length
        assert zlib.crc32(bytes([kind]) + chunk) & 0xFFFFFFFF == crc, "corrupt record"
        if kind in (1, 2):  # full, first
            pending = chunk
        else:  # middle, last
            pending += chunk
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(pending)
            yield record


def _items(updates: object) -> dict[str, object]:
    return {(u.key or "/".join(u.nested_key)): json.loads(u.value_json) for u in updates}


@pytest.mark.timeout(180)
@pytest.mark.slow
def test_wandb_offline_files(tmp_path: Path, cartpole_cfg: Callable[..., Config]) -> None:
    run_dir = make_run_dir(tmp_path)
    fan = wandb_fan(run_dir, FLAT, tags_of(cartpole_cfg(), run_dir))
    fan.text("config", "run.name: cartpole")
    for step in STEPS + [25]:
        fan.scalars(step, values_at(step))
    (run_dir / "summary.json").write_text(json.dumps({"best_eval_return": 195.5}))
    fan.hparams(FLAT, {"best_eval_return": 195.5, "missing": math.nan})
    fan.artifacts(run_dir)
    fan.close()
    stats = fan.stats()["wandb"]
    assert stats["sent"] == len(STEPS) + 1 and stats["dropped"] == 0 and stats["rejected"] == 0, stats

    state = json.loads((run_dir / "trackers.json").read_text())["wandb"]
    offline = list((run_dir / "wandb").glob(f"offline-run-*-{state['run_id']}*"))
    assert len(offline) == 1, list((run_dir / "wandb").iterdir())
    offline = offline[0]
    records = list(wandb_records(offline / f"run-{state['run_id']}.wandb"))
    by_type: dict[str, list] = {}
    for r in records:
        by_type.setdefault(r.WhichOneof("record_type"), []).append(r)

    assert "run" in by_type, {k: len(v) for k, v in by_type.items()}
    run = by_type["run"][0].run
    assert run.project == "zmqrl-test" and run.display_name == run_dir.name and run.run_group == "cartpole"
    version = tags_of(cartpole_cfg(), run_dir)["zmqrl.version"]
    assert set(run.tags) == {"env_id:CartPole-v1", "algo:dqn", f"version:{version}"}
    config = _items(run.config.update)
    assert config["env.id"] == "CartPole-v1" and config["agent.lr"] == 0.00025 and config["run.seed"] == 3
    assert config["env.kwargs.g"] == 9.8 and config["env.wrappers"] == ["atari", "frame_stack"]
    assert config["agent.note"] == LONG and config["extra.p149"] == 149

    rows = [_items(r.history.item) for r in by_type["history"]]
    assert [row["opt_step"] for row in rows] == STEPS + [25]  # an earlier step again (a resumed run) is kept
    assert rows[-1]["train/m00"] == 25 * 0.5
    for row, step in zip(rows[:-1], STEPS, strict=True):
        assert {k: v for k, v in row.items() if k.startswith("train/")} == {
            f"train/m{i:02d}": step * 0.5 + i for i in range(20)}
    summary: dict[str, object] = {}
    for r in by_type["summary"]:
        summary.update(_items(r.summary.update))
    assert summary["hparam/best_eval_return"] == 195.5 and "hparam/missing" not in summary
    assert summary["train/m19"] == 25 * 0.5 + 19  # the last row
    assert by_type["exit"][0].exit.exit_code == 0

    saved = {f.path for r in by_type.get("files", []) for f in r.files.files}
    assert {"text/config.md", "run/config.yaml", "run/summary.json", "run/checkpoints/best/model.pt"} <= saved, saved
    files = offline / "files"
    assert (files / "text" / "config.md").read_text() == "run.name: cartpole"
    for rel in ("config.yaml", "summary.json", "checkpoints/best/model.pt"):
        copy = files / "run" / rel
        assert not copy.is_symlink() and copy.read_bytes() == (run_dir / rel).read_bytes()
    assert not (files / "run" / "checkpoints" / "latest").exists()
    assert not list(Path(tmp_path / "wandb-home").rglob("*netrc*"))


@pytest.mark.timeout(180)
@pytest.mark.slow
def test_wandb_offline_resume_keeps_the_run_id(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    run_dir = make_run_dir(tmp_path)
    fan = wandb_fan(run_dir, {"agent.lr": 0.1}, {})
    for step in (100, 200):
        fan.scalars(step, {"train/loss": step / 100})
    fan.close()
    run_id = json.loads((run_dir / "trackers.json").read_text())["wandb"]["run_id"]
    fan = wandb_fan(run_dir, {"agent.lr": 0.1}, {})  # resumed from a checkpoint at step 150
    for step in (150, 250):
        fan.scalars(step, {"train/loss": step / 100})
    fan.close()
    assert json.loads((run_dir / "trackers.json").read_text())["wandb"]["run_id"] == run_id
    parts = sorted((run_dir / "wandb").glob(f"offline-run-*-{run_id}*"))
    assert len(parts) == 2
    steps = [[_items(r.history.item)["opt_step"] for r in wandb_records(p / f"run-{run_id}.wandb")
              if r.WhichOneof("record_type") == "history"] for p in parts]
    assert steps == [[100, 200], [150, 250]]
    assert "WARNING" not in capfd.readouterr().err


# --- TensorBoard, and several at once ---------------------------------------------------------
@pytest.mark.timeout(180)
@pytest.mark.slow
def test_tensorboard_default_and_fanout(tmp_path: Path, cartpole_cfg: Callable[..., Config]) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir = make_run_dir(tmp_path)
    assert cartpole_cfg().run.trackers == ["tensorboard"]
    fan = open_recorders(cartpole_cfg("run.trackers=[tensorboard, wandb]"), run_dir)
    assert [r.name for r in fan.recorders] == ["tensorboard", "wandb"]
    for step in STEPS:
        fan.scalars(step, values_at(step))
    fan.histogram(STEPS[-1], "perf/policy_lag", [1, 2, 2, 3])  # TensorBoard only
    fan.hparams({"agent.lr": 0.1}, {"best_eval_return": 1.5})
    fan.artifacts(run_dir)
    fan.close()
    acc = EventAccumulator(str(run_dir / "tb"), size_guidance={"scalars": 0})
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("train/m03")] == [(s, s * 0.5 + 3) for s in STEPS]
    assert "train/nan" not in acc.Tags()["scalars"]
    assert acc.Histograms("perf/policy_lag")[0].step == STEPS[-1]
    assert fan.stats()["wandb"]["sent"] == len(STEPS)
    assert all(v["errors"] == 0 for v in fan.stats().values())


class Flaky:
    name = "flaky"

    def __init__(self) -> None:
        self.broken = True
        self.calls = 0
        self.ok = 0

    def scalars(self, step: int, values: object) -> None:
        self.calls += 1
        if self.broken:
            raise ConnectionError("tracker unreachable")
        self.ok += 1

    def close(self, failed: bool = False) -> None:
        raise OSError("closing failed too")


class Good:
    name = "good"

    def __init__(self) -> None:
        self.steps: list[int] = []
        self.closed = False

    def scalars(self, step: int, values: object) -> None:
        self.steps.append(step)

    def close(self, failed: bool = False) -> None:
        self.closed = True


@pytest.mark.timeout(60)
def test_fanout_isolates_a_failing_recorder(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="zmqrl")
    flaky, good = Flaky(), Good()
    fan = FanOut([flaky, good], backoff_s=(60.0, 300.0))
    for step in range(1000):
        fan.scalars(step, {"x": 1.0})
    assert good.steps == list(range(1000))
    assert flaky.calls == 1  # then skipped for the backoff period
    assert fan.stats()["flaky"] == {"errors": 1, "skipped": 999}
    lines = [r for r in caplog.records if r.getMessage().startswith("flaky:")]
    assert len(lines) == 1 and "ConnectionError: tracker unreachable" in lines[0].getMessage()

    # retried after its backoff; a success resets it and says so
    fan = FanOut([flaky, good], backoff_s=(0.01, 0.01))
    fan.scalars(0, {"x": 1.0})
    flaky.broken = False
    step = iter(range(1, 10**6))
    wait_for(lambda: fan.scalars(next(step), {"x": 1.0}) or flaky.ok > 0, 10, "a retry")
    assert any(r.getMessage().startswith("flaky: working again") for r in caplog.records)
    fan.close()  # its close raises: logged, the others still closed
    assert good.closed


@pytest.mark.timeout(60)
def test_fanout_rate_limits_failure_lines(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="zmqrl")
    flaky = Flaky()
    fan = FanOut([flaky], backoff_s=(0.0, 0.0), log_interval_s=3600)
    for step in range(500):
        fan.scalars(step, {})
    assert flaky.calls == 500 and fan.stats()["flaky"]["errors"] == 500
    assert len([r for r in caplog.records if r.getMessage().startswith("flaky:")]) == 1


def test_missing_extras_and_bad_settings(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                         cartpole_cfg: Callable[..., Config]) -> None:
    monkeypatch.setitem(sys.modules, "mlflow", None)  # as if not installed
    monkeypatch.setitem(sys.modules, "wandb", None)
    with pytest.raises(TrackerError) as err:
        open_recorders(cartpole_cfg("run.trackers=[tensorboard, mlflow]", "run.mlflow_uri=http://x"), tmp_path)
    assert str(err.value) == "run.trackers has mlflow, but mlflow is not installed: pip install 'zmqrl[mlflow]'"
    with pytest.raises(TrackerError, match=r"pip install 'zmqrl\[wandb\]'$"):
        check_trackers(cartpole_cfg("run.trackers=[wandb]"))
    monkeypatch.delitem(sys.modules, "mlflow")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    with pytest.raises(TrackerError, match="no tracking server is set"):
        check_trackers(cartpole_cfg("run.trackers=[mlflow]"))
    with pytest.raises(ConfigError, match="run.trackers: unknown tracker 'neptune'"):
        cartpole_cfg("run.trackers=[neptune]")
    with pytest.raises(ConfigError, match="run.wandb_mode must be one of offline, online, disabled"):
        cartpole_cfg("run.wandb_mode=cloud")
    assert issubclass(TrackerError, ConfigError)
    assert not (tmp_path / "tb").exists()  # nothing opened before the settings were checked
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:1")
    check_trackers(cartpole_cfg("run.trackers=[mlflow]"))  # the environment variable is enough


def test_helpers() -> None:
    assert mlflow_key("train/loss") == "train/loss"
    assert mlflow_key("a//b/../c") == "a/c"
    assert mlflow_key("../x") == "_/x"
    assert mlflow_key("q[0]@k") == "q_0__k"
    assert len(mlflow_key("k" * 300)) == 250
    assert flatten({"a": {"b": {"c": 1}, "d": {}}, "e": 2}) == {"a.b.c": 1, "a.d": {}, "e": 2}
    assert finite({"a": 1, "b": math.inf, "c": None, "d": "x", "e": 2.5}) == {"a": 1.0, "e": 2.5}


@pytest.mark.timeout(120)
def test_training_thread_cost_of_a_scalars_call(tmp_path: Path) -> None:
    """Enqueueing ~20 values for a background tracker costs microseconds, whatever the tracker does."""
    import threading

    release = threading.Event()

    class Slow:
        name = "slow"

        def scalars_many(self, items: object) -> None:
            release.wait(30)

        def close(self, failed: bool = False) -> None:
            pass

    bg = Background("slow", Slow, queue_size=100_000)
    vals = values_at(1)
    n = 2000
    t0 = time.perf_counter()
    for step in range(n):
        bg.scalars(step, vals)
    per_call = (time.perf_counter() - t0) / n
    release.set()
    bg.close()
    assert per_call < 0.001, per_call


@pytest.mark.timeout(60)
def test_background_sends_in_order_in_batches_within_limits() -> None:
    import threading

    gate = threading.Event()
    batches: list[list[tuple[int, int]]] = []

    class Recording:
        name = "recording"

        def scalars_many(self, items: list) -> None:
            gate.wait(30)
            batches.append([(step, len(values)) for step, values, _ in items])

        def close(self, failed: bool = False) -> None:
            pass

    bg = Background("recording", Recording, max_batch=50, max_values=1000)
    for step in range(200):
        bg.scalars(step, {f"v{i}": float(i) for i in range(30)})
    gate.set()
    bg.close()
    assert [s for b in batches for s, _ in b] == list(range(200))  # all, once, in order
    assert all(sum(n for _, n in b) <= 1000 and len(b) <= 50 for b in batches)
    assert max(len(b) for b in batches) == 33  # 33 x 30 values fill a request


@pytest.mark.slow
@ONE_SERVER
@pytest.mark.timeout(400)
def test_a_training_run_records_to_every_tracker(mlflow_server: MlflowServer, tmp_path: Path,
                                                 cartpole_cfg: Callable[..., Config]) -> None:
    """``zmqrl train`` with all three trackers: the same evaluations at the same steps in each, the run's
    params, the time-spent and rate records, and the run directory's small files."""
    from mlflow import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from zmqrl.run.train import train

    cfg = cartpole_cfg("trainer.max_opts=300", "trainer.warmup=100", "trainer.eval_interval=100",
                       "trainer.eval_episodes=2", "trainer.record_interval=50", "trainer.stop_return=null",
                       "trainer.save_interval=0", "run.trackers=[tensorboard, mlflow, wandb]", "run.name=e2e",
                       f"run.mlflow_uri={mlflow_server.url}", "run.mlflow_experiment=train-e2e")
    run_dir = tmp_path / "run"
    summary = train(cfg, run_dir)
    evals = [(e["opt_steps"], e["return_mean"]) for e in summary["evals"]]
    assert [step for step, _ in evals] == [100, 200, 300]
    state = json.loads((run_dir / "trackers.json").read_text())

    client = MlflowClient(mlflow_server.url)
    run = client.get_run(state["mlflow"]["run_id"])
    assert run.info.status == "FINISHED" and run.info.run_name == "run"
    assert sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, "eval/return_mean")) == evals
    assert run.data.params["agent.lr"] == str(cfg.agent.lr) and run.data.params["run.trackers"] == \
        '["tensorboard", "mlflow", "wandb"]'
    for key in ("cost/update", "cost/sample", "cost/act", "perf/replay_samples_per_s", "hparam/best_eval_return"):
        assert key in run.data.metrics, sorted(run.data.metrics)
    listed = {a.path for a in client.list_artifacts(run.info.run_id, "checkpoints/best")}
    assert listed == {"checkpoints/best/policy.npz", "checkpoints/best/state.json"}

    offline = next((run_dir / "wandb").glob(f"offline-run-*-{state['wandb']['run_id']}"))
    rows = [_items(r.history.item) for r in wandb_records(offline / f"run-{state['wandb']['run_id']}.wandb")
            if r.WhichOneof("record_type") == "history"]
    assert [(row["opt_step"], row["eval/return_mean"]) for row in rows if "eval/return_mean" in row] == evals

    acc = EventAccumulator(str(run_dir / "tb"), size_guidance={"scalars": 0})
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("eval/return_mean")] == [(s, pytest.approx(v)) for s, v in evals]


@pytest.mark.slow
@ONE_SERVER
@pytest.mark.timeout(400)
def test_mlflow_server_gone_never_stops_training(mlflow_server: MlflowServer, tmp_path: Path,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    """Kill the server mid-run: calls stay prompt, the failure is logged once, the queue stays bounded;
    a server back on the same address gets what was held; close is bounded either way. (The module's
    server, killed for good at the end: this test is the module's last that uses it.)"""
    from mlflow import MlflowClient

    caplog.set_level(logging.INFO, logger="zmqrl")
    server = mlflow_server
    try:
        run_dir = make_run_dir(tmp_path)
        opener_calls = []

        def opener() -> MLflowRecorder:
            opener_calls.append(1)
            return MLflowRecorder(run_dir, {"agent.lr": 0.1}, {"zmqrl.algo": "dqn"}, tracking_uri=server.url,
                                  experiment="gone", run_name=run_dir.name)

        bg = Background("mlflow", opener, queue_size=50, backoff_s=(0.2, 1.0), close_timeout_s=5.0,
                        transient=MLflowRecorder.transient)
        fan = FanOut([bg])
        for step in range(5):
            fan.scalars(step, values_at(step))
        wait_for(lambda: bg.stats.sent == 5, 120, "the first scalars sent")

        server.kill()
        worst = 0.0
        t_all = time.monotonic()
        for step in range(5, 205):  # 200 calls while the server is gone
            t0 = time.perf_counter()
            fan.scalars(step, values_at(step))
            worst = max(worst, time.perf_counter() - t0)
        elapsed = time.monotonic() - t_all
        assert worst < 0.05 and elapsed < 1.0, (worst, elapsed)
        wait_for(lambda: any("mlflow: scalars failed" in r.getMessage() for r in caplog.records), 30,
                 "the failure logged")
        wait_for(lambda: bg.stats.failures >= 3, 30, "retries with backoff")
        failure_lines = [r for r in caplog.records if "mlflow: scalars failed" in r.getMessage()]
        assert len(failure_lines) == 1, [r.getMessage() for r in failure_lines]  # the rest within the interval
        assert failure_lines[0].levelno == logging.WARNING and "retrying in" in failure_lines[0].getMessage()
        snap = bg.snapshot()
        assert snap["pending"] <= 50 and snap["dropped"] >= 150 - 1, snap  # bounded, oldest dropped, counted
        assert fan.stats()["mlflow"]["errors"] == 0  # FanOut saw nothing: Background never raises

        # the same server comes back: what the queue held goes through, in order, at its steps
        server.start()
        wait_for(lambda: bg.stats.sent + bg.stats.dropped == bg.stats.enqueued, 120,
                 "the held scalars sent after the restart")
        assert any("mlflow: working again" in r.getMessage() for r in caplog.records)
        client = MlflowClient(server.url)
        state = json.loads((run_dir / "trackers.json").read_text())["mlflow"]
        steps = [m.step for m in client.get_metric_history(state["run_id"], "train/m00")]
        kept = sorted(steps)
        assert kept[:5] == [0, 1, 2, 3, 4] and kept[-1] == 204
        assert len(kept) == 5 + (200 - bg.stats.dropped), (len(kept), bg.stats.dropped)
        assert len(opener_calls) == 1

        # gone again, for good: close returns within its timeout and says what was not sent
        server.kill()
        for step in range(205, 215):
            fan.scalars(step, values_at(step))
        t0 = time.monotonic()
        fan.close()
        assert time.monotonic() - t0 < 5.0 + 2.0
        assert any("gave up after 5 s at close" in r.getMessage() for r in caplog.records)
    finally:
        server.stop()  # (the module's server: the fixture starts it again for a test that comes later)
