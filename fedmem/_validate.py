"""Parameter checks shared by every constructor: fail at construction, name the value.

Every check raises ``ValueError(f"{name} must be ... Found {value!r}.")`` (or
``TypeError`` for a wrong type) and never clamps.
"""

from __future__ import annotations

import math
import numbers

import numpy as np


def _real(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number. Found {value!r} ({type(value).__name__}).")
    v = float(value)
    if math.isnan(v) or math.isinf(v):
        raise ValueError(f"{name} must be finite. Found {value!r}.")
    return v


def finite(name: str, value) -> float:
    return _real(name, value)


def positive(name: str, value) -> float:
    v = _real(name, value)
    if v <= 0:
        raise ValueError(f"{name} must be positive. Found {value!r}.")
    return v


def nonnegative(name: str, value) -> float:
    v = _real(name, value)
    if v < 0:
        raise ValueError(f"{name} must be non-negative. Found {value!r}.")
    return v


def open_unit(name: str, value) -> float:
    v = _real(name, value)
    if not 0.0 < v < 1.0:
        raise ValueError(f"{name} must be in the open interval (0, 1). Found {value!r}.")
    return v


def positive_int(name: str, value, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an integer. Found {value!r} ({type(value).__name__}).")
    if int(value) < minimum:
        raise ValueError(f"{name} must be >= {minimum}. Found {value!r}.")
    return int(value)


def finite_array(name: str, value, ndim: int | None = None, dim: int | None = None) -> np.ndarray:
    """Return ``value`` as a float64 array after checking shape and finiteness."""
    try:
        arr = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{name} must be numeric array-like. Found {type(value).__name__}.") from exc
    if ndim is not None and arr.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} dimension(s). Found shape {arr.shape}.")
    if dim is not None and arr.shape[-1] != dim:
        raise ValueError(f"{name} must have last dimension {dim}. Found shape {arr.shape}.")
    if arr.size == 0:
        raise ValueError(f"{name} must not be empty. Found shape {arr.shape}.")
    if not np.all(np.isfinite(arr)):
        bad = arr[~np.isfinite(arr)].ravel()[0]
        raise ValueError(f"{name} must be finite everywhere. Found {bad!r}.")
    return arr


def rng_check(name: str, rng) -> None:
    import numpy as _np

    if isinstance(rng, _np.random.Generator):
        return
    try:
        import torch

        if isinstance(rng, torch.Generator):
            return
    except ImportError:  # pragma: no cover - torch is a hard dependency
        pass
    raise TypeError(
        f"{name} must be a numpy.random.Generator or torch.Generator (injected RNG). "
        f"Found {type(rng).__name__}."
    )


def positive_or_inf(name: str, value) -> float:
    """A positive number where ``math.inf`` means "disabled" (e.g. a budget)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or math.isnan(value) or value <= 0:
        raise ValueError(f"{name} must be positive (math.inf disables it). Found {value!r}.")
    return float(value)


def physical_memory_bytes() -> int | None:
    """Total physical memory of this machine, or None when it cannot be read."""
    import os

    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return None


def memory_problem(what: str, nbytes: float, fraction: float = 0.5) -> str | None:
    """A problem message when an allocation of ``nbytes`` would need more than ``fraction`` of
    this machine's memory (``None`` when it fits or the memory cannot be read)."""
    total = physical_memory_bytes()
    if total is None or nbytes <= fraction * total:
        return None
    return (f"{what} needs about {nbytes / 2**30:.3g} GiB, more than {fraction:.0%} of this machine's "
            f"{total / 2**30:.3g} GiB; reduce it")
