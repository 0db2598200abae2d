"""Numpy pieces shared by the algorithms' numpy policies (torch-free).

Actors run one small forward pass per env step; for an MLP that is a few matrix products, which
numpy does several times faster than torch's per-call overhead allows, and a process that never
imports torch starts seconds sooner. Parameters keep the torch modules' ``state_dict`` names and
shapes, so the learner publishes the same arrays whichever backend an actor uses.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

_ZERO = np.float32(0.0)
Layer = tuple[np.ndarray, np.ndarray]  # (W transposed and contiguous, bias): y = x @ W + b


def linear_stack_shapes(prefix: str, in_dim: int, hidden: Sequence[int]) -> dict[str, tuple[int, ...]]:
    """Names and shapes of an ``nn.Sequential`` of Linear+ReLU pairs (Linear layers at even indices)."""
    shapes: dict[str, tuple[int, ...]] = {}
    last = in_dim
    for i, size in enumerate(hidden):
        shapes[f"{prefix}.{2 * i}.weight"] = (size, last)
        shapes[f"{prefix}.{2 * i}.bias"] = (size,)
        last = size
    return shapes


def torch_default_init(shapes: Mapping[str, tuple[int, ...]], seed: int) -> dict[str, np.ndarray]:
    """Parameters drawn like torch's default ``nn.Linear`` init: weights and biases uniform in
    ±1/sqrt(fan_in), where fan_in is the second dimension of the layer's weight."""
    rng = np.random.default_rng(seed)
    params = {}
    for name, shape in shapes.items():
        fan_in = shapes[name.rsplit(".", 1)[0] + ".weight"][1]
        bound = 1.0 / math.sqrt(fan_in)
        params[name] = rng.uniform(-bound, bound, shape).astype(np.float32)
    return params


def check_params(params: Mapping[str, np.ndarray], shapes: Mapping[str, tuple[int, ...]]) -> None:
    """Names and shapes must match exactly; the ValueError says which does not."""
    if set(params) != set(shapes):
        missing, extra = sorted(set(shapes) - set(params)), sorted(set(params) - set(shapes))
        raise ValueError(f"parameter names differ: missing {missing}, unexpected {extra}")
    for name, shape in shapes.items():
        if tuple(params[name].shape) != tuple(shape):
            raise ValueError(f"parameter {name}: shape {tuple(params[name].shape)}, expected {tuple(shape)}")


def linear(params: Mapping[str, np.ndarray], name: str) -> Layer:
    """Layer ``name`` (``name.weight``, ``name.bias``) stored for ``x @ W + b`` without a strided view.

    Always copies: the transpose of a weight with one output row (a dueling value head's) is already
    contiguous, and a view of it would follow a torch agent's in-place updates (its ``params()`` are
    views of the parameters on the CPU) instead of staying what was loaded."""
    return (np.array(np.asarray(params[f"{name}.weight"]).T, dtype=np.float32, order="C"),
            np.array(params[f"{name}.bias"], dtype=np.float32))


def stack_layers(params: Mapping[str, np.ndarray], prefix: str, depth: int) -> list[Layer]:
    """The ``depth`` Linear layers of a Linear+ReLU ``nn.Sequential`` called ``prefix``."""
    return [linear(params, f"{prefix}.{2 * i}") for i in range(depth)]


def relu_stack(x: np.ndarray, layers: Sequence[Layer]) -> np.ndarray:
    """``x`` (float32, 2-D) through Linear+ReLU layers, in place where it can."""
    for w, b in layers:
        x = x @ w
        x += b
        np.maximum(x, _ZERO, out=x)
    return x


def as_rows(obs: np.ndarray) -> np.ndarray:
    """A batch of observations as float32 rows."""
    return np.asarray(obs, dtype=np.float32).reshape(len(obs), -1)
