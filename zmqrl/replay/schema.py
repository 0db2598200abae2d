"""What a replay stores per item: a schema (key -> dtype and per-item shape), checked and compared, and
the frames an image item is split into. Shared by the ring and its files."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

Schema = Mapping[str, tuple[npt.DTypeLike, tuple[int, ...]]]  # key -> (dtype, per-item shape)
Layout = dict[str, tuple[tuple[int, ...], np.dtype]]  # the stored form: key -> (per-item shape, dtype)

RESERVED_KEYS = ("indices", "weights")  # keys of sample()'s output, never of stored items


def parse_schema(schema: Mapping[str, Any], allow_empty: bool = False) -> Layout:
    """``{key: (dtype, per-item shape)}`` as ``{key: (shape, np.dtype)}``, checked."""
    if not schema and not allow_empty:
        raise ValueError("schema must name at least one key")
    out: Layout = {}
    for key, spec in schema.items():
        if not isinstance(key, str) or key in RESERVED_KEYS:
            raise ValueError(f"schema key {key!r}: keys must be strings other than {RESERVED_KEYS}")
        try:
            dtype_like, shape_like = spec
            dtype = np.dtype(dtype_like)
            shape = tuple(int(d) for d in shape_like)
        except (TypeError, ValueError):
            raise ValueError(f"schema key {key!r}: expected (dtype, per-item shape), got {spec!r}") from None
        if dtype.hasobject or any(d < 0 for d in shape):
            raise ValueError(f"schema key {key!r}: expected a plain dtype and non-negative dims, got {spec!r}")
        out[key] = (shape, dtype)
    return out


def match_schema(expected: Layout, got: Layout, what: str) -> None:
    """Raise ``ValueError`` naming the first key whose presence, dtype or per-item shape differs."""
    missing = sorted(set(expected) - set(got))
    extra = sorted(set(got) - set(expected))
    if missing:
        raise ValueError(f"{what} is missing key {missing[0]!r} (expected keys {sorted(expected)})")
    if extra:
        raise ValueError(f"{what} has unexpected key {extra[0]!r} (expected keys {sorted(expected)})")
    for key, (shape, dtype) in got.items():
        want_shape, want_dtype = expected[key]
        if shape != want_shape:
            raise ValueError(f"key {key!r}: expected per-item shape {want_shape}, got {shape}")
        if dtype != want_dtype:
            raise ValueError(f"key {key!r}: expected dtype {want_dtype}, got {dtype}")
