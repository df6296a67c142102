"""BRACE's sensitivity certificate Delta_bar_t (papers/001 Step 5, Def. 2, Eq. (7), App. B).

For a fixed released history ``y_<t`` the query of step t is
``Q_t(B) = Pi_{B(y_{t-1}, r)}(a_t + H_t R_t)`` with ``a_t = Phi_B(y_{t-1})``,
``R_t = z_t(B) - a_t`` and ``H_t = 1{||R_t|| > tau}``, ``tau = sqrt(kappa T) r``.
The certificate must (i) dominate the local sensitivity of ``Q_t`` at the private bank
and (ii) change by at most a factor ``e^gamma`` between neighbouring banks (Eq. (6)); the
Gaussian calibration of App. C.2 needs nothing else.

How fedmem builds it (always computable, never "unresolved")
------------------------------------------------------------
Following Nissim, Raskhodnikova and Smith (2007, Sec. 3) we compute, for every
``k = 0..K``, a bound ``A^(k)(D) >= sup {LS(B) : d_H(D, B) <= k}`` and release::

    Delta_bar_t = max{ 2r/n, max_k e^{-gamma k} A^(k)(D) }                       (Eq. (7))

which is Eq. (7) with each inner supremum replaced by ``A^(k)``. It is a valid smooth
bound because (a) ``A^(0) >= LS`` and (b) ``A^(k)(D) <= A^(k+1)(D')`` for neighbours
``D ~ D'`` (both are proved below and checked by ``tests/test_brace.py``); (b) gives
``Delta_bar_t(D) <= e^gamma Delta_bar_t(D')`` term by term. Terms with
``e^{-gamma k} 2r <= 2r/n`` never exceed the floor, so ``K = min(n, ceil(ln n / gamma))``.

``A^(k)`` has two branches.

* **Count branch** (Step 5, first case). If no bank within distance ``k + 1`` of ``D``
  can activate the correction at step t, every bank within ``k`` and all of its
  neighbours have ``Q_t = a_t``, and Eq. (4) gives ``LS(B) <= 2r / max(1, |I(B, y_{t-1})|)
  <= c_k = 2r / max(1, m_t - k)`` with ``m_t = |I(D, y_{t-1})|``. When activation is
  impossible for every bank (``(2t + 1) r <= tau``: ``||R_t|| <= ||z_t - y_{t-1}|| + r``,
  ``||z_t - q|| <= t r`` and ``||y_{t-1} - q|| <= t r``) the envelope has the closed form
  ``2r max{1/m_t, e^{-gamma (m_t - 1)}}`` (the log of ``e^{-gamma k}/(m-k)`` is convex).

* **Activated / uncertain branch** (replaces the CorrectedCountSearch of App. B). With
  ``g_{k+1} >= sup ||R_t(B)||`` over banks within ``k + 1``: when both ``B`` and its
  neighbour activate, ``||Q_t(B) - Q_t(B')|| <= ||R_t(B)|| + ||a_t(B) - a_t(B')|| +
  ||R_t(B')|| <= 2 g_{k+1} + c_k`` (projection is non-expansive); when only one does,
  the bound is ``g_{k+1} + c_k``; always ``<= 2r`` (both queries lie in ``B(y_{t-1}, r)``).
  So ``A^(k) = min{2r, 2 g_{k+1} + c_k}``.

``g_j`` bounds the clean-vs-released gate discrepancy using only *public* centres (the
annulus bound ``G(j, w)`` and the recursion ``W_s(j)``; derived in
:mod:`fedmem.agent.brace.annulus`, which holds them). Where fedmem is more
conservative than the paper: the branch search of App. B would give the exact local
sensitivity on activated steps; this bound can be larger (it is what makes it always
computable in ``O(T K n log n)``). Where it is less conservative: the count branch asks
for non-activation at step ``t`` only, not at all ``s <= t`` as Step 5 states; this is
still valid because ``Q_t`` depends on ``H_t`` alone for a fixed history.

Clean-trajectory propagation (a sound bound in place of CorrectedCountSearch)
---------------------------------------------------------------------------------------
A second activated-branch bound propagates a sensitivity ``psi_s(i)`` of the clean
trajectory ``z_s`` along the steps; it is derived in :mod:`fedmem.agent.brace.propagation`,
which holds it. The certificate uses ``min`` of it and the annulus bound (both sound, both
monotone, so the minimum is too); ``Certifier(bound="annulus")`` is the earlier, looser bound.

CorrectedCountSearch (App. B) in box form (the default, ``bound="all"``)
---------------------------------------------------------------------------------
App. B enumerates, for a replacement ``B' = B^{j <- x}``, the clean and released gate
memberships of every record at every step (``beta^I_s``, ``beta^J_s``), the activation
``H'_s`` and the projection case, and takes the supremum of ``||Q_t(B) - Q_t(B')||`` over the
feasible branches. fedmem runs that enumeration over *sets* of clean centres instead of
single points, which also covers banks ``j`` replacements away (what Eq. (7) needs):
:func:`clean_boxes` computes boxes ``Z_s(j)`` holding the clean ``z_s(B)`` of every bank
within ``j`` replacements, starting from ``Z_0 = {q}``. With the previous box ``C``, each
record's clean membership is sure (within ``r`` of all of ``C``), impossible (of none) or
undetermined; each replaced record may drop a sure member and enter anywhere within
``r`` of ``C``; an empty gate leaves the centre in ``C``. :func:`max_gate_mean` maximises
each coordinate of the gate mean over all these branches exactly (a 0-1 fractional
programme; Dinkelbach's iteration, with a fallback to the trivial bound if it has not
converged). ``Z_s(0)`` is the point ``z_s(D)``; for small ``j`` the boxes stay small where
the dynamics are stable and grow where a gate boundary crosses dense memories (there the
true local sensitivity is large too: on the unstable Sec. 6.1 instance a single replacement
moves ``Q_4`` by >= 1.5 = 0.94 * 2r in a brute-force search). The released memberships
``J'_s`` enter through the Eq. (4) path sum at the public ``y_{t-1}``: ``a_t`` of a bank within
``k + 1`` lies within ``csum(k + 1)`` of ``a_t(D)``. With ``pair = sup ||u - v||`` over
``u in Z_t(k)``, ``v in Z_t(k + 1)`` (``B`` within ``k`` and its neighbour ``B'``), the branches give::

    activation excluded on all of Z_t(k+1) x a-ball:   A^(k) = c_k
    activation certain:                                A^(k) = min{2r, pair}
    otherwise:                                         A^(k) = min{2r, max(c_k, pair + tau)}

(both active: projection onto the same ball is non-expansive; one active: the inactive
query ``a_t(B')`` lies in the ball and ``||z_t(B') - a_t(B')|| <= tau``). Soundness: every
replacement is one of the enumerated branches. Smoothness: a branch of ``(C, D, j)`` is a
branch of ``(C', D', j + 1)`` whenever ``C`` lies inside ``C'`` (the record in which ``D'``
differs is one more dropped member and one more entering record), so ``Z_s(j)(D)`` lies
inside ``Z_s(j + 1)(D')`` by induction, ``pair``, the ``||R_t||`` range and ``c_k`` grow from
``(D, k)`` to ``(D', k + 1)``, and ``A^(k)(D) <= A^(k + 1)(D')``. The box form relaxes App. B's
point-wise recursion (coordinates are maximised separately; memberships are decided for
the whole box), so it is an upper bound of the branch supremum, never below it; it costs
``O(T K n d)`` per start and step (independent of the noise), and is combined with the two
bounds above by ``min``.

Modules: :mod:`.envelope` (horizon ``K``, the count and Eq. (7) envelopes),
:mod:`.annulus` (the annulus bound), :mod:`.propagation` (the clean-trajectory bound),
:mod:`.brute_force` (the brute-force local-sensitivity audit); this module keeps the box
CorrectedCountSearch, :class:`Certifier`, which combines the bounds, and
:func:`certificate_terms`, and re-exports the names that moved.
"""

from __future__ import annotations

import numpy as np

from fedmem.agent.brace.annulus import AnnulusBound, SortedRows, gate_shift_bound
from fedmem.agent.brace.brute_force import brute_force_local_sensitivity, query_point
from fedmem.agent.brace.envelope import activation_impossible, count_envelope, horizon, smooth_envelope
from fedmem.agent.brace.lsr import phi
from fedmem.agent.brace.params import BraceParams
from fedmem.agent.brace.propagation import PropagationBound

__all__ = [
    "BOUNDS", "BOX_CHUNK", "BOX_MAX_DIM", "BOX_MAX_J", "CERTIFICATES", "Certifier", "SortedRows",
    "activation_impossible", "brute_force_local_sensitivity", "certificate_terms", "clean_boxes",
    "count_envelope", "gate_shift_bound", "horizon", "max_gate_mean", "query_point", "smooth_envelope",
]

CERTIFICATES = ("brace", "raw_count")
# "all" (default) = the box CorrectedCountSearch (App. B, below), the clean-trajectory
# propagation and the annulus bound, combined by min; "both" = the certificate before the
# search (propagation and annulus); "annulus" = the earlier, looser bound alone.
BOUNDS = ("all", "both", "box", "propagation", "annulus")
_USES = {"all": ("box", "propagation", "annulus"), "both": ("propagation", "annulus"), "box": ("box",),
         "propagation": ("propagation",), "annulus": ("annulus",)}


# ------------------------------------------------------------------ CorrectedCountSearch (App. B), box form
def max_gate_mean(v: np.ndarray, inner: np.ndarray, opt: np.ndarray, j: np.ndarray, top: np.ndarray,
                  hi: np.ndarray) -> np.ndarray:
    """Largest coordinate of ``Phi_B(c)`` over every branch the search keeps, exactly.

    ``v`` (n,) are the records' coordinates sorted ascending; ``inner`` / ``opt`` (..., n)
    mark records in the gate at every / some centre of the box (sure / possible membership,
    ``beta = 1`` / undetermined); ``j`` (...,) replacements, each of which may drop one sure
    record and add one record anywhere within r of the box (coordinate at most
    ``top = hi + r``); ``hi`` the box's upper coordinate (an empty gate leaves the centre).
    The maximum of the mean over these branches is a 0-1 fractional programme, solved
    exactly by Dinkelbach's iteration: at ratio ``lam`` keep the possible records above
    ``lam``, drop the (at most ``j``) lowest sure records below it, add the ``j`` records at
    ``top``; repeat until the ratio stops rising (each round is a few prefix-sum look-ups,
    ``v`` being sorted). An iteration that has not converged, or whose optimality check
    fails, falls back to ``top`` (an upper bound), so the result is never below the true
    maximum.
    """
    lead = inner.shape[:-1]
    n = v.shape[0]
    inner = inner.reshape(-1, n)
    opt = opt.reshape(-1, n)
    M = inner.shape[0]
    jf = np.broadcast_to(j, lead).reshape(M).astype(np.float64)
    top = np.broadcast_to(top, lead).reshape(M)
    hi = np.broadcast_to(hi, lead).reshape(M)
    CI = np.zeros((M, n + 1))                                  # prefix counts / sums along sorted v
    VI, CO, VO = np.zeros_like(CI), np.zeros_like(CI), np.zeros_like(CI)
    CI[:, 1:] = np.cumsum(inner, axis=1, dtype=np.int32)
    VI[:, 1:] = np.cumsum(inner * v, axis=1)
    CO[:, 1:] = np.cumsum(opt, axis=1, dtype=np.int32)
    VO[:, 1:] = np.cumsum(opt * v, axis=1)
    rows = np.arange(M)
    cnt_in, tot_in, cnt_op, tot_op = CI[:, n], VI[:, n], CO[:, n], VO[:, n]
    flat = (CI + (rows * (n + 1.0))[:, None]).ravel()     # rows' prefix counts, laid end to end

    def parts(lam):
        below = np.searchsorted(v, lam, side="left")       # v < lam
        upto = np.searchsorted(v, lam, side="right")       # v <= lam
        oc, os_ = cnt_op - CO[rows, upto], tot_op - VO[rows, upto]
        drops = np.minimum(jf, CI[rows, below])
        pos = np.searchsorted(flat, drops + rows * (n + 1.0), side="left") - rows * (n + 1)
        ds = VI[rows, pos]
        return tot_in - ds + os_ + jf * top, cnt_in - drops + oc + jf

    none = (cnt_in == 0) & (jf == 0)
    lam = np.where(none, -np.inf, (tot_in + jf * top) / np.maximum(cnt_in + jf, 1.0))
    lam = np.where(none, np.max(np.where(opt, v, -np.inf), axis=1), lam)   # one possible record alone
    live = ~none
    for _ in range(200):
        S, N = parts(np.where(live, lam, 0.0))
        new = np.where(live & (N > 0), S / np.maximum(N, 1.0), lam)
        if not np.any(new > lam):
            break
        lam = np.maximum(lam, new)
    else:
        lam = np.where(none, lam, top)
    S, N = parts(np.where(live, lam, 0.0))
    gain = S - np.where(live, lam, 0.0) * N                 # max over branches of sum(v - lam): <= 0 at the optimum
    lam = np.where(none | (gain <= 1e-12 * (1.0 + np.abs(top)) * np.maximum(N, 1.0)), lam, top)
    return np.where(cnt_in <= jf, np.maximum(lam, hi), lam).reshape(lead)


def clean_boxes(X: np.ndarray, q: np.ndarray, r: float, T: int, J: int) -> tuple[np.ndarray, np.ndarray]:
    """CorrectedCountSearch in box form: ``Z_s(j) = [lo, hi]`` contains the clean ``z_s(B)`` of
    every bank ``B`` within ``j`` replacements of ``X``, for ``s = 0..T``, ``j = 0..J-1``.

    Returns ``(lo, hi)`` of shape ``(T + 1, U, J, d)`` for the starts ``q`` (U, d). The
    recursion enumerates App. B's membership branches record by record: with the
    previous box ``C``, a record is a sure member when it is within ``r`` of every centre
    of ``C``, a possible member when within ``r`` of some centre; each replaced record drops
    a sure member and adds one anywhere within ``r`` of ``C``. :func:`max_gate_mean` takes
    the exact maximum of each coordinate over these branches, so ``Z_s(j)`` is sound; for
    ``j = 0`` the box stays the single point ``z_s(X)``. Intersected with the public ball
    bound ``||z_s - q|| <= s r``. Monotone: ``Z_s(j)(D)`` lies inside ``Z_s(j + 1)(D')`` for
    neighbours (a branch of ``(C, D, j)`` is a branch of ``(C', D', j + 1)`` when ``C`` lies
    inside ``C'``: the differing record is one more drop and one more addition).
    """
    X = np.asarray(X, dtype=np.float64)
    q = np.atleast_2d(np.asarray(q, dtype=np.float64))
    U, d = q.shape
    n = X.shape[0]
    chunk = max(1, BOX_CHUNK // max(1, J * n))
    if U > chunk:
        parts = [clean_boxes(X, q[u:u + chunk], r, T, J) for u in range(0, U, chunk)]
        return np.concatenate([p_[0] for p_ in parts], axis=1), np.concatenate([p_[1] for p_ in parts], axis=1)
    j = np.broadcast_to(np.arange(J), (U, J))
    lo = np.repeat(q[:, None, :], J, axis=1)
    hi = lo.copy()
    los, his = [lo], [hi]
    r2lo, r2hi = r * r * (1 - 1e-12), r * r * (1 + 1e-12)
    orders = [np.argsort(X[:, e], kind="stable") for e in range(d)]
    for s in range(1, T + 1):
        far2 = np.zeros((U, J, n))
        near2 = np.zeros((U, J, n))
        for e in range(d):
            xe = X[None, None, :, e]
            le, he = lo[:, :, e:e + 1], hi[:, :, e:e + 1]
            far2 += np.maximum(np.abs(xe - le), np.abs(xe - he)) ** 2
            near2 += np.maximum(np.maximum(le - xe, xe - he), 0.0) ** 2
        inner = far2 <= r2lo          # (U, J, n)
        pot = near2 <= r2hi
        opt = pot & ~inner
        new_lo, new_hi = np.empty_like(lo), np.empty_like(hi)
        for e in range(d):
            o = orders[e]
            v = X[o, e]
            inn, op = inner[..., o], opt[..., o]
            new_hi[..., e] = max_gate_mean(v, inn, op, j, hi[..., e] + r, hi[..., e])
            vn = -v[::-1]
            new_lo[..., e] = -max_gate_mean(vn, inn[..., ::-1], op[..., ::-1], j, -lo[..., e] + r, -lo[..., e])
        lo = np.maximum(new_lo, q[:, None, :] - s * r)
        hi = np.minimum(new_hi, q[:, None, :] + s * r)
        los.append(lo)
        his.append(hi)
    return np.stack(los), np.stack(his)


def _box_far(lo, hi, p):
    """Distance from ``p`` to the farthest point of the box."""
    return np.sqrt(np.sum(np.maximum(np.abs(hi - p), np.abs(p - lo)) ** 2, axis=-1))


def _box_near(lo, hi, p):
    """Distance from ``p`` to the box (0 inside)."""
    return np.sqrt(np.sum(np.maximum(np.maximum(lo - p, p - hi), 0.0) ** 2, axis=-1))


BOX_MAX_DIM = 8      # the box search runs for d <= 8 (a box's diagonal grows like sqrt(d), its cost like d)
BOX_MAX_J = 128      # boxes for j = 0..127 replacements; farther terms use the other bounds (still monotone)
BOX_CHUNK = 1 << 22  # starts x distances x records per vectorised block of the box recursion


class Certifier(AnnulusBound, PropagationBound):
    """Per-step certificates for a batch of BRACE runs on one bank ``X``.

    Call :meth:`step` once per step ``t = 1..T`` with the released ``Y_{t-1}`` and the
    gate statistics at it. ``mode="raw_count"`` is the deliberately broken variant used
    by the privacy tests: it always takes the count branch, even where the correction
    can activate (its envelope is still Eq. (7) of the count bound).

    The terms ``A^(k)`` are evaluated in blocks of ``block`` distances, and evaluation
    stops once ``e^{-gamma k} 2r`` (an upper bound on every later term) is at most the
    running maximum of every row, so the envelope is exact.
    """

    def __init__(self, X: np.ndarray, q: np.ndarray, params: BraceParams, mode: str = "brace",
                 keep_terms: bool = False, block: int = 128, bound: str = "all"):
        if mode not in CERTIFICATES:
            raise ValueError(f"certificate must be one of {CERTIFICATES}. Found {mode!r}.")
        if bound not in BOUNDS:
            raise ValueError(f"bound must be one of {BOUNDS}. Found {bound!r}.")
        self.bound = bound
        self.uses = _USES[bound]
        self.X = X
        self.n = X.shape[0]
        self.q = np.atleast_2d(q)
        self.p = params
        self.mode = mode
        self.needs_search = mode == "brace" and not activation_impossible(params)
        self.K = horizon(self.n, params.gamma)
        self.block = block
        self._stats: list[tuple] = []   # per past step s: (sorted dists at y_{s-1}, m_s, a_s, y_{s-1})
        self._ys: list[np.ndarray] = []  # released y_1, y_2, ...
        self.keep_terms = keep_terms
        self.last_terms: np.ndarray | None = None  # A^(k), k = 0..K, of the last step
        # clean-trajectory propagation: z_s(D), psi_s(i) (i = 0..K+1), R_s(j) (j = 0..K+2)
        B = self.q.shape[0]
        self._zc = self.q.astype(np.float64).copy()
        self._psi = np.zeros((B, self.K + 2))
        self._R = np.zeros((B, self.K + 3))
        self._boxes = None
        if self.needs_search and "box" in self.uses and X.shape[1] <= BOX_MAX_DIM:
            uq, self._box_rows = np.unique(self.q, axis=0, return_inverse=True)
            self._box_rows = self._box_rows.ravel()
            self._box_J = min(self.K + 3, BOX_MAX_J)
            self._boxes = clean_boxes(X, uq, params.r, params.T, self._box_J)   # Z_s(j), j < box_J

    def _box_terms(self, t: int, k: np.ndarray, m: np.ndarray, a: np.ndarray):
        """``(A^(k), activation excluded)`` of the box CorrectedCountSearch for the distances ``k``.

        ``Z(k)``, ``Z(k+1)``: the boxes of the clean ``z_t`` over banks within ``k`` / ``k + 1``;
        ``a_t`` of those banks lies within ``csum(k+1)`` of ``a_t(D)`` (Eq. (4) path sum at the
        public ``y_{t-1}``). For ``B`` within ``k`` and a neighbour ``B'`` (within ``k + 1``): both
        inactive -> ``c_k``; both active -> ``||z_t(B) - z_t(B')|| <= pair`` (sup over
        ``Z(k) x Z(k+1)``; projection is non-expansive); one active -> ``pair + tau`` (the
        inactive one has ``||R|| <= tau`` and its ``a_t`` lies in the ball). Activation is
        excluded / certain when the range of ``||R_t|| = ||z_t - a_t||`` over ``Z(k+1)`` and
        the ``a``-ball lies below / above ``tau``."""
        r, tau = self.p.r, self.p.threshold
        lo, hi = self._boxes
        rows = self._box_rows
        have = k + 1 < self._box_J                    # beyond BOX_MAX_J: no box term (A = 2r, not excluded)
        kk = np.where(have, k, 0)
        lo0, hi0 = lo[t][rows][:, kk], hi[t][rows][:, kk]
        lo1, hi1 = lo[t][rows][:, kk + 1], hi[t][rows][:, kk + 1]
        pair = np.sqrt(np.sum(np.maximum(hi1 - lo0, hi0 - lo1) ** 2, axis=-1))
        B = m.shape[0]
        i = np.arange(int(k.max()) + 1)[None, :]
        csum = np.concatenate([np.zeros((B, 1)), np.cumsum(2 * r / np.maximum(1.0, m[:, None] - i), axis=1)],
                              axis=1)[:, k + 1]
        c = 2 * r / np.maximum(1.0, m[:, None] - k[None, :])
        ap = a[:, None, :]
        excluded = _box_far(lo1, hi1, ap) + csum <= tau
        certain = _box_near(lo1, hi1, ap) - csum > tau
        A = np.where(excluded, c, np.where(certain, np.minimum(2 * r, pair),
                                           np.minimum(2 * r, np.maximum(c, pair + tau))))
        return np.where(have, A, 2 * r), excluded & have

    def step(self, t: int, y_prev: np.ndarray, sq: np.ndarray, m: np.ndarray, a: np.ndarray):
        """Certificate for step ``t``. Returns ``(delta_bar (B,), uncertain (B,))``.

        ``uncertain[b]`` is True when activation could not be excluded for all
        neighbours of the private bank (the count bound was not usable at ``k = 0``).
        """
        if not 1 <= t <= self.p.T:
            raise ValueError(f"t must be in 1..T = {self.p.T}. Found {t!r}.")
        r, gamma = self.p.r, self.p.gamma
        floor = 2 * r / self.n
        if not self.needs_search:
            if self.keep_terms:
                k = np.arange(self.K + 1)[None, :]
                self.last_terms = 2 * r / np.maximum(1.0, m[:, None] - k)
            S = count_envelope(m, r, gamma)
            return np.maximum(floor, S), np.zeros(m.shape[0], dtype=bool)
        if t >= 2:
            self._ys.append(y_prev)
        if "propagation" in self.uses:
            self._clean_step(t)
        sorted_d = SortedRows(np.sqrt(sq))
        B = m.shape[0]
        S = np.full(B, floor)
        uncertain = np.zeros(B, dtype=bool)
        terms = []
        for k0 in range(0, self.K + 1, self.block):
            if not self.keep_terms and np.all(2 * r * np.exp(-gamma * k0) <= S):
                break
            k = np.arange(k0, min(k0 + self.block, self.K + 1))
            c = 2 * r / np.maximum(1.0, m[:, None] - k[None, :])
            A = np.full((B, k.size), 2 * r)
            safe = np.zeros((B, k.size), dtype=bool)
            if "annulus" in self.uses:
                g = gate_shift_bound(sorted_d, m, self._w(k + 1), r, k + 1)   # g_{k+1}
                safe = g <= self.p.threshold
                A = np.where(safe, c, np.minimum(2 * r, 2 * g + c))
            if "propagation" in self.uses:
                P, excl = self._propagation_terms(k, m, a)
                safe = safe | excl
                A = np.minimum(A, P)
            if self._boxes is not None:
                P, excl = self._box_terms(t, k, m, a)
                safe = safe | excl
                A = np.minimum(A, P)
            S = np.maximum(S, np.max(A * np.exp(-gamma * k)[None, :], axis=1))
            if k0 == 0:
                uncertain = ~safe[:, 0]
            if self.keep_terms:
                terms.append(A)
        if self.keep_terms:
            self.last_terms = np.concatenate(terms, axis=1)
        self._stats.append((sorted_d, m, a, y_prev))
        return S, uncertain


def certificate_terms(X: np.ndarray, q: np.ndarray, ys: np.ndarray, params: BraceParams,
                      mode: str = "brace", bound: str = "all") -> tuple[np.ndarray, float]:
    """``(A^(k) for k = 0..K, Delta_bar_t)`` at step ``t = len(ys)`` for the fixed history
    ``ys = (y_0 = q, ..., y_{t-1})`` (one bank; used by the audits)."""
    cert = Certifier(X, np.asarray(q, dtype=np.float64)[None, :], params, mode=mode, keep_terms=True, bound=bound)
    db = None
    for t in range(1, ys.shape[0] + 1):
        y = ys[t - 1][None, :]
        a, m, sq = phi(X, y, params.r)
        db, _ = cert.step(t, y, sq, m, a)
    return cert.last_terms[0], float(db[0])


