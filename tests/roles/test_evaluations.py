"""Evaluations in a distributed run are recorded at the model they evaluated, however late they arrive.

The learner trains in this process on real sockets; the real :class:`~zmqrl.roles.evaluator.Evaluator`
gets a model made early in the run, but only once the learner has gone on thousands of optimisation
steps (a slow evaluator: long episodes, a busy machine). Its report must land at that model's
optimisation step, env step and wall time, in ``summary.json``, in TensorBoard and in "solved at";
it used to be recorded at whatever step the learner had reached when the report arrived.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
import zmq

from batches import batch_frames, cartpole_batch
from procs import wait_for
from rigs import in_process_learner
from zmqrl.roles.evaluator import Evaluator
from zmqrl.run.lifecycle import StopFlag
from zmqrl.run.rundir import read_json
from zmqrl.wire import MODEL, MODEL_TOPIC, Limits, decode

pytestmark = pytest.mark.timeout(300)

LATE_BY = 3000  # optimisation steps the learner goes on before the report arrives


def eval_scalars(tb: Path) -> dict[str, dict[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tb), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: {int(e.step): float(e.value) for e in acc.Scalars(tag)}
            for tag in acc.Tags()["scalars"] if tag.startswith("eval/")}


@pytest.mark.slow
def test_a_late_evaluation_is_recorded_at_the_step_of_the_model_it_evaluated(
        tmp_path: Path, cartpole_cfg: Any, zctx: zmq.Context) -> None:
    cfg = cartpole_cfg("run.log_level=warning", "trainer.warmup=256", "trainer.sync_interval=50",
                       "trainer.min_samples_per_insert=0", "trainer.eval_episodes=2", "trainer.stop_return=1",
                       "trainer.max_opts=1000000")
    run_dir = tmp_path / "run"
    learner = in_process_learner(cfg, run_dir)
    models = zctx.socket(zmq.SUB)
    models.setsockopt(zmq.LINGER, 0)
    models.setsockopt(zmq.SUBSCRIBE, MODEL_TOPIC)
    models.connect(learner.endpoints["model"])
    data = zctx.socket(zmq.PUSH)
    data.setsockopt(zmq.LINGER, 0)
    data.connect(learner.endpoints["data"])
    stop = StopFlag()
    runner = threading.Thread(target=learner.run, args=(stop,), daemon=True)
    runner.start()
    evaluator = None
    pub = zctx.socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    try:
        for seq in range(4):
            data.send_multipart(batch_frames("actor-0", seq, cartpole_batch(64, seed=seq)))
        early: list[Any] = []

        def a_model_past_step_100() -> bool:
            while models.poll(50):
                raw = models.recv_multipart()
                msg = decode(raw, Limits.only([MODEL]))
                if msg.meta.get("opt_steps", 0) >= 100 and msg.version >= 1:
                    early.append(raw)
                    return True
            return False

        wait_for(a_model_past_step_100, 60, "a model published after 100 optimisation steps")
        made = decode(early[0], Limits.only([MODEL]))
        made_at = (made.meta["opt_steps"], made.meta.get("env_steps"), made.meta.get("wall_s"))
        wait_for(lambda: learner.book.opt_steps >= made_at[0] + LATE_BY, 120,
                 f"the learner {LATE_BY} optimisation steps further")

        pub_port = pub.bind_to_random_port("tcp://127.0.0.1")
        evaluator = Evaluator(cfg, f"tcp://127.0.0.1:{pub_port}", learner.endpoints["eval"], str(run_dir))
        deadline = time.monotonic() + 30
        while not evaluator.step():  # the early model, handed to the evaluator only now
            assert time.monotonic() < deadline, "the evaluator never evaluated the early model"
            pub.send_multipart(early[0])  # again until the evaluator's subscription is up
            evaluator.stream.wait(20)
        wait_for(lambda: learner.book.evals_total == 1, 30, "the learner to take the report")
        arrived = learner.book.opt_steps
    finally:
        stop.set = True
        runner.join(60)
        if evaluator is not None:
            evaluator.close()
        pub.close()
        models.close()
        data.close()
    assert not runner.is_alive()
    assert arrived >= made_at[0] + LATE_BY

    entry = read_json(run_dir / "summary.json")["evals"][-1]
    assert entry["opt_steps"] == made_at[0], f"recorded at opt {entry['opt_steps']}, the model's is {made_at[0]}"
    assert (entry["env_steps"], entry["wall_s"]) == (made_at[1], round(made_at[2], 2)), entry
    assert entry["version"] == made.version and entry["arrived_opt_steps"] >= made_at[0] + LATE_BY, entry
    solved = read_json(run_dir / "summary.json")["solved"]  # stop_return=1: any return solves it
    assert solved is not None and solved["opt_steps"] == made_at[0] and solved["env_steps"] == made_at[1], solved
    scalars = eval_scalars(run_dir / "tb")
    assert list(scalars["eval/return_mean"]) == [made_at[0]], scalars["eval/return_mean"]
    assert scalars["eval/env_steps"][made_at[0]] == made_at[1]
