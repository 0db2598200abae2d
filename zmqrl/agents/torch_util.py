"""Torch pieces shared by the algorithms' agents."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from zmqrl.agents.numpy_mlp import check_params
from zmqrl.config import ConfigError


def resolve_device(name: str, key: str = "run.device") -> torch.device:
    """``auto`` picks cuda when present; an unavailable cuda is a clear error naming ``key``."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ConfigError(f"{key}: unknown device {name!r}; use cpu, cuda, cuda:N or auto") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"{key}: {name!r} requested but no CUDA device is available")
    return device


def flush_denormals(on: bool = True) -> bool:
    """Flush denormal floats to zero in the calling thread and its torch intra-op threads (``on``),
    or stop; returns whether they were flushed before, to restore that when done.

    Adam's moments of weights that stop getting gradients (a ReLU unit that no longer fires) decay
    through the denormal range, where each operation on them is many times slower: flushed, CartPole's
    Adam step took 69 instead of 404 us, and `zmqrl train` made 558 instead of 502 updates/s. The
    setting is each thread's processor state, and ``torch.set_flush_denormal`` sets the calling
    thread's alone: with ``run.torch_threads`` 2, the other thread's half of every op stayed slow
    (an Adam step on denormal moments 900 us instead of 64), so the setting is copied to the whole
    team (:func:`_share_float_env`): a Pendulum learner 188 -> 211 updates/s.
    """
    probe = torch.tensor([1e-39])  # a float32 denormal; times one it stays one unless flushed
    before = bool((probe * 1.0).item() == 0.0)
    torch.set_flush_denormal(on)
    _share_float_env()
    return before


@functools.cache
def _omp_parallel() -> tuple[Any, Any, Any] | None:
    """(``GOMP_parallel``, ``fegetenv``, ``fesetenv``) of the OpenMP runtime torch loaded and the C
    library, or None where there is none to find (not Linux, or torch without an OpenMP runtime
    that speaks libgomp's ABI)."""
    try:
        with open("/proc/self/maps") as maps:
            paths = sorted({line.split()[-1] for line in maps if "gomp" in line or "iomp" in line})
        libm = ctypes.CDLL(ctypes.util.find_library("m") or "libm.so.6")
        for path in paths:
            runtime = ctypes.CDLL(path)
            if hasattr(runtime, "GOMP_parallel"):
                parallel = runtime.GOMP_parallel
                parallel.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint, ctypes.c_uint]
                parallel.restype = None
                return parallel, libm.fegetenv, libm.fesetenv
    except (OSError, AttributeError):
        pass
    return None


def _share_float_env() -> None:
    """Give every thread of the calling thread's OpenMP team (torch's intra-op threads) this
    thread's floating-point environment, denormal flushing included: one parallel region in which
    each thread calls ``fesetenv`` on a copy of it. Without such a runtime, only this thread has it."""
    threads = torch.get_num_threads()
    found = _omp_parallel() if threads > 1 else None
    if found is None:
        return
    parallel, fegetenv, fesetenv = found
    env = ctypes.create_string_buffer(128)  # fenv_t: 32 bytes on x86-64, less elsewhere
    if fegetenv(env) == 0:
        parallel(ctypes.cast(fesetenv, ctypes.c_void_p), ctypes.addressof(env), threads, 0)


class PendingStep:
    """An optimisation step whose work is queued on the device and whose results are not read yet.

    An update ends with one 1-D float tensor: its scalar metrics (named by ``names``, in order)
    followed by the new priorities. On CUDA, :meth:`on_host` copies it into a page-locked host
    tensor with ``non_blocking=True`` and records an event after the copy, so the host goes on
    (sampling the next batch) while the device finishes the step; :meth:`result` waits for that
    event alone. Each step has its own host tensor: torch's caching host allocator hands that
    memory to no other tensor until the copy recorded on it has completed, so no step's results can
    be overwritten by another's, read or not. On the CPU the tensor is the result itself, already
    computed: nothing is copied beyond what reading it always took, unless the tensor is a buffer the
    next step writes again (``reused``: a static or captured update's output, see :mod:`zmqrl.agents.graphs`).
    """

    __slots__ = ("_event", "_names", "_read", "_values")

    def __init__(self, names: Sequence[str], values: torch.Tensor | None,
                 event: torch.cuda.Event | None = None,
                 read: tuple[dict[str, float], np.ndarray | None] | None = None) -> None:
        self._names = tuple(names)
        self._values = values
        self._event = event
        self._read = read

    @classmethod
    def on_host(cls, names: Sequence[str], values: torch.Tensor, reused: bool = False) -> PendingStep:
        """The step whose metrics and priorities ``values`` (1-D, metrics first) will hold once the
        device has computed them; on CUDA the copy to the host is queued here, not waited for.
        ``reused``: ``values`` is overwritten by the next step (a graph's output), so on the CPU too
        it is copied now."""
        values = values.detach()
        if values.device.type != "cuda":
            return cls(names, values.clone() if reused else values.cpu())
        host = torch.empty(values.shape, dtype=values.dtype, pin_memory=True)
        host.copy_(values, non_blocking=True)
        event = torch.cuda.Event()
        event.record()  # after the copy, on the stream that queued it
        return cls(names, host, event)

    @classmethod
    def resolved(cls, metrics: dict[str, float], priorities: np.ndarray | None) -> PendingStep:
        """A step whose results are already read (an agent with a blocking ``update`` only)."""
        return cls(tuple(metrics), None, read=(metrics, priorities))

    def done(self) -> bool:
        """Whether :meth:`result` would return without waiting for the device."""
        return self._read is not None or self._event is None or bool(self._event.query())

    def result(self) -> tuple[dict[str, float], np.ndarray | None]:
        """Scalar metrics and priorities (float32, or None where the update has none), waiting for the
        device where the step has not finished; the same objects on every call."""
        if self._read is None:
            if self._event is not None:
                self._event.synchronize()
            assert self._values is not None
            host = self._values.numpy()
            n = len(self._names)
            self._read = (dict(zip(self._names, host[:n].tolist(), strict=True)), host[n:].astype(np.float32))
            self._values = self._event = None  # the host tensor goes back to torch's allocator
        return self._read

    def read(self) -> tuple[dict[str, float], np.ndarray]:
        """:meth:`result` of a step that has priorities (every one :meth:`on_host` made)."""
        metrics, priorities = self.result()
        if priorities is None:
            raise ValueError("this step has no priorities")
        return metrics, priorities


def module_params(module: nn.Module, prefix: str = "") -> dict[str, np.ndarray]:
    """A module's ``state_dict`` as named, contiguous CPU numpy arrays (names prefixed)."""
    return {prefix + k: v.detach().cpu().numpy() for k, v in module.state_dict().items()}


def load_module_params(module: nn.Module, params: Mapping[str, np.ndarray], prefix: str = "") -> None:
    """Load named arrays (as :func:`module_params` gives them) into ``module``; names and shapes
    must match exactly (a ValueError says which does not)."""
    own = {prefix + k: tuple(v.shape) for k, v in module.state_dict().items()}
    mine = {k: v for k, v in params.items() if k.startswith(prefix)} if prefix else dict(params)
    check_params(mine, own)
    module.load_state_dict({k[len(prefix):]: torch.from_numpy(np.array(v, copy=True)) for k, v in mine.items()})


@torch.no_grad()
def clip_gradients(module: nn.Module, max_norm: float) -> torch.Tensor:
    """The global norm of ``module``'s gradients, clipped to ``max_norm`` first (0 disables clipping).

    The same arithmetic as ``nn.utils.clip_grad_norm_`` (one norm per tensor, the norm of those,
    every gradient times ``min(max_norm / (norm + 1e-6), 1)``, no host sync), without its grouping by
    device and dtype, which costs more than the arithmetic for a small network: 150 -> 90 us for
    CartPole's. Gradients on several devices or dtypes take torch's function.
    """
    grads = [p.grad for p in module.parameters() if p.grad is not None]
    if not grads:
        return torch.zeros(())
    if len({(g.device, g.dtype) for g in grads}) > 1 or not hasattr(torch, "_foreach_norm"):
        if max_norm > 0:
            return nn.utils.clip_grad_norm_(module.parameters(), max_norm)
        return torch.norm(torch.stack([g.norm() for g in grads]))
    total = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))
    if max_norm > 0:
        torch._foreach_mul_(grads, torch.clamp(max_norm / (total + 1e-6), max=1.0))
    return total


@torch.no_grad()
def nonfinite(*values: torch.Tensor) -> torch.Tensor:
    """1.0 when any of these scalars (a loss, a gradient norm) is NaN or infinite, else 0.0: a 0-d
    tensor on their device, so an update can skip its step (:meth:`Adam.step_unless`) without a host sync."""
    return (~torch.isfinite(torch.stack([v.detach().float().reshape(()) for v in values]))).any().float()


def step_unless(optimizer: torch.optim.Optimizer, skip: torch.Tensor) -> None:
    """``optimizer.step()`` unless ``skip`` (see :func:`nonfinite`); on the device for :class:`Adam`."""
    if isinstance(optimizer, Adam):
        optimizer.step_unless(skip)
    elif not bool(skip):
        optimizer.step()


@torch.no_grad()
def update_target(target: nn.Module, source: nn.Module, tau: float) -> None:
    """Hard copy (``tau`` >= 1) or Polyak average of ``source`` into ``target``."""
    for t, s in zip(target.parameters(), source.parameters(), strict=True):
        if tau >= 1.0:
            t.copy_(s)
        else:
            t.lerp_(s, tau)


def _skip_compiler_wrappers(*owners: object) -> None:
    """Let ``torch._disable_dynamo``-wrapped functions of ``owners`` call through without importing
    ``torch._dynamo`` (about 1.1 s of CPU on first use, on the path to a learner's first update).

    Such a wrapper imports the compiler on its first call to build a "run without compiling"
    version of the function; zmqrl never compiles, so the function itself is that version. A torch
    whose wrappers look different is left as it is (correct, only slower to start).
    """
    import torch._compile as compile_mod

    marker_code = compile_mod._disable_dynamo(lambda: None).__code__

    def skip(fn: Any) -> None:
        inner = getattr(fn, "__wrapped__", None)
        if getattr(fn, "__code__", None) is marker_code and inner is not None:
            inner.__dynamo_disable = inner  # what the wrapper caches after its first call

    for owner in owners:
        for name in dir(owner):
            fn = getattr(owner, name, None)
            skip(fn)
            for cell in getattr(fn, "__closure__", None) or ():  # wrappers of wrappers (the functional adam)
                try:
                    skip(cell.cell_contents)
                except ValueError:  # an empty cell
                    pass


def _fused_kernel_fits(params: list[Any]) -> bool:
    """Whether torch has a fused Adam kernel for every one of ``params`` (tensors or param groups);
    a torch that does not say which devices it has kernels for gets the stock update."""
    try:
        from torch.optim.optimizer import _get_fused_kernels_supported_devices
    except ImportError:
        return False
    tensors = [t for p in params for t in (p["params"] if isinstance(p, dict) else [p])]
    devices = set(_get_fused_kernels_supported_devices())
    return bool(tensors) and all(t.is_floating_point() and t.device.type in devices for t in tensors)


class Adam(torch.optim.Adam):
    """``torch.optim.Adam`` with the same update and state, whose ``step`` does not import the compiler,
    using torch's fused kernel where it has one.

    The stock ``step`` imports ``torch._dynamo`` on every call (a no-op after the first, but the
    first costs about 1.1 s of CPU) only to mark graph breaks for ``torch.compile``. This ``step``
    runs the same update under ``no_grad``; state dicts and checkpoints are those of the stock class.

    Unless ``fused`` or ``foreach`` is given, the update is torch's fused kernel (one call for all
    parameters; on CPU the stock class loops over them): 400 -> 150 us a step for the CartPole
    network, 370 -> 425 CartPole DQN updates/s in all.

    :meth:`make_capturable` readies it for a captured update (:mod:`zmqrl.agents.graphs`); its state
    dicts keep the format of one that was not.
    """

    _ready = False
    _host_lr: list[float] | None = None  # the learning rates as numbers, once they live in device tensors

    def __init__(self, params: Any, **kwargs: Any) -> None:
        if not Adam._ready:
            import torch.optim.adam as adam_mod
            import torch.optim.optimizer as optimizer_mod

            _skip_compiler_wrappers(optimizer_mod.Optimizer, torch.optim.Adam, adam_mod)
            Adam._ready = True
        params = list(params)
        if "fused" not in kwargs and "foreach" not in kwargs and not kwargs.get("differentiable"):
            kwargs["fused"] = _fused_kernel_fits(params)
        super().__init__(params, **kwargs)

    def step(self, closure: Any = None) -> Any:  # type: ignore[override]
        if closure is None and self._fused_step():
            return None
        if getattr(type(self).step, "__wrapped__", None) is not None:  # a torch that wrapped this method
            return self._stock_step(closure)
        return self._stock_step_with_hooks(closure)

    # torch wraps an optimizer's step in a profiler range and its hooks unless the method carries this
    # mark (about 50 us a CartPole step); this one runs the hooks itself, on the stock path.
    step.hooked = True  # type: ignore[attr-defined]

    def _stock_step(self, closure: Any = None) -> Any:
        raw = getattr(torch.optim.Adam.step, "__wrapped__", None)
        if raw is None or self.defaults.get("differentiable"):
            return super().step(closure)
        with torch.no_grad():
            return raw(self, closure)

    _stock_step_with_hooks = torch.optim.Optimizer.profile_hook_step(_stock_step)

    @torch.no_grad()
    def step_unless(self, skip: torch.Tensor) -> None:
        """:meth:`step`, or nothing at all (parameters, moments and step counts as they were) where
        ``skip`` (a 0-d float tensor: 1.0 skips, see :func:`nonfinite`) says so. With torch's fused
        kernel the choice is made on the device, without waiting for the host; otherwise ``skip``
        is read first, which a capturable optimizer refuses (a RuntimeError saying why)."""
        if not self._fused_step(skip):
            if self._host_lr is not None:
                raise RuntimeError("a capturable Adam steps with torch's fused kernel only, and could not here "
                                   "(optimizer hooks, a parameter without a gradient, or parameters on several "
                                   "devices): reading the skip flag on the host would break a captured update")
            if not bool(skip):
                self.step()

    @torch.no_grad()
    def make_capturable(self) -> None:
        """Ready for a captured update (a CUDA graph, or its uncaptured stand-in on the CPU): every
        parameter's state allocated now (as the first step would: zero moments, step 0), ``capturable``
        set, each group's learning rate a device tensor the fused kernel reads, and :meth:`step_unless`
        never reading the skip flag on the host. Nothing of the update's arithmetic changes: on the CPU
        the results are those of the plain optimizer bit for bit (its kernel computes in double, and
        so does the learning rate's tensor here). A RuntimeError where torch has no fused kernel for
        the parameters."""
        if self._host_lr is not None:
            return
        host_lr = []
        for group in self.param_groups:
            params = group["params"]
            if not group.get("fused") or not _fused_kernel_fits(params) \
                    or len({(p.device, p.dtype) for p in params}) != 1:
                where = sorted({str(p.device) for p in params})
                raise RuntimeError(f"a captured update needs torch's fused Adam kernel for parameters of one device "
                                   f"and dtype; these are on {', '.join(where)}")
            host_lr.append(float(group["lr"]))
            device = params[0].device
            group["capturable"] = True
            kernel_dtype = torch.float64 if device.type == "cpu" else torch.float32  # what each kernel reads lr as
            group["lr"] = torch.tensor(host_lr[-1], device=device, dtype=kernel_dtype)
            for p in params:
                state = self.state[p]
                if not state:
                    state["step"] = torch.zeros((), dtype=torch.float32, device=p.device)
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    if group["amsgrad"]:
                        state["max_exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        self._host_lr = host_lr

    def state_dict(self) -> dict[str, Any]:
        """As torch's; a capturable one writes its learning rates as numbers and ``capturable`` as it was
        asked for, so its checkpoints are those of one that never was."""
        state: dict[str, Any] = super().state_dict()
        if self._host_lr is not None:
            for group, lr in zip(state["param_groups"], self._host_lr, strict=True):
                group["lr"], group["capturable"] = lr, False
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """As torch's (the moments become new tensors); a capturable one stays so, its learning-rate
        tensors (the same ones) set to the loaded values."""
        lr_tensors = [group["lr"] for group in self.param_groups] if self._host_lr is not None else None
        super().load_state_dict(state_dict)
        if lr_tensors is not None:
            self._host_lr = None
            host_lr = [float(group["lr"]) for group in self.param_groups]
            self.make_capturable()
            for group, tensor, lr in zip(self.param_groups, lr_tensors, host_lr, strict=True):
                tensor.fill_(lr)
                group["lr"] = tensor

    @torch.no_grad()
    def _fused_step(self, skip: torch.Tensor | None = None) -> bool:
        """The fused kernel called directly, as the stock ``step`` calls it once every parameter has
        its state and a gradient, all on one device and dtype, with no hooks: 160 -> 60 us a step
        for the CartPole network (the stock path groups tensors and checks options on every call).
        Returns False, having changed nothing, where the stock ``step`` must run."""
        if (self._optimizer_step_pre_hooks or self._optimizer_step_post_hooks or optimizer_hooks_registered()
                or getattr(self, "grad_scale", None) is not None or getattr(self, "found_inf", None) is not None):
            return False
        calls = []
        for group in self.param_groups:
            if not group.get("fused") or group.get("differentiable") \
                    or any(isinstance(v, torch.Tensor) for v in group["betas"]):
                return False
            params = group["params"]
            if not params or any("step" not in self.state.get(p, ()) for p in params) \
                    or any(p.grad is None or p.grad.is_sparse for p in params) \
                    or len({(p.device, p.dtype) for p in params}) != 1 or not params[0].is_floating_point():
                return False
            calls.append((group, params))
        for group, params in calls:
            states = [self.state[p] for p in params]
            steps = [s["step"] for s in states]
            if skip is None:
                torch._foreach_add_(steps, 1)
            else:
                skip = skip.to(device=params[0].device, dtype=torch.float32).reshape(())
                torch._foreach_add_(steps, 1 - skip)
            fused = torch._fused_adamw_ if group.get("decoupled_weight_decay") else torch._fused_adam_
            fused(params, [p.grad for p in params], [s["exp_avg"] for s in states],
                  [s["exp_avg_sq"] for s in states], [s["max_exp_avg_sq"] for s in states] if group["amsgrad"] else [],
                  steps, amsgrad=group["amsgrad"], lr=group["lr"], beta1=group["betas"][0], beta2=group["betas"][1],
                  weight_decay=group["weight_decay"], eps=group["eps"], maximize=group["maximize"], found_inf=skip)
        return True


def optimizer_hooks_registered() -> bool:
    """Whether hooks registered for every optimizer (``register_optimizer_step_pre_hook``) exist."""
    import torch.optim.optimizer as optimizer_mod

    return bool(getattr(optimizer_mod, "_global_optimizer_pre_hooks", None)
                or getattr(optimizer_mod, "_global_optimizer_post_hooks", None))
