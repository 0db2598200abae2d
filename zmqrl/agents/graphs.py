"""Learner updates as one captured CUDA graph each (``agent.compile``), and the same code uncaptured.

An agent's update is written once (:meth:`CompiledUpdates.update_step`): a function of its input
tensors that runs forward, loss, backward, gradient clipping and Adam's step, and returns one 1-D
tensor, the metrics followed by the new priorities. It runs in one of three modes:

- ``eager``: fresh input tensors every call, gradients set to None between steps (the default off CUDA);
- ``static``: what a CUDA graph needs, run uncaptured: inputs copied into buffers allocated once,
  gradients zeroed in place, Adam capturable (:meth:`~zmqrl.agents.torch_util.Adam.make_capturable`:
  its state allocated up front, the learning rate a device tensor, a non-finite step skipped on the
  device), the results copied into an output buffer that the next update writes again. On the CPU it
  stands in for the graph: the tests hold it equal to ``eager``, the bench times it;
- ``graph``: that code captured as a CUDA graph after :data:`WARMUP` updates run uncaptured on a side
  stream (real updates: Adam's state and the gradients exist before the capture), then replayed: one
  launch per update instead of hundreds of kernel launches from Python.

A target update due every N steps is a second, small program (a graph of its own) replayed when due:
the host counts the steps anyway, so the choice costs the device nothing, and the target's parameters
are touched only when they change (a masked ``lerp_`` on every step would read and write them all
every step, for a hard copy due every 10,000). Due every step (SAC), it is captured inside the update.
Random numbers come from the agents' own generators, registered with the graph (torch's graph-safe
philox state), so a replay draws what the eager update would.

The known traps, each with its guard:

- a graph's outputs are overwritten by its next replay: the output goes to the host through
  :meth:`~zmqrl.agents.torch_util.PendingStep.on_host` with ``reused=True`` (a copy, on every device)
  before the next update is queued;
- tensors re-allocated behind a graph's back (an optimizer's ``load_state_dict``, a module's ``.to()``,
  ``load_state_dict(assign=True)``, a gradient set to None): what the update reads or writes and keeps is
  noted when it is captured (:class:`Bindings`: data pointers, and which tensor each module, gradient and
  optimizer holds) and checked before each replay, in tens of microseconds of Python; a change captures it again,
  with a warning, never replaying onto stale tensors (:attr:`StaticProgram.captures` counts);
- silent fallbacks: a capture that fails raises :class:`CaptureError`, naming ``agent.compile``; nothing
  goes eager by itself. ``auto`` resolving to eager off CUDA is the setting's meaning, said in the
  agent's log line (:meth:`CompiledUpdates.describe_update`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from zmqrl.agents.staging import BatchStager
from zmqrl.agents.torch_util import Adam, PendingStep
from zmqrl.config import ConfigError

log = logging.getLogger("zmqrl")

MODES = ("eager", "static", "graph")
WARMUP = 2  # uncaptured updates before a capture: the first allocates gradients, the second runs as captured


class CaptureError(RuntimeError):
    """Capturing an update as a CUDA graph failed; the message says why and names ``agent.compile``."""


def resolve_compile(setting: str, device: torch.device) -> tuple[str, str]:
    """The mode ``agent.compile`` asks for on ``device``, and why: ``auto`` is graph on CUDA, eager
    elsewhere; ``graph`` off CUDA is a ConfigError naming the key."""
    if setting == "none":
        return "eager", "agent.compile=none"
    if setting == "auto":
        if device.type == "cuda":
            return "graph", "agent.compile=auto on CUDA"
        return "eager", f"agent.compile=auto: CUDA graphs need a CUDA device, the learner's is {device}"
    if setting == "graph":
        if device.type != "cuda":
            raise ConfigError(f"agent.compile: graph needs a CUDA device, the learner's is {device} "
                              "(run.device); use auto or none")
        return "graph", "agent.compile=graph"
    raise ConfigError(f"agent.compile: must be one of auto, none, graph, got {setting!r}")


def _torch_dtype(dtype: np.dtype) -> torch.dtype:
    return torch.from_numpy(np.empty(0, dtype=np.dtype(dtype))).dtype


class Bindings:
    """What an update reads or writes and keeps between updates, as it is now: the parameters and buffers
    of ``modules`` (and which tensor each module holds), their gradients, the optimizers' state and
    learning rates, and ``extra`` tensors. :meth:`moved` says what changed since."""

    def __init__(self, modules: Iterable[nn.Module], optimizers: Iterable[Adam] = (),
                 extra: Iterable[torch.Tensor] = ()) -> None:
        self._slots = [(held, name, t) for module in modules for owner in module.modules()
                       for held in (owner._parameters, owner._buffers) for name, t in held.items() if t is not None]
        optimizers = list(optimizers)
        self._optimizers = [(o, o.state, o.param_groups) for o in optimizers]
        tensors: dict[int, torch.Tensor] = {id(t): t for _, _, t in self._slots}
        for o in optimizers:
            for group in o.param_groups:
                if isinstance(group["lr"], torch.Tensor):
                    tensors[id(group["lr"])] = group["lr"]
                for p in group["params"]:
                    tensors[id(p)] = p
                    tensors.update((id(v), v) for v in o.state[p].values() if isinstance(v, torch.Tensor))
        tensors.update((id(t), t) for t in extra)
        self._tensors = list(tensors.values())
        self._pointers = tuple(map(torch.Tensor.data_ptr, self._tensors))
        self._grads = [(t, t.grad) for t in self._tensors if t.requires_grad]

    def moved(self) -> str:
        """What was re-allocated or replaced since (empty: nothing)."""
        if not all(held.get(name) is t for held, name, t in self._slots):
            return "a module holds a new parameter or buffer (a load_state_dict with assign=True)"
        if not all(o.state is state and o.param_groups is groups for o, state, groups in self._optimizers):
            return "an optimizer's state was replaced (its load_state_dict)"
        if tuple(map(torch.Tensor.data_ptr, self._tensors)) != self._pointers:
            return "a tensor's memory moved (a .to(), or .data replaced)"
        if not all(t.grad is grad for t, grad in self._grads):
            return "a gradient was replaced or set to None"
        return ""


class StaticProgram:
    """A function of input tensors held in place, run uncaptured (``static``) or captured once and
    replayed (``graph``); what it returns lives in one buffer that its next call overwrites.

    ``bindings`` notes everything the function reads or writes and keeps between calls (:class:`Bindings`);
    before each call it is checked, and anything re-allocated since the capture captures it again.
    """

    def __init__(self, fn: Callable[[dict[str, torch.Tensor]], torch.Tensor | None], mode: str,
                 device: torch.device, bindings: Callable[[], Bindings], what: str,
                 generators: Sequence[torch.Generator] = ()) -> None:
        if mode not in ("static", "graph"):
            raise ValueError(f"a static program runs static or graph, not {mode!r}")
        self.fn, self.mode, self.device, self.bindings, self.what = fn, mode, device, bindings, what
        self.generators = tuple(generators)
        self.inputs: dict[str, torch.Tensor] = {}  # the buffers the function reads its inputs from
        self.captures = 0  # times captured (graph) or first run (static); more than one: it had to be again
        self._signature: tuple[tuple[str, tuple[int, ...], str], ...] | None = None
        self._bound: Bindings | None = None  # what the capture found
        self._graph: Any = None  # torch.cuda.CUDAGraph
        self._warm = 0
        self._side: Any = None  # the warm-up stream
        self._out: torch.Tensor | None = None

    def __call__(self, batch: Mapping[str, np.ndarray | torch.Tensor] | None = None,
                 stager: BatchStager | None = None) -> torch.Tensor | None:
        """Copy ``batch`` into the input buffers (through ``stager``) and run the function once; returns
        its output buffer (None for a function without output), valid until the next call."""
        if batch is not None:
            assert stager is not None, "a batch needs a stager"
            dtypes = {k: a.dtype if isinstance(a, torch.Tensor) else _torch_dtype(a.dtype) for k, a in batch.items()}
            signature = tuple((k, tuple(a.shape), str(dtypes[k])) for k, a in batch.items())
            if signature != self._signature:
                if self._signature is not None:
                    self.forget(f"its batch changed ({self._signature} -> {signature})")
                self._signature = signature
                self.inputs = {k: torch.empty(shape, dtype=dtypes[k], device=self.device) for k, shape, _ in signature}
            stager.into(batch, self.inputs)
        if self._bound is not None:
            moved = self._bound.moved()
            if moved:
                self.forget(moved)
        if self.mode == "static":
            return self._run_uncaptured()
        if self._graph is None:
            if self._warm < WARMUP:
                self._warm += 1
                return self._warm_up()
            self._capture()
        self._graph.replay()
        return self._out

    def forget(self, why: str) -> None:
        """Drop the capture (and the output buffer): the next call captures again, after its warm-up."""
        if self.captures:
            log.warning("%s: %s; %s again", self.what, why,
                        "capturing it" if self.mode == "graph" else "binding its buffers")
        if self._graph is not None:
            torch.cuda.current_stream(self.device).synchronize()  # its last replay done before its memory goes
        self._graph = self._bound = self._out = None
        self._warm = 0

    def _keep(self, out: torch.Tensor | None) -> torch.Tensor | None:
        """``out`` copied into the output buffer."""
        if out is None:
            return None
        if self._out is None or self._out.shape != out.shape:
            self._out = torch.empty_like(out)
        return self._out.copy_(out)

    def _run_uncaptured(self) -> torch.Tensor | None:
        out = self._keep(self.fn(self.inputs))
        if self._bound is None:
            self._bound = self.bindings()
            self.captures += 1
        return out

    def _warm_up(self) -> torch.Tensor | None:
        """One update uncaptured on a side stream, as the capture will run it (torch's recipe)."""
        current = torch.cuda.current_stream(self.device)
        if self._side is None:
            self._side = torch.cuda.Stream(self.device)
        self._side.wait_stream(current)
        with torch.cuda.stream(self._side):
            out = self._keep(self.fn(self.inputs))
        current.wait_stream(self._side)
        return out

    def _capture(self) -> None:
        graph = torch.cuda.CUDAGraph()
        started = time.perf_counter()
        try:
            for generator in self.generators:
                graph.register_generator_state(generator)
            with torch.cuda.graph(graph, capture_error_mode="thread_local"):
                out = self.fn(self.inputs)
        except Exception as exc:
            raise CaptureError(f"agent.compile: capturing {self.what} as a CUDA graph failed: {type(exc).__name__}: "
                               f"{exc} (agent.compile=none trains without graphs)") from exc
        self._graph, self._out = graph, out
        self._bound = self.bindings()
        self.captures += 1
        log.info("%s captured as a CUDA graph in %.2fs after %d uncaptured updates%s", self.what,
                 time.perf_counter() - started, WARMUP, "" if self.captures == 1 else f" (capture {self.captures})")


class CompiledUpdates:
    """Mixed into an agent: its update run eagerly, or as a static program (uncaptured, or a CUDA graph).

    The agent provides :meth:`update_step` (staged input tensors -> metrics, then priorities; its
    optimizers stepped, gradients zeroed with :meth:`zero_grads`), :meth:`update_target`,
    :meth:`graph_bindings` (every tensor those two read or write that outlives an update),
    :meth:`optimizers`, and :meth:`graph_generators` where its update draws random numbers; and
    ``cfg`` (with ``algo``, ``compile`` and ``target_update_interval``), ``device``, ``stager``,
    ``opt_steps``, ``METRICS`` and ``BATCH_KEYS``. :meth:`init_updates` ends its constructor.
    """

    METRICS: tuple[str, ...]
    BATCH_KEYS: tuple[str, ...]
    cfg: Any
    device: torch.device
    stager: BatchStager
    opt_steps: int
    update_mode = "eager"  # eager, static or graph (see the module's docstring)
    update_program: StaticProgram | None = None  # the update as a static program (None: eager)
    target_program: StaticProgram | None = None  # the target update as one, where it is not inside the update
    _mode_reason = ""

    # --- what the agent provides ------------------------------------------------------------------
    def update_step(self, t: dict[str, torch.Tensor]) -> torch.Tensor:
        raise NotImplementedError

    def update_target(self) -> None:
        raise NotImplementedError

    def optimizers(self) -> list[Adam]:
        raise NotImplementedError

    def graph_bindings(self) -> Bindings:
        raise NotImplementedError

    def graph_generators(self) -> list[torch.Generator]:
        """The generators the update draws from (registered with its graph)."""
        return []

    # --- the update -------------------------------------------------------------------------------
    def init_updates(self) -> None:
        """The mode ``agent.compile`` asks for on this device, logged."""
        mode, why = resolve_compile(self.cfg.compile, self.device)
        self.set_update_mode(mode, why)
        log.info("%s", self.describe_update())

    def set_update_mode(self, mode: str, why: str = "") -> None:
        """Run updates ``eager``, ``static`` or as a ``graph`` from now on (graph needs CUDA: ConfigError).
        Leaving eager makes the optimizers capturable for good (the same arithmetic)."""
        if mode not in MODES:
            raise ValueError(f"update mode must be one of {', '.join(MODES)}, got {mode!r}")
        if mode == "graph" and self.device.type != "cuda":
            raise ConfigError(f"agent.compile: graph needs a CUDA device, the learner's is {self.device}")
        self.update_mode, self._mode_reason = mode, why or f"set to {mode}"
        self.update_program = self.target_program = None
        if mode == "eager":
            return
        for optimizer in self.optimizers():
            optimizer.make_capturable()
        algo = self.cfg.algo
        inside = self.cfg.target_update_interval == 1

        def step(t: dict[str, torch.Tensor]) -> torch.Tensor:
            values = self.update_step(t)
            if inside:
                self.update_target()
            return values

        self.update_program = StaticProgram(step, mode, self.device, self.graph_bindings, f"the {algo} update",
                                            self.graph_generators())
        if not inside:
            self.target_program = StaticProgram(lambda _t: self.update_target(), mode, self.device,
                                                self.graph_bindings, f"the {algo} target update")

    def describe_update(self) -> str:
        """How updates run, and why: for the learner's log."""
        how = {"eager": "eager (PyTorch ops launched from Python)",
               "static": "static buffers, uncaptured (a CUDA graph's code without the graph)",
               "graph": "one CUDA graph per update"}[self.update_mode]
        target = ("" if self.update_mode == "eager" else
                  ", the target update inside it" if self.target_program is None else
                  f", the target update a program of its own every {self.cfg.target_update_interval} steps")
        return f"{self.cfg.algo} update: {how}{target} ({self._mode_reason})"

    def zero_grads(self, optimizer: torch.optim.Optimizer) -> None:
        """Gradients to zero: set to None eagerly, zeroed in place otherwise (a graph keeps their memory)."""
        optimizer.zero_grad(set_to_none=self.update_mode == "eager")

    def update(self, batch: Mapping[str, np.ndarray]) -> tuple[dict[str, float], np.ndarray]:
        """One optimisation step; returns metrics and new priorities (:meth:`update_deferred`, read at once)."""
        return self.update_deferred(batch).read()

    def update_deferred(self, batch: Mapping[str, np.ndarray]) -> PendingStep:
        """One optimisation step on a sampled batch, queued; its metrics and new priorities are read from
        the :class:`PendingStep` (on CUDA without waiting for the device until then).

        The batch reaches the device through :class:`BatchStager` (pinned and non-blocking on CUDA):
        as fresh tensors eagerly, copied into the program's buffers otherwise. Metrics and priorities
        come back in one device-to-host copy of the program's output, made before the next update can
        overwrite it.
        """
        program = self.update_program
        if program is None:
            return self.eager_update(batch, self.update_step)
        values = program({k: batch[k] for k in self.BATCH_KEYS if k in batch}, self.stager)
        assert values is not None
        self.opt_steps += 1
        if self.target_program is not None and self.opt_steps % self.cfg.target_update_interval == 0:
            self.target_program()
        return PendingStep.on_host(self.METRICS, values, reused=True)

    def eager_update(self, batch: Mapping[str, np.ndarray],
                     step: Callable[[dict[str, torch.Tensor]], torch.Tensor]) -> PendingStep:
        """One update by ``step`` (an :meth:`update_step`) on freshly staged tensors, counted, the target
        updated when due."""
        values = step(self.stager({k: batch[k] for k in self.BATCH_KEYS if k in batch}))
        self.opt_steps += 1
        if self.opt_steps % self.cfg.target_update_interval == 0:
            self.update_target()
        return PendingStep.on_host(self.METRICS, values)
