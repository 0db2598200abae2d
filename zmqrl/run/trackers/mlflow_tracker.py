"""MLflow: params and tags at the start, metrics at their steps, the run directory's small files as
artifacts at the end; a run resumed in the same directory continues its MLflow run (``trackers.json``)."""

from __future__ import annotations

import logging
import os
import posixpath
import re
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from zmqrl.run.trackers.common import artifact_files, finite, flatten, param_text, read_state, write_state

log = logging.getLogger("zmqrl")

# MLflow's limits (mlflow.utils.validation)
MLFLOW_MAX_PARAM_VAL_LENGTH = 6000
MLFLOW_MAX_TAG_VAL_LENGTH = 8000
MLFLOW_MAX_KEY_LENGTH = 250
MLFLOW_MAX_PARAMS_TAGS_PER_BATCH = 100
MLFLOW_MAX_METRICS_PER_BATCH = 1000
# error codes MLflow answers for a request it will never accept: drop it, do not retry
MLFLOW_PERMANENT_ERRORS = frozenset({
    "INVALID_PARAMETER_VALUE", "RESOURCE_DOES_NOT_EXIST", "RESOURCE_ALREADY_EXISTS", "BAD_REQUEST",
    "INVALID_STATE", "PERMISSION_DENIED", "UNAUTHENTICATED", "ENDPOINT_NOT_FOUND", "NOT_IMPLEMENTED",
})

_MLFLOW_KEY_BAD = re.compile(r"[^/\w.\- :]")


def mlflow_key(name: str) -> str:
    """A name MLflow accepts: other characters become ``_``, no ``//``, ``.``, ``..``, at most 250 characters."""
    key = _MLFLOW_KEY_BAD.sub("_", str(name))
    key = posixpath.normpath(key).lstrip("/") if key else "_"
    while key.startswith(".."):
        key = "_" + key[2:]
    return (key or "_")[:MLFLOW_MAX_KEY_LENGTH]


def _truncate(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def configure_mlflow_http(timeout_s: int = 15) -> None:
    """Each MLflow request: no retries of its own (the background thread retries) and a bounded
    timeout; and no run URL printed to stdout at the end (the log has it from the start).

    Set only where the user has not: MLflow reads these variables at every request.
    """
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", str(timeout_s))
    os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")


class MLflowRecorder:
    """One MLflow run: params and tags at the start, metrics at their steps, artifacts at the end.

    Synchronous (each call is one or more HTTP requests, ~0.1 s on a small server): use it
    behind :class:`Background`, which :func:`open_recorders` does. Opening it imports mlflow
    (about 2 s) and creates or, when ``<run_dir>/trackers.json`` names one on the same
    server, continues the run.
    """

    name = "mlflow"

    def __init__(self, run_dir: Path, params: Mapping[str, Any], tags: Mapping[str, str], *, tracking_uri: str,
                 experiment: str, run_name: str, artifact_max_mb: float = 100.0) -> None:
        configure_mlflow_http()
        from mlflow import MlflowClient
        from mlflow.entities import Metric, Param, RunTag

        self._Metric, self._Param, self._RunTag = Metric, Param, RunTag
        self.run_dir = Path(run_dir)
        self.artifact_max_bytes = artifact_max_mb * 2**20
        self.client = MlflowClient(tracking_uri=tracking_uri)
        self.tracking_uri = tracking_uri
        self.last_step = 0
        self.experiment_id = self._experiment(experiment)
        self.run_id, resumed = self._run(run_name, tags)
        write_state(self.run_dir, "mlflow", {"tracking_uri": tracking_uri, "experiment_id": self.experiment_id,
                                             "run_id": self.run_id})
        self.logged_params: dict[str, str] = {}
        if resumed:
            self.logged_params = dict(self.client.get_run(self.run_id).data.params)
        self._log_params(params)
        where = (f"{tracking_uri.rstrip('/')}/#/experiments/{self.experiment_id}/runs/{self.run_id}"
                 if tracking_uri.startswith(("http://", "https://")) else tracking_uri)
        if not resumed:
            log.info("mlflow: run %s in experiment %r: %s", self.run_id, experiment, where)
        else:
            log.info("mlflow: continuing run %s: %s", self.run_id, where)

    def _experiment(self, name: str) -> str:
        found = self.client.get_experiment_by_name(name)
        if found is not None:
            return str(found.experiment_id)
        try:
            return str(self.client.create_experiment(name))
        except Exception as exc:  # created meanwhile by another run
            if getattr(exc, "error_code", None) != "RESOURCE_ALREADY_EXISTS":
                raise
            found = self.client.get_experiment_by_name(name)
            assert found is not None
            return str(found.experiment_id)

    def _run(self, run_name: str, tags: Mapping[str, str]) -> tuple[str, bool]:
        tags = {mlflow_key(k): _truncate(str(v), MLFLOW_MAX_TAG_VAL_LENGTH) for k, v in tags.items()}
        previous = read_state(self.run_dir).get("mlflow", {})
        if previous.get("run_id") and previous.get("tracking_uri") == self.tracking_uri:
            try:
                run = self.client.get_run(previous["run_id"])
            except Exception as exc:
                if getattr(exc, "error_code", None) != "RESOURCE_DOES_NOT_EXIST":
                    raise
            else:
                self.client.update_run(run.info.run_id, status="RUNNING")
                self.client.log_batch(run.info.run_id, tags=[self._RunTag(k, v) for k, v in tags.items()])
                return run.info.run_id, True
        run = self.client.create_run(self.experiment_id, run_name=run_name, tags=tags)
        return run.info.run_id, False

    def _log_params(self, params: Mapping[str, Any]) -> None:
        new: dict[str, str] = {}
        changed: list[str] = []
        for key, value in flatten(params).items():
            k, v = mlflow_key(key), _truncate(param_text(value), MLFLOW_MAX_PARAM_VAL_LENGTH)
            if k in self.logged_params:
                if self.logged_params[k] != v:
                    changed.append(k)
                continue
            new[k] = v
        if changed:  # MLflow never changes a logged param: the new values stay in config.yaml
            log.warning("mlflow: %d params differ from the run's logged values and keep the old ones: %s",
                        len(changed), ", ".join(changed[:10]) + (" ..." if len(changed) > 10 else ""))
        items = list(new.items())
        for i in range(0, len(items), MLFLOW_MAX_PARAMS_TAGS_PER_BATCH):
            chunk = items[i:i + MLFLOW_MAX_PARAMS_TAGS_PER_BATCH]
            self.client.log_batch(self.run_id, params=[self._Param(k, v) for k, v in chunk])
            self.logged_params.update(chunk)

    def scalars_many(self, items: Sequence[tuple[int, Mapping[str, float], float]]) -> None:
        """Several ``(step, values, wall time)`` in as few requests as MLflow allows."""
        metrics = [self._Metric(mlflow_key(k), v, int(t * 1000), int(step))
                   for step, values, t in items for k, v in values.items()]
        if items:
            self.last_step = max(self.last_step, max(int(step) for step, _, _ in items))
        for i in range(0, len(metrics), MLFLOW_MAX_METRICS_PER_BATCH):
            self.client.log_batch(self.run_id, metrics=metrics[i:i + MLFLOW_MAX_METRICS_PER_BATCH])

    def scalars(self, step: int, values: Mapping[str, float]) -> None:
        self.scalars_many([(step, finite(values), time.time())])

    def text(self, tag: str, text: str) -> None:
        self.client.log_text(self.run_id, text, f"text/{mlflow_key(tag)}.md")

    def hparams(self, params: Mapping[str, Any], metrics: Mapping[str, float]) -> None:
        self._log_params(params)
        now = int(time.time() * 1000)
        values = finite(metrics)
        if values:
            self.client.log_batch(self.run_id, metrics=[self._Metric(mlflow_key(f"hparam/{k}"), v, now,
                                                                     self.last_step) for k, v in values.items()])

    def artifacts(self, run_dir: Path) -> None:
        run_dir = Path(run_dir)
        for path in artifact_files(run_dir, self.artifact_max_bytes, "mlflow"):
            parent = path.parent.relative_to(run_dir).as_posix()
            self.client.log_artifact(self.run_id, str(path), artifact_path=None if parent == "." else parent)

    def close(self, failed: bool = False) -> None:
        self.client.set_terminated(self.run_id, status="FAILED" if failed else "FINISHED")

    @staticmethod
    def transient(exc: BaseException) -> bool:
        """A failure worth retrying: anything but a request MLflow rejects for good."""
        return getattr(exc, "error_code", None) not in MLFLOW_PERMANENT_ERRORS
