"""Replay group: bytes per stored transition, for the config's env and for stacked Atari-sized frames."""

from __future__ import annotations

from typing import Any

import numpy as np

from zmqrl.bench.data import transition_pool
from zmqrl.bench.harness import Context, Row, calls_per_second, load_config, make_row, median
from zmqrl.replay.uniform import UniformReplay

CONFIG = "cartpole_dqn.yaml"
ATARI_CONFIG = "pong_dqn.yaml"
ATARI_CAPACITY = 1_000_000  # the replay size of Ape-X, Dopamine and border's IQN: what a user plans RAM for
ATARI_STREAM = 4096  # real Pong transitions streamed into each replay (about one distinct frame each)
GIB_PER_MILLION = 2**30 / ATARI_CAPACITY  # bytes per transition of a 1M replay in 1 GiB: replay.compress's goal
SAMPLE_BATCH = 256  # the GPU sprint's batch
NOISE_FRAMES_ID = "zmqrl/NoiseFrames-v0"


def _register_noise_frames() -> None:
    """Register an env of 84x84 uint8 noise frames (Atari's observation shape without ALE)."""
    import gymnasium as gym

    class NoiseFrames(gym.Env):
        """A new random 84x84 frame every step; episodes of ``episode_len`` steps."""

        observation_space = gym.spaces.Box(0, 255, (84, 84), np.uint8)
        action_space = gym.spaces.Discrete(6)

        def __init__(self, **kwargs: Any) -> None:
            self.episode_len, self.t = int(kwargs.get("episode_len", 400)), 0

        def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict]:
            super().reset(seed=seed)
            self.t = 0
            return self.np_random.integers(0, 256, (84, 84), dtype=np.uint8), {}

        def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
            self.t += 1
            frame = self.np_random.integers(0, 256, (84, 84), dtype=np.uint8)
            return frame, 0.0, self.t >= self.episode_len, False, {}

    if NOISE_FRAMES_ID not in gym.registry:
        gym.register(NOISE_FRAMES_ID, entry_point=NoiseFrames)


def run(c: Context) -> list[Row]:
    """Bytes per stored transition for the config's env and for stacked Atari-sized frames (configured replay)."""
    from zmqrl.run.startup import make_replay_from

    path = c.configs(CONFIG)[0]
    cfg = load_config(path, "replay.device=cpu")  # (host replay's bytes, wherever the learner would train)
    replay = make_replay_from(cfg)
    assert isinstance(replay, UniformReplay)  # (both kinds are: their sizes are what this row reads)
    batch = transition_pool(cfg, 256)
    replay.add(batch)
    raw = sum(a[0].nbytes for a in batch.values())
    per_slot = replay.nbytes / replay.capacity
    tree = getattr(replay, "tree", None)
    tree_bytes = tree.nbytes / replay.capacity if tree is not None else 0.0
    kind = "prioritized" if tree is not None else "uniform"
    rows = [make_row(f"replay_bytes_{cfg.run.name}", per_slot, raw, "bytes/transition",
                     f"{path.name}: {kind} replay of {cfg.replay.capacity}: {per_slot - tree_bytes:.1f} B of items + "
                     f"{tree_bytes:.1f} B of priorities per slot vs {raw} B raw payload of one {cfg.env.id} "
                     "transition", ("<=", 1.1))]

    _register_noise_frames()
    capacity, stack = 2000, 4
    frames_cfg = load_config(path, f"env.id={NOISE_FRAMES_ID}", "env.wrappers=[frame_stack]",
                             f"env.frame_stack={stack}", "env.num_envs=8", f"replay.capacity={capacity}")
    image_replay = make_replay_from(frames_cfg)
    assert isinstance(image_replay, UniformReplay)
    stream = transition_pool(frames_cfg, capacity + capacity // 2)  # the ring wraps: frames are freed too
    for i in range(0, len(stream["reward"]), 64):
        image_replay.add({k: v[i:i + 64] for k, v in stream.items()})
    per_slot = image_replay.nbytes / len(image_replay)
    stacks = stream["obs"][0].nbytes + stream["next_obs"][0].nbytes
    pooled = "each distinct frame stored once" if image_replay.frame_keys else "obs and next_obs stored as given"
    rows.append(make_row("replay_bytes_frames", per_slot, stacks, "bytes/transition",
                         f"{stack}x84x84 uint8 stacks of 8 envs (FrameStackObservation over noise frames, "
                         f"{frames_cfg.agent.n_step}-step), {kind} replay of {capacity} after "
                         f"{len(stream['reward'])} adds: {pooled}; baseline = obs + next_obs stacks",
                         ("<=", 0.35)))
    rows.extend(_atari_rows(c))
    return rows


def _atari_rows(c: Context) -> list[Row]:
    """Bytes per transition of a full replay of real Pong frames at Atari's usual capacity of 1M,
    with frames stored raw and compressed (``replay.compress`` lz4 and zstd), and what compression
    costs: sample(256) time and insert rate against the raw pool.

    The ring arrays are allocated for every slot at once; the frame pool grows with the distinct
    frames held, measured here per transition over a stream of real games (random actions through
    the shipped config's ``atari`` chain and n-step builder) and extrapolated to 1M transitions.
    """
    import time

    from zmqrl.run.startup import make_replay_from

    path = c.configs(ATARI_CONFIG)[0]
    cfg = load_config(path, f"replay.capacity={ATARI_CAPACITY}", "env.num_envs=8", "replay.device=cpu")
    stream = transition_pool(cfg, ATARI_STREAM)
    stacks = stream["obs"][0].nbytes + stream["next_obs"][0].nbytes
    seconds = max(0.5, c.settings.actor_s)
    sizes: dict[str, tuple[float, float]] = {}  # codec -> (bytes per slot of the ring, bytes per transition)
    sample_ms: dict[str, list[float]] = {}
    insert: dict[str, float] = {}
    replays = {}
    for codec in ("none", "lz4", "zstd"):
        cfg.replay.compress = codec
        replay = make_replay_from(cfg)
        assert isinstance(replay, UniformReplay)  # (both kinds are: their sizes are what this row reads)
        start = time.perf_counter()
        for i in range(0, ATARI_STREAM, 64):
            replay.add({k: v[i:i + 64] for k, v in stream.items()})
        insert[codec] = ATARI_STREAM / (time.perf_counter() - start)
        fixed = (replay.nbytes - replay.frames_nbytes) / replay.capacity  # ring + priorities, per slot
        sizes[codec] = (fixed, fixed + replay.frames_nbytes / len(replay))
        replays[codec] = replay
        sample_ms[codec] = []
    for _ in range(max(2, c.settings.reps)):  # alternated: the machine's drift falls on every codec alike
        for codec, replay in replays.items():
            sample_ms[codec].append(1e3 / calls_per_second(lambda r=replay: r.sample(SAMPLE_BATCH), seconds))
    fixed, raw_item = sizes["none"]
    kind = "prioritized" if cfg.replay.prioritized else "uniform"
    rows = [make_row("replay_bytes_atari", raw_item, stacks, "bytes/transition",
                     f"{path.name} ({cfg.env.id}, {cfg.env.frame_stack}x84x84 uint8, {cfg.agent.n_step}-step) at "
                     f"capacity {ATARI_CAPACITY:,}: {fixed:.0f} B per slot + {raw_item - fixed:.0f} B of frames per "
                     f"transition; a full replay is about {raw_item * ATARI_CAPACITY / 2**30:.1f} GiB; "
                     "baseline = obs + next_obs stacks", ("<=", 0.35))]
    base_ms = median(sample_ms["none"])
    for codec in ("lz4", "zstd"):
        fixed, item = sizes[codec]
        pool = replays[codec]._pool
        frame_bytes = pool.compressed_nbytes / max(1, len(pool)) if pool is not None else 0.0
        rows.append(make_row(f"replay_bytes_atari_{codec}", item, GIB_PER_MILLION, "bytes/transition",
                             f"as replay_bytes_atari with replay.compress={codec}: {fixed:.0f} B per slot + "
                             f"{item - fixed:.0f} B of frames per transition ({frame_bytes:.0f} B a compressed frame, "
                             f"{7056 / max(frame_bytes, 1):.0f}x); a full replay is about "
                             f"{item * ATARI_CAPACITY / 2**30:.2f} GiB (raw: {raw_item * ATARI_CAPACITY / 2**30:.1f}); "
                             "baseline = 1 GiB for 1M transitions", ("<=", 1.0)))
        ms = median(sample_ms[codec])
        windows, raw_windows = (", ".join(f"{v:.2f}" for v in sample_ms[k]) for k in (codec, "none"))
        rows.append(make_row(f"replay_sample_atari_{codec}", ms, base_ms, "ms/sample",
                             f"{kind} replay.sample({SAMPLE_BATCH}) of {ATARI_STREAM} real Pong transitions with "
                             f"replay.compress={codec}: +{ms - base_ms:.2f} ms a batch over raw frames (medians of "
                             f"{len(sample_ms[codec])} alternated windows: {windows} vs {raw_windows}); insert "
                             f"{insert[codec]:,.0f} transitions/s vs {insert['none']:,.0f} raw, in adds of 64"))
    return rows
