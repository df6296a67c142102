"""The default projection of DP-MIND (Algorithm 3, line 5): :class:`CascadeProjector`, a
bfloat16 candidate pass, an exact float64 re-rank and a certificate that proves the answer
equal to the float64 exact argmin; :func:`native_bfloat16` tells whether the CPU has
bfloat16 matrix units (``matmul="auto"``).
"""

from __future__ import annotations

import functools

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
        self.matmul = ("bfloat16" if native_bfloat16() else "float32") if matmul == "auto" else matmul
        self.fallbacks = 0   # queries whose certificate failed and that were searched exhaustively
        self.projected = 0   # queries projected so far
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

    def project(self, points) -> np.ndarray:
        torch = load_torch()
        x = torch.from_numpy(as_points(self.table, points))
        out = torch.empty(x.shape[0], dtype=torch.int64)
        with torch_threads(self.threads):
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
        return ids.numpy()

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
        best = exact.min(1, keepdim=True).values
        pick = torch.where(exact == best, cols, torch.iinfo(torch.int64).max).amin(1)
        result = self._ids[pick]
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
            ex = self._sq[col] - 2.0 * (self._mat[col].to(torch.float64) * x64[bad][row]).sum(1)
            k, big = bad.numel(), torch.iinfo(torch.int64).max
            rmin = torch.full((k,), float("inf"), dtype=torch.float64).scatter_reduce(0, row, ex, "amin")
            tid = torch.where(ex == rmin[row], self._ids[col], big)
            result[bad] = torch.full((k,), big, dtype=torch.int64).scatter_reduce(0, row, tid, "amin")
        return result


MATMULS = ("auto", "bfloat16", "float32")


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
