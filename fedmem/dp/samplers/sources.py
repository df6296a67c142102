"""Randomness sources for the exact samplers, all drawn from an injected generator.

:class:`Bits` (exact uniform integers by rejection on whole bytes, for the Python-int
reference and continuations), :class:`Words` (uniform 64-bit words and the vectorised
uniform / Bernoulli(exp(-x)) / geometric draws built from them) and :class:`LazyUniform`
(a uniform real whose base-2**64 digits are drawn on demand).
"""

from __future__ import annotations

import functools
from fractions import Fraction

import numpy as np

from fedmem import _validate as V

from .exp_neg import exp_neg_floor, exp_neg_table, exp_neg_table_padded

_U64 = np.uint64


class Bits:
    """Exact uniform integers from an injected RNG, by rejection on whole bytes.

    Random bytes are fetched from the generator in blocks of ``_BLOCK`` and consumed in
    order (one call per block instead of one per draw: ~2x faster end to end). Every
    byte is uniform and independent, so the integers drawn are exactly uniform.
    """

    _BLOCK = 4096

    def __init__(self, rng):
        V.rng_check("rng", rng)
        self._rng = rng
        self._buf = b""
        self._pos = 0

    def _refill(self) -> None:
        if isinstance(self._rng, np.random.Generator):
            self._buf = self._rng.bytes(self._BLOCK)
        else:
            import torch  # only for a torch.Generator: importing torch costs ~2.5 s

            self._buf = bytes(torch.randint(0, 256, (self._BLOCK,), generator=self._rng,
                                            dtype=torch.uint8).tolist())
        self._pos = 0

    def _raw(self, nbytes: int) -> int:
        if self._pos + nbytes > len(self._buf):
            rest = self._buf[self._pos:]
            self._refill()
            while len(rest) + len(self._buf) < nbytes:  # draws wider than one block
                rest += self._buf
                self._refill()
            take = nbytes - len(rest)
            chunk, self._pos = rest + self._buf[:take], take
        else:
            chunk = self._buf[self._pos:self._pos + nbytes]
            self._pos += nbytes
        return int.from_bytes(chunk, "little")

    def below(self, n: int) -> int:
        """Uniform integer in [0, n)."""
        if n <= 1:
            return 0
        nbits = (n - 1).bit_length()
        nbytes = (nbits + 7) // 8
        mask = (1 << nbits) - 1
        while True:
            r = self._raw(nbytes) & mask
            if r < n:
                return r

    def bernoulli(self, p: Fraction) -> bool:
        return self.below(p.denominator) < p.numerator


@functools.lru_cache(maxsize=64)
def field_shifts(b: int) -> np.ndarray:
    """Shifts 0, b, 2b, ... cutting a 64-bit word into 64 // b fields of b bits."""
    return (np.arange(64 // b, dtype=np.uint64) * _U64(b)).astype(_U64)


class LazyUniform:
    """A uniform real in [0, 1) whose base-2**64 digits are drawn on demand (the first given)."""

    def __init__(self, first: int, bits: "Bits"):
        self._digits = [int(first)]
        self._bits = bits

    def below_exp_neg(self, j: int) -> bool:
        """Exactly: is U < exp(-j)?"""
        if j == 0:
            return True
        i = 0
        while True:
            if i == len(self._digits):
                self._digits.append(self._bits._raw(8))
            target = exp_neg_floor(j, 64 * (i + 1)) & ((1 << 64) - 1)
            if self._digits[i] != target:
                return self._digits[i] < target
            i += 1


class Words:
    """Uniform 64-bit words (and integers built from them) from an injected generator.

    numpy generators with a 64-bit bit generator (PCG64, PCG64DXSM, SFC64, Philox: the raw
    outputs are uniform 64-bit words) are read through ``random_raw``; any other numpy bit
    generator through ``Generator.bytes``. A ``torch.Generator`` seeds a numpy PCG64 with
    128 bits drawn from it (deterministic given the torch generator's state).
    """

    def __init__(self, rng):
        V.rng_check("rng", rng)
        if not isinstance(rng, np.random.Generator):
            import torch  # only for a torch.Generator: importing torch costs ~2.5 s

            seed = [int(v) for v in torch.randint(0, 2 ** 32, (4,), generator=rng, dtype=torch.int64)]
            rng = np.random.Generator(np.random.PCG64(seed))
        self.rng = rng
        bg = rng.bit_generator
        if isinstance(bg, (np.random.PCG64, np.random.PCG64DXSM, np.random.SFC64, np.random.Philox)):
            self.words = bg.random_raw
        else:
            self.words = lambda n: np.frombuffer(rng.bytes(8 * n), dtype="<u8").copy()
        self._bits: Bits | None = None

    @property
    def bits(self) -> "Bits":
        """Byte-wise source for the exact Python-int continuations (same generator)."""
        if self._bits is None:
            self._bits = Bits(self.rng)
        return self._bits

    def below(self, n: int, size: int) -> np.ndarray:
        """``size`` exactly uniform integers in [0, n), as int64 (n <= 2**63).

        Each 64-bit word is cut into ``64 // b`` independent b-bit fields, b the bit length
        of n - 1; a field >= n is rejected (the accepted ones are exactly uniform, and
        they are used in order).
        """
        if n <= 1:
            return np.zeros(size, dtype=np.int64)
        b = (n - 1).bit_length()
        fields = 64 // b
        parts, got = [], 0
        while got < size:
            c = int((size - got) * (1 << b) / n * 1.1 / fields) + 4
            w = self.words(c)
            if fields == 1:
                v = w >> _U64(64 - b)
            else:
                v = ((w[:, None] >> field_shifts(b)) & _U64((1 << b) - 1)).ravel()
            v = v[v < _U64(n)]
            parts.append(v)
            got += v.size
        out = parts[0] if len(parts) == 1 else np.concatenate(parts)
        return out[:size].astype(np.int64)

    def bern_exp_frac(self, r: np.ndarray, den: int) -> np.ndarray:
        """Exact Bernoulli(exp(-r/den)) per lane, for int64 ``0 <= r <= den`` (CKS20 Alg. 1).

        K = first k >= 1 with A_k = 0, A_k ~ Bernoulli(r / (den k)); return K odd. Only the
        lanes still running draw the next A_k (on average e**(r/den) <= e draws per lane).
        """
        m = r.size
        out = np.zeros(m, dtype=bool)
        if m == 0:
            return out
        rest = np.arange(m)
        k = 1
        while rest.size:
            if den * k >= 1 << 62:                      # (never in practice) exact Python ints
                for i in rest:
                    kk, ri = k, int(r[i])
                    while self.bits.below(den * kk) < ri:
                        kk += 1
                    out[i] = kk % 2 == 1
                break
            go_on = self.below(den * k, rest.size) < r[rest]   # A_k ~ Bernoulli(r / (den k))
            if k % 2 == 1:
                out[rest[~go_on]] = True                # K = k odd (out is False otherwise)
            rest = rest[go_on]
            k += 1
        return out

    def bern_exp_int(self, j: np.ndarray, w: np.ndarray | None = None) -> np.ndarray:
        """Exact Bernoulli(exp(-j)) per lane, for int64 ``j >= 0`` (``w``: fresh words, if drawn)."""
        if w is None:
            w = self.words(j.size)
        c = exp_neg_table_padded()[np.minimum(j, 65)]        # C_j; 0 for j = 0 (handled) and j > 64
        out = (w < c) | (j == 0)
        for i in np.flatnonzero((w == c) & (j != 0)):  # tie on the first digit: read on
            out[i] = LazyUniform(int(w[i]), self.bits).below_exp_neg(int(j[i]))
        return out

    def geometric_e(self, w: np.ndarray) -> np.ndarray:
        """Exact draws of V with P[V >= v] = exp(-v), one per fresh word of ``w``:
        V = #{v >= 1: U < exp(-v)} for the uniform real U whose first base-2**64 digit is w."""
        asc = exp_neg_table()[::-1]                            # ascending (non-decreasing)
        pos = np.searchsorted(asc, w, side="right")     # #{v <= 64: C_v <= w}
        v = (asc.size - pos).astype(np.int64)          # #{v <= 64: w < C_v}
        # a tie: w equals some C_v (pos >= 1 always, as C_64 = 0 <= w), e.g. w == 0.
        tie = np.flatnonzero(asc[pos - 1] == w)
        for i in tie:
            lu = LazyUniform(int(w[i]), self.bits)
            vi = 0
            while lu.below_exp_neg(vi + 1):
                vi += 1
            v[i] = vi
        return v
