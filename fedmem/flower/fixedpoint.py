"""Fixed-point encoding on Flower's SecAgg+ quantization grid, so a SecAgg+ sum decodes bit for bit.

Flower 1.42's ``secaggplus_mod`` quantizes each client vector with *stochastic* rounding
(``flwr.common.secure_aggregation.quantization``: ``np.random.rand``, the global NumPy RNG,
not injectable) onto the grid ``{-R + j * 2R / T}``, ``R = clipping_range``,
``T = quantization_range``, after multiplying it by ``q_ratio / T`` with
``q_ratio = round(num_examples / max_weight * T)``. A value that already lies on that grid,
sent with ``num_examples == max_weight`` (so the multiplier is exactly 1.0), is quantized
deterministically: ``(x + R) * T / (2R)`` is an exact integer when ``R`` and ``T`` are
powers of two, and the stochastic branch (``rand < ceil(a) - a = 0``) never fires.

:class:`SecAggGrid` encodes values onto that grid (round half to even, deterministic) and
decodes the aggregate ``SecAggPlusWorkflow`` hands to ``Strategy.aggregate_fit`` (the mean
over the ``n`` active clients, in floats) back to the exact integer sum. Tested in
``tests/test_flower.py::test_secagg_sum_equals_plaintext_sum_bit_for_bit``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


def _power_of_two(name: str, value) -> None:
    if isinstance(value, bool) or value <= 0 or not math.isfinite(float(value)):
        raise ValueError(f"{name} must be a positive power of two. Found {value!r}.")
    m, _ = math.frexp(float(value))
    if m != 0.5:
        raise ValueError(f"{name} must be a positive power of two. Found {value!r}.")


@dataclass(frozen=True)
class SecAggGrid:
    """Flower SecAgg+ quantization grid: ``clipping_range`` R, ``quantization_range`` T,
    ``modulus_range`` M (all powers of two, as ``SecAggPlusWorkflow`` recommends)."""

    clipping_range: float = 8.0
    quantization_range: int = 2 ** 22
    modulus_range: int = 2 ** 32

    def __post_init__(self):
        _power_of_two("clipping_range", self.clipping_range)
        _power_of_two("quantization_range", self.quantization_range)
        _power_of_two("modulus_range", self.modulus_range)
        if not isinstance(self.quantization_range, int) or not isinstance(self.modulus_range, int):
            raise ValueError(f"quantization_range and modulus_range must be integers. Found "
                             f"{self.quantization_range!r}, {self.modulus_range!r}.")
        if self.modulus_range <= self.quantization_range:
            raise ValueError(f"modulus_range must exceed quantization_range. Found {self.modulus_range!r} <= "
                             f"{self.quantization_range!r}.")

    @property
    def step(self) -> float:
        """Grid spacing 2R / T (a power of two)."""
        return 2.0 * self.clipping_range / self.quantization_range

    def max_clients(self) -> int:
        """Most clients whose quantized sum (each < T, and the weight factor T each) stays below M."""
        return self.modulus_range // self.quantization_range - 1

    def encode(self, x) -> np.ndarray:
        """Integer grid coordinates ``rint(x / step)``; ``ValueError`` outside [-R, R]."""
        a = np.asarray(x, dtype=np.float64)
        if not np.all(np.isfinite(a)):
            raise ValueError("x must be finite. Found a non-finite entry.")
        if a.size and float(np.max(np.abs(a))) > self.clipping_range:
            raise ValueError(f"x must lie in [-clipping_range, clipping_range] = [-{self.clipping_range}, "
                             f"{self.clipping_range}]. Found max |x| = {float(np.max(np.abs(a)))!r}.")
        return np.rint(a / self.step).astype(np.int64)

    def to_float(self, m) -> np.ndarray:
        """Grid coordinates back to floats (exact: a power-of-two multiple of an integer)."""
        return np.asarray(m, dtype=np.int64).astype(np.float64) * self.step

    def on_grid(self, x) -> np.ndarray:
        return self.to_float(self.encode(x))

    def decode_mean(self, mean, n_active: int) -> np.ndarray:
        """Integer sum of the grid coordinates from SecAgg+'s mean over ``n_active`` clients."""
        if isinstance(n_active, bool) or not isinstance(n_active, (int, np.integer)) or n_active < 1:
            raise ValueError(f"n_active must be a positive integer. Found {n_active!r}.")
        if n_active > self.max_clients():
            raise ValueError(f"n_active must be <= {self.max_clients()} (modulus_range / quantization_range - 1). "
                             f"Found {n_active!r}.")
        a = np.asarray(mean, dtype=np.float64)
        return np.rint(a * n_active / self.step).astype(np.int64)
