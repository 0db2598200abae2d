"""Weights & Biases, offline by default (``RUN_DIR/wandb/offline-run-*``; ``wandb sync`` uploads it):
scalars in the run's history at their step, the final figures in its summary, text and the run
directory's small files in its files; a run resumed in the same directory continues its W&B run."""

from __future__ import annotations

import logging
import re
import shutil
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from zmqrl.run.trackers.common import artifact_files, finite, flatten, read_state, write_state

log = logging.getLogger("zmqrl")

STEP_KEY = "opt_step"  # the value each row's step is recorded under (the charts' x axis)


def _truncate(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


class WandbRecorder:
    """One W&B run, offline by default: ``<run_dir>/wandb/offline-run-*/`` (``wandb sync`` uploads it later).

    Scalars go to the run's history at their step, the final figures to its summary, text and
    the run directory's small files to its files folder. Use it behind :class:`Background`
    (opening it imports wandb and starts its service process: about 1.5 s).
    """

    name = "wandb"

    def __init__(self, run_dir: Path, params: Mapping[str, Any], tags: Mapping[str, str], *, project: str,
                 entity: str = "", group: str = "", run_name: str, mode: str = "offline",
                 artifact_max_mb: float = 100.0) -> None:
        import wandb

        self._wandb = wandb
        self.run_dir = Path(run_dir)
        self.artifact_max_bytes = artifact_max_mb * 2**20
        previous = read_state(self.run_dir).get("wandb", {})
        resume_id = previous.get("run_id") if previous.get("project") == project else None
        if mode != "online":
            # the process-wide settings too: W&B's own usage analytics follow those, not the run's, and
            # would otherwise try to reach its server (an exit held ~10 s where names do not resolve)
            wandb.setup(settings=wandb.Settings(mode=mode))  # type: ignore[arg-type]  # checked in validate
        settings = wandb.Settings(console="off", silent=True, disable_git=True, save_code=False,
                                  x_disable_stats=True, x_save_requirements=False, reinit="create_new")
        self.run = wandb.init(project=project, entity=entity or None, group=group or None, name=run_name,
                              dir=str(self.run_dir), mode=mode, config=dict(flatten(params)),  # type: ignore[arg-type]
                              tags=[_truncate(f"{k.removeprefix('zmqrl.')}:{tags[k]}", 64)
                                    for k in ("zmqrl.version", "zmqrl.env_id", "zmqrl.algo") if tags.get(k)],
                              id=resume_id, resume="allow" if resume_id else None, settings=settings)
        # the x axis is our step, logged as a value: W&B's own ``step`` must only increase and would
        # drop (with a warning per call) the steps a resumed run records again after its last checkpoint
        self.run.define_metric(STEP_KEY)
        self.run.define_metric("*", step_metric=STEP_KEY)
        write_state(self.run_dir, "wandb", {"project": project, "run_id": self.run.id, "mode": mode})
        self.files = Path(self.run.dir)

    def scalars_many(self, items: Sequence[tuple[int, Mapping[str, float], float]]) -> None:
        for step, values, _ in items:
            if values:
                self.run.log({**values, STEP_KEY: int(step)})

    def scalars(self, step: int, values: Mapping[str, float]) -> None:
        self.scalars_many([(step, finite(values), time.time())])

    def _save(self, path: Path) -> None:
        self.run.save(str(path), base_path=str(self.files), policy="now")

    def text(self, tag: str, text: str) -> None:
        path = self.files / "text" / (re.sub(r"[^\w.-]", "_", tag) + ".md")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        self._save(path)

    def hparams(self, params: Mapping[str, Any], metrics: Mapping[str, float]) -> None:
        new = {k: v for k, v in flatten(params).items() if k not in self.run.config}
        if new:
            self.run.config.update(new)
        self.run.summary.update({f"hparam/{k}": v for k, v in finite(metrics).items()})

    def artifacts(self, run_dir: Path) -> None:
        """Copies (not links) of the run directory's small files under ``files/run/``."""
        run_dir = Path(run_dir)
        for path in artifact_files(run_dir, self.artifact_max_bytes, "wandb"):
            dest = self.files / "run" / path.relative_to(run_dir)
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, dest)
            self._save(dest)

    def close(self, failed: bool = False) -> None:
        self.run.finish(exit_code=1 if failed else 0)
        # ``finish`` returns before W&B's service has written the run's last records; stopping the
        # service waits for them (its atexit hook would too, but not in every process, e.g. under
        # multiprocessing). Only when no other run of this process still uses it.
        try:
            from wandb.sdk import wandb_setup

            idle = wandb_setup.singleton().most_recent_active_run is None
        except Exception:  # another wandb version: leave the service to its atexit hook
            idle = False
        if idle:
            self._wandb.teardown()

    @staticmethod
    def transient(exc: BaseException) -> bool:
        return not isinstance(exc, (TypeError, ValueError, LookupError))
