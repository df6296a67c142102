"""The default projection of DP-MIND (Algorithm 3, line 5): :class:`CascadeProjector`, a
bfloat16 candidate pass, an exact float64 re-rank and a certificate that proves the answer
equal to the float64 exact argmin; :func:`native_bfloat16` tells whether the CPU has
bfloat16 matrix units (``matmul="auto"``).
"""

from __future__ import annotations

import functools
import os

import numpy as np

from fedmem import _validate as V
from fedmem.agent.dpmind.embeddings import TokenTable
from fedmem.agent.dpmind.projection import as_points, load_torch, torch_threads


class CascadeProjector:
    """Nearest output token by a bfloat16 candidate pass, an exact float64 re-rank and a certificate.

    1. **Candidate pass** (bfloat16; AMX / AVX512-BF16 units where the CPU has them, float32
       accumulation): for a block of ``block`` noisy embeddings x, one matrix product with
       the augmented table ``[E_u, ||E_u||^2]`` against ``[-2 x, 1]`` gives the scores
       ``s^(u)`` ~ ``s(u) = ||E_u||^2 - 2 <E_u, x>`` (= ||E_u - x||^2 - ||x||^2) for every
       output token u. The output tokens are dealt into ``group`` interleaved slabs, so that
       "group" c is {c, c + G, c + 2G, ...}; an elementwise minimum over the slabs gives
       each group's best score, and the ``probe`` groups with the smallest minimum are kept.
       Of their ``probe * group`` members, the ``candidates`` with the lowest bfloat16
       score go on (``torch.topk``).
    2. **Re-rank** (float64): the exact score of each candidate; the argmin (ties go to
       the lowest token id) is the answer.
    3. **Certificate** (``certify=True``, the default). With a = [-2x, 1] and a~, b~_u the
       bfloat16 roundings actually used, every score obeys
       ``|s(u) - s^(u)| <= B(x) + u_o |s^(u)|`` where
       ``B(x) = ||2x - 2x~|| max||E|| + ||2x~|| max||E - E~|| + max| ||E||^2 - (||E||^2)~ |
       + gamma_D ||a~|| max||b~||`` (Cauchy-Schwarz on the two rounding residuals, the
       rounding of the squared-norm row, float32 accumulation of D products with a x2
       margin), and u_o = 2^-7 bounds the rounding of the product to bfloat16 (twice the
       unit roundoff, so it also covers truncation). Let m0 be the smallest bfloat16
       score and f(y) = y - u_o |y| (increasing). The true winner w has
       ``s(w) <= s(argmin s^) <= m0 + u_o |m0| + B`` and ``s(w) >= f(s^(w)) - B``, so
       ``f(s^(w)) <= R = m0 + u_o |m0| + 2B``: every token with f(s^(u)) > R is
       strictly worse than w. The answer is certified when the best group outside the
       probe and the best probed token outside the candidates both have f(.) > R. When
       not, every token with f(s^(u)) <= R (a set that provably contains w; usually a
       handful) is re-ranked in float64. So with ``certify=True`` the output always
       equals the float64 argmin of s(u) over the whole output set (:meth:`exhaustive`),
       under one assumption: the bfloat16 product accumulates in float32 (oneDNN's and
       AMX/AVX512-BF16's behaviour; tests compare with :meth:`exhaustive`).
       ``fallbacks`` / ``projected`` count the queries that needed step 3's re-rank.

    ``matmul`` says how the candidate product is computed: ``"bfloat16"`` (a bfloat16
    matrix product), ``"float32"`` (the same bfloat16-rounded operands multiplied in
    float32, the result rounded to bfloat16) or ``"auto"`` (bfloat16 when the CPU has
    bfloat16 matrix units, see :func:`native_bfloat16`, else float32). Both follow the
    error model above (a product of two bfloat16 values is exact in float32, the sum
    accumulates in float32, the output is rounded to bfloat16), so the certificate and
    the certified output are the same; without AVX512-BF16/AMX, torch emulates the
    bfloat16 product about 13x slower than float32 (measured on an AVX2-only CPU, see
    docs/dpmind.md), which is what ``"auto"`` avoids.

    ``certify=False`` skips step 3 (the pre-certificate cascade): the answer is exact
    only when the true nearest token survives the candidate pass (measured recall@1 in
    ``scripts/bench_dpmind.py``). With ``probe`` equal to the number of groups and
    ``candidates`` equal to the output-set size the search is exhaustive either way.

    Privacy: the projector reads only the noisy embeddings, so whatever it returns is
    post-processing of the epsilon-d_chi private release (Theorem 3.3).
    """

    name = "cascade"

    def __init__(self, table: TokenTable, *, candidates: int = 8, group: int = 16, probe: int = 2,
                 block: int = 256, threads: int | None = None, certify: bool = True, matmul: str = "auto"):
        torch = load_torch()
        self.table = table
        if not isinstance(certify, bool):
            raise ValueError(f"certify must be a bool. Found {certify!r}.")
        self.certify = certify
        if matmul not in MATMULS:
            raise ValueError(f"matmul must be one of {list(MATMULS)}. Found {matmul!r}.")
        self.matmul = matmul
        if matmul == "auto":
            # int8 is opt-in: measured slower than bfloat16 (bf16 time / int8 time 0.37, n=7) and than
            # float32 under an AVX2-only restriction (0.76, n=7) on this machine (docs/dpmind.md).
            self.matmul = "bfloat16" if native_bfloat16() else "float32"
        self.fallbacks = 0   # queries whose certificate failed and that were searched exhaustively
        self.projected = 0   # queries projected so far
        self.exact_ties = 0  # queries whose float64 scores could not separate the best two (exact arithmetic)
        self.candidates_scored = 0  # int8 path: (query, token) pairs re-ranked in float64
        self.threads = None if threads is None else V.positive_int("threads", threads)
        self.block = V.positive_int("block", block)
        self.group = V.positive_int("group", group)
        ids = np.array(table.output_ids)
        n, d = ids.size, table.dim
        self.n_groups = -(-n // self.group)
        self.probe = V.positive_int("probe", probe)
        if self.probe > self.n_groups:
            raise ValueError(f"probe must be <= the number of groups ({self.n_groups}). Found {probe!r}.")
        self.candidates = V.positive_int("candidates", candidates)
        if self.candidates > self.probe * self.group:
            raise ValueError(f"candidates must be <= probe * group ({self.probe * self.group}). "
                             f"Found {candidates!r}.")
        padded = self.n_groups * self.group
        mat = np.array(table.matrix[ids], dtype=np.float64)
        sq = (mat * mat).sum(1)
        # Augmented bfloat16 table (D, padded): rows 0..d-1 = E^T, row d = ||E||^2; D is
        # rounded up to a multiple of 32 for the matrix units. Padding columns score 1e4.
        self._dim_aug = -(-(d + 1) // 32) * 32
        aug = np.zeros((padded, self._dim_aug), dtype=np.float32)
        aug[:n, :d] = mat
        aug[:n, d] = sq
        aug[n:, d] = 1e4
        self._aug_t = torch.from_numpy(aug).to(torch.bfloat16).T.contiguous()  # (D, padded)
        # The operand of the product: the bfloat16 table itself, or its exact float32 copy.
        self._aug_mm = self._aug_t if self.matmul == "bfloat16" else self._aug_t.to(torch.float32)
        mat_p = np.zeros((padded, d), dtype=np.float64)
        mat_p[:n] = mat
        sq_p = np.full(padded, np.inf)
        sq_p[:n] = sq
        self._mat = torch.from_numpy(mat_p.astype(np.float32))  # re-rank rows (float32 storage is exact)
        self._sq = torch.from_numpy(sq_p)
        ids_p = np.full(padded, ids[-1] if n else 0, dtype=np.int64)
        ids_p[:n] = ids
        self._ids = torch.from_numpy(ids_p)
        self._offsets = torch.arange(self.group) * self.n_groups  # members of group c: c + offsets
        # Constants of the certified error bound (see the class docstring), over the real
        # (non-padding) columns b_u = [E_u, ||E_u||^2] and their bfloat16 roundings.
        bf = self._aug_t[:d + 1, :n].T.to(torch.float64).numpy()          # (n, d + 1) bfloat16 values
        self._max_e = float(np.linalg.norm(mat, axis=1).max()) if n else 0.0            # max ||E_u||
        self._max_de = float(np.linalg.norm(mat - bf[:, :d], axis=1).max()) if n else 0.0  # max ||E_u - E~_u||
        self._max_dsq = float(np.abs(sq - bf[:, d]).max()) if n else 0.0               # max |sq_u - sq~_u|
        self._max_bt = float(np.linalg.norm(bf, axis=1).max()) if n else 0.0            # max ||b~_u||
        # float32 accumulation of D products, with a x2 margin: gamma_D = D u / (1 - D u)
        self._gamma = 2.0 * (self._dim_aug * 2.0 ** -24) / (1.0 - self._dim_aug * 2.0 ** -24)
        self._u_out = 2.0 ** -7  # bfloat16 rounding of each product entry (2x the unit roundoff 2^-8)
        self._max_sq = float(sq.max()) if n else 0.0
        self._n = n
        if self.matmul == "int8":
            self._int8 = Int8Scan(mat, sq, self.block)

    def project(self, points) -> np.ndarray:
        torch = load_torch()
        x = torch.from_numpy(as_points(self.table, points))
        out = torch.empty(x.shape[0], dtype=torch.int64)
        with torch_threads(self.threads):
            if self.matmul == "int8":
                for s in range(0, x.shape[0], self.block):
                    out[s:s + self.block] = self._project_int8(x[s:s + self.block])
                self.projected += int(x.shape[0])
                return out.numpy()
            xa = torch.zeros(min(self.block, max(x.shape[0], 1)), self._dim_aug, dtype=self._aug_mm.dtype)
            xa[:, self.table.dim] = 1.0
            for s in range(0, x.shape[0], self.block):
                xb = x[s:s + self.block]
                out[s:s + self.block] = self._project_block(xb, xa[:xb.shape[0]])
        self.projected += int(x.shape[0])
        return out.numpy()

    def exhaustive(self, points) -> np.ndarray:
        """Float64 argmin of ||E_u||^2 - 2 <E_u, x> over every output token (lowest id on ties).

        The reference that the certified cascade provably equals; slow (a float64 scan).
        """
        torch = load_torch()
        x = torch.from_numpy(as_points(self.table, points))
        x64 = x.to(torch.float64)
        best = torch.full((x.shape[0],), float("inf"), dtype=torch.float64)
        big = torch.iinfo(torch.int64).max
        ids = torch.full((x.shape[0],), big, dtype=torch.int64)
        step = 4096
        for c in range(0, self._mat.shape[0], step):  # one pass; padding columns score +inf
            sc = self._sq[c:c + step] - 2.0 * (x64 @ self._mat[c:c + step].to(torch.float64).T)
            mn = sc.min(1).values
            # Columns are ordered by group, not by id: the lowest token id among this slice's ties,
            # merged with the best so far (strictly better replaces, an exact tie keeps the lower id).
            cand = torch.where(sc == mn[:, None], self._ids[c:c + step][None, :], big).amin(1)
            ids = torch.where(mn < best, cand, torch.where(mn == best, torch.minimum(ids, cand), ids))
            best = torch.minimum(best, mn)
        # Exact arithmetic where float64 cannot separate the best scores: every column within
        # 2 delta of the float64 minimum (delta bounds the float64 evaluation error) is re-scored
        # exactly; elsewhere the float64 winner is the exact winner.
        delta = self._delta(x64)
        near = []
        for c in range(0, self._mat.shape[0], step):
            sc = self._sq[c:c + step] - 2.0 * (x64 @ self._mat[c:c + step].to(torch.float64).T)
            r, k = torch.nonzero(sc <= (best + 2.0 * delta)[:, None], as_tuple=True)
            near.append((r, k + c))
        row = torch.cat([r for r, _ in near])
        col = torch.cat([k for _, k in near])
        counts = torch.bincount(row, minlength=x.shape[0])
        for i in torch.nonzero(counts > 1).squeeze(1).tolist():
            ids[i] = self._exact_winner(x[i], col[row == i])
        return ids.numpy()

    def _delta(self, x64):
        """Per-query bound on |float64 score - exact score| (any summation order, FMA or not):
        gamma_{d+2} (||E||^2 + 2 ||E|| ||x||) <= 2^-40 (max ||E||^2 + 2 max ||E|| ||x||), a margin of
        about 20x over gamma_386 = 386 u / (1 - 386 u), u = 2^-53."""
        return 2.0 ** -40 * (self._max_sq + 2.0 * self._max_e * x64.norm(dim=1)) + 1e-300

    def _exact_winner(self, x, cols):
        """Lowest token id among the columns ``cols`` with the smallest exact score ||E_u||^2 - 2 <E_u, x>
        (float32 values read as exact rationals, scaled by 2^149 to integers; Python integers)."""
        xi = _exact_ints(x.numpy())
        best = bestid = None
        for c in cols.tolist():
            e = _exact_ints(self._mat[c].numpy())
            v = sum(a * a for a in e) - 2 * sum(a * b for a, b in zip(e, xi))
            tid = int(self._ids[c])
            if best is None or v < best or (v == best and tid < bestid):
                best, bestid = v, tid
        return bestid

    def _finish(self, x64, xf, row, col, nrows, ex=None):
        """Winner per query among candidate pairs (row, col) that provably contain the exact
        argmin: float64 scores, then exact arithmetic for rows whose best two are within 2 delta."""
        torch = load_torch()
        if ex is None:
            ex = self._sq[col] - 2.0 * (self._mat[col].to(torch.float64) * x64[row]).sum(1)
        big = torch.iinfo(torch.int64).max
        rmin = torch.full((nrows,), float("inf"), dtype=torch.float64).scatter_reduce(0, row, ex, "amin")
        tid = torch.where(ex == rmin[row], self._ids[col], big)
        res = torch.full((nrows,), big, dtype=torch.int64).scatter_reduce(0, row, tid, "amin")
        delta = self._delta(x64)
        close = ex <= rmin[row] + 2.0 * delta[row]
        counts = torch.bincount(row[close], minlength=nrows)
        for i in torch.nonzero(counts > 1).squeeze(1).tolist():
            self.exact_ties += 1
            res[i] = self._exact_winner(xf[i], col[close & (row == i)])
        return res

    def _project_int8(self, xb):
        """One block through the int8 candidate pass (see :class:`Int8Scan`) and the exact finish."""
        torch = load_torch()
        b = xb.shape[0]
        x64 = xb.to(torch.float64)
        sc, cons, nat, na = self._int8.scores(x64)                  # (b, n) float32 scores s^
        if not self.certify:
            cols = sc.topk(min(self.candidates, self._n), 1, largest=False).indices
            row = torch.arange(b)[:, None].expand_as(cols).reshape(-1)
            return self._finish(x64, xb, row, cols.reshape(-1), b)
        q = self._int8
        m0, v0 = sc.min(1)
        # upper bound on the winner's exact score: that of v0, s(v0) <= s^(v0) + e(v0)
        upper = m0.to(torch.float64) + cons + nat * q.de[v0] + na * q.ne[v0]
        # coarse set: s^(u) <= upper + max_u e(u), compared in float32 with the threshold rounded up
        thr = upper + cons + nat * q.max_de + na * q.max_ne
        t32 = thr.to(torch.float32)
        t32 = torch.where(t32.to(torch.float64) < thr, torch.nextafter(t32, torch.full_like(t32, float("inf"))), t32)
        row, col = torch.nonzero(sc <= t32[:, None], as_tuple=True)
        # refine with each column's own bound: u can win only if s^(u) - e(u) <= upper
        keep = sc[row, col].to(torch.float64) - cons[row] - nat[row] * q.de[col] - na[row] * q.ne[col] <= upper[row]
        row, col = row[keep], col[keep]
        self.fallbacks += int((torch.bincount(row, minlength=b) > 1).sum())
        self.candidates_scored += int(row.numel())
        return self._finish(x64, xb, row, col, b)

    def _project_block(self, xb, xa):
        torch = load_torch()
        b, d, g, G = xb.shape[0], self.table.dim, self.group, self.n_groups
        xa[:, :d] = (xb * -2.0).to(torch.bfloat16)                         # a~: -2x rounded to bfloat16
        sc = torch.mm(xa, self._aug_mm).to(torch.bfloat16)                 # (b, padded) bfloat16 scores
        gmin = sc.view(b, g, G).amin(1)                                    # (b, G) group minima
        certify = self.certify
        if certify and self.probe < G:
            top = gmin.topk(self.probe + 1, 1, largest=False, sorted=True)
            groups = top.indices[:, :self.probe]
            next_group = top.values[:, self.probe].to(torch.float64)       # best score outside the probe
            m0 = top.values[:, 0].to(torch.float64)                        # min over all columns
        else:
            top = gmin.topk(self.probe, 1, largest=False, sorted=certify)
            groups = top.indices
            next_group = None
            m0 = top.values[:, 0].to(torch.float64) if certify else None
        cols = (groups[:, :, None] + self._offsets).reshape(b, -1)         # (b, probe * group)
        next_cand = None
        if self.candidates < cols.shape[1]:
            cs = sc.gather(1, cols)
            if certify:
                t2 = cs.topk(self.candidates + 1, 1, largest=False, sorted=True)
                keep = t2.indices[:, :self.candidates]
                next_cand = t2.values[:, self.candidates].to(torch.float64)  # best probed score not kept
            else:
                keep = cs.topk(self.candidates, 1, largest=False, sorted=False).indices
            cols = cols.gather(1, keep)                                    # (b, candidates)
        rows = self._mat[cols].to(torch.float64)                           # (b, m, d)
        x64 = xb.to(torch.float64)
        exact = self._sq[cols] - 2.0 * torch.bmm(rows, x64[:, :, None]).squeeze(2)
        rix = torch.arange(b)[:, None].expand_as(cols).reshape(-1)
        result = self._finish(x64, xb, rix, cols.reshape(-1), b, ex=exact.reshape(-1))
        if not certify:
            return result
        # Certificate (see the class docstring): every true score s(u) = ||E_u||^2 - 2 <E_u, x>
        # is within  B + u_o |s^(u)|  of its bfloat16 score s^(u), with
        # B = ||2x - 2x~|| max||E|| + ||2x~|| max||E - E~|| + max|sq - sq~| + gamma ||a~|| max||b~||.
        ax = xa[:, :d].to(torch.float64)                                   # -2x rounded to bfloat16
        na = (x64 * -2.0 - ax).norm(dim=1)
        nax = ax.norm(dim=1)
        nat = torch.sqrt(nax * nax + 1.0)
        bound = (na * self._max_e + nax * self._max_de + self._max_dsq
                 + self._gamma * nat * self._max_bt + 1e-30)
        u_o = self._u_out
        rhs = m0 + u_o * m0.abs() + 2.0 * bound
        # f(y) <= rhs  <=>  y <= thr  (f is increasing with f(0) = 0)
        thr = torch.where(rhs >= 0, rhs / (1.0 - u_o), rhs / (1.0 + u_o))
        ok = torch.ones(b, dtype=torch.bool)
        for nxt in (next_group, next_cand):
            if nxt is not None:
                ok &= nxt > thr
        bad = torch.nonzero(~ok).squeeze(1)
        if bad.numel():
            # Not certified by the probe: re-rank, in float64, every token that the bound
            # cannot exclude (s^ <= thr), a set that contains the true winner.
            self.fallbacks += int(bad.numel())
            # bfloat16 scores are exact in float32; round the threshold up so the set can only grow
            t32 = thr[bad].to(torch.float32)
            t32 = torch.where(t32.to(torch.float64) < thr[bad], torch.nextafter(t32, torch.full_like(t32, float("inf"))), t32)
            row, col = torch.nonzero(sc[bad].to(torch.float32) <= t32[:, None], as_tuple=True)
            result[bad] = self._finish(x64[bad], xb[bad], row, col, bad.numel())
        return result


MATMULS = ("auto", "int8", "bfloat16", "float32")


def _exact_ints(v) -> list[int]:
    """float32 values as exact integers scaled by 2^149 (every float32 is k 2^-149 for an integer k)."""
    out = []
    for f in np.asarray(v, dtype=np.float32).astype(np.float64).tolist():
        num, den = f.as_integer_ratio()
        out.append(num * ((1 << 149) // den))
    return out


_ONEDNN_NO_VNNI = {"SSE41", "AVX", "AVX2", "AVX512_CORE"}


def _vnni() -> bool:
    """Whether oneDNN may use an int8 instruction that accumulates in int32 (VNNI or AMX):
    the CPU flags say so and ``ONEDNN_MAX_CPU_ISA`` does not cap it below them."""
    cap = os.environ.get("ONEDNN_MAX_CPU_ISA", os.environ.get("DNNL_MAX_CPU_ISA", "")).strip().upper()
    if cap in _ONEDNN_NO_VNNI:
        return False
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            words = set(fh.read().split())
    except OSError:
        return False
    return bool(words & {"avx512_vnni", "avx_vnni", "amx_int8"})


@functools.lru_cache(maxsize=1)
def int8_available() -> bool:
    """Whether torch has oneDNN's int8 linear (``torch.ops.onednn.qlinear_pointwise``) and it passes
    :meth:`Int8Scan.self_test` on a small table (exact int32 accumulation, bounded dequantisation)."""
    try:
        torch = load_torch()
        torch.ops.onednn.qlinear_pointwise  # noqa: B018 - presence check
        rng = np.random.default_rng(0)
        mat = rng.normal(0.0, 0.06, (300, 40))
        Int8Scan(mat, (mat * mat).sum(1), 16)
    except Exception:  # noqa: BLE001 - any failure means: do not use the int8 path
        return False
    return True


class Int8Scan:
    """The int8 candidate pass of :class:`CascadeProjector` (``matmul="int8"``) and its error bound.

    Table: each output row E_u is stored as ``e~_u = s_u w_u`` with ``w_u`` in int8 [-127, 127]
    and ``s_u = max|E_u| / 127`` (float32). Queries: ``a = -2x`` is quantised per block,
    ``a~ = t q`` with ``q`` integer in [-Q, Q] (t = max|a| / Q over the block, float32), sent as
    uint8 ``q + z``. oneDNN multiplies uint8 x int8 with int32 accumulation, which is exact, and
    returns ``s^(u) = t s_u <q, w_u> + fl32(||E_u||^2)`` in float32.

    Bound (per query, per token), with s(u) = ||E_u||^2 - 2 <E_u, x> exact::

        |s(u) - s^(u)| <= e(u) = c + ||a - a~|| ||E_u|| + ||a~|| ||E_u - e~_u||
        c = max_u |sq_u - fl32(sq_u)| + 2^-20 (||a~|| max_u ||e~_u|| + max_u fl32(sq_u))

    from <a, E> - <a~, e~> = <a - a~, E> + <a~, E - e~> (Cauchy-Schwarz twice) and at most a few
    float32 roundings in the dequantisation (each <= 2^-24 relative to a value bounded by
    ||a~|| ||e~_u|| + sq_u; 2^-20 is a x4 margin over three of them). Saturation: without VNNI /
    AMX, x86 int8 kernels add pairs of uint8 x int8 products in int16 (``vpmaddubsw``), which
    saturates above 32,767. With Q = 63 (z = 64) every uint8 is <= 127 and every pair is at most
    2 x 127 x 127 = 32,258: no saturation on any kernel. With VNNI or AMX (int32 accumulation)
    Q = 127 (z = 128). :meth:`self_test` checks the kernel against exact integer arithmetic on
    random and on saturation-prone inputs at construction and raises if it ever differs.
    """

    def __init__(self, mat: np.ndarray, sq: np.ndarray, block: int):
        torch = load_torch()
        mat = np.asarray(mat, dtype=np.float64)
        mx = np.abs(mat).max(1)
        scale = np.where(mx > 0, mx / 127.0, 1.0).astype(np.float32)
        w = np.clip(np.rint(mat / scale[:, None].astype(np.float64)), -127, 127).astype(np.int8)
        et = w.astype(np.float64) * scale[:, None].astype(np.float64)   # e~_u exactly
        sq32 = np.asarray(sq, dtype=np.float64).astype(np.float32)
        self.w = w
        self.scale = torch.from_numpy(scale)
        self.bias = torch.from_numpy(sq32)
        self.packed = torch.ops.onednn.qlinear_prepack(torch.from_numpy(w), [block, mat.shape[1]])
        self.zeros = torch.zeros(w.shape[0], dtype=torch.int64)
        self.de = torch.from_numpy(np.linalg.norm(mat - et, axis=1))     # ||E_u - e~_u||
        self.ne = torch.from_numpy(np.linalg.norm(mat, axis=1))          # ||E_u||
        self.max_de = float(self.de.max())
        self.max_ne = float(self.ne.max())
        self.max_et = float(np.linalg.norm(et, axis=1).max())
        self.max_sq32 = float(np.abs(sq32).max())
        self.dsq = float(np.abs(np.asarray(sq, dtype=np.float64) - sq32.astype(np.float64)).max())
        self.q = 127 if _vnni() else 63
        if not self.self_test():
            self.q = 63
            if not self.self_test():
                raise RuntimeError("int8 kernel: output differs from exact integer arithmetic")

    def _kernel(self, u8, t: float):
        torch = load_torch()
        return torch.ops.onednn.qlinear_pointwise(u8, t, self.q + 1, self.packed, self.scale, self.zeros, self.bias,
                                                  1.0, 0, torch.float32, "none", [], "")

    def scores(self, x64):
        """(s^ float32 (b, n), c (b,), ||a~|| (b,), ||a - a~|| (b,)) for float64 queries x64."""
        torch = load_torch()
        a = x64 * -2.0
        t = float(np.float32(max(float(a.abs().max()), 1e-30) / self.q))
        t = float(np.nextafter(np.float32(t), np.float32(np.inf))) if t * self.q < float(a.abs().max()) else t
        qv = torch.clamp(torch.round(a / t), -self.q, self.q)
        at = qv * t
        sc = self._kernel((qv + (self.q + 1)).to(torch.uint8), t)
        nat = at.norm(dim=1)
        na = (a - at).norm(dim=1)
        cons = self.dsq + 2.0 ** -20 * (nat * self.max_et + self.max_sq32)
        return sc, cons, nat, na

    def self_test(self) -> bool:
        """The kernel against exact arithmetic: random queries over the full uint8 range and, per
        token with the largest pair of same-sign weights, the query that maximises every pair."""
        torch = load_torch()
        rng = np.random.default_rng(12345)
        n, d = self.w.shape
        lo, hi = 1, 2 * self.q + 1
        qs = [rng.integers(lo, hi + 1, (8, d))]
        w = self.w.astype(np.int64)
        pair = np.abs(w[:, :-1] + w[:, 1:]).max(1)
        for u in np.argsort(-pair)[:8]:
            qs.append(np.where(w[u] > 0, hi, lo)[None, :])
            qs.append(np.where(w[u] < 0, hi, lo)[None, :])
        u8 = np.concatenate(qs).astype(np.uint8)
        t = 0.01
        got = self._kernel(torch.from_numpy(u8), t).to(torch.float64).numpy()
        acc = (u8.astype(np.float64) - (self.q + 1)) @ w.T.astype(np.float64)   # exact (< 2^53)
        scale = self.scale.numpy().astype(np.float64)
        bias = self.bias.numpy().astype(np.float64)
        want = acc * np.float64(np.float32(t)) * scale[None, :] + bias[None, :]
        tol = 2.0 ** -20 * (np.abs(acc * np.float64(np.float32(t)) * scale[None, :]) + np.abs(bias)[None, :])
        return bool(np.all(np.abs(got - want) <= tol))


@functools.lru_cache(maxsize=1)
def native_bfloat16() -> bool:
    """Whether the CPU multiplies bfloat16 in hardware (x86 AVX512-BF16 or AMX-BF16, Arm BF16).

    Read from the CPU flags in ``/proc/cpuinfo``; where that file does not exist (not
    Linux) the answer is True, the cascade's behaviour before ``matmul`` existed.
    """
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            words = set(fh.read().split())
    except OSError:
        return True
    return bool(words & {"avx512_bf16", "amx_bf16", "bf16"})
