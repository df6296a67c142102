"""The clean-trajectory propagation bound of BRACE's certificate (``bound="propagation"``).

``psi_s(i) >= sup {LS of z_s at B : d_H(D, B) <= i}`` and ``R_s(j) = sum_{i<j} psi_s(i)
>= sup ||z_s(B) - z_s(D)||`` (path argument), with ``psi_0 = R_0 = 0``. Around the private
centre ``c = z_{s-1}(D)`` with ``omega = R_{s-1}(i+1)``: ``core`` = records within
``r - omega`` (in every gate), ``outer`` = records within ``r + omega``; with
``kt = core - (i+1)`` (core records no replacement touched) the two gates share ``>= kt``
records and each has ``<= outer`` members, so by the total-variation coupling of their
uniform laws ``||Phi_B(c1) - Phi_B'(c2)|| <= (2r + psi_{s-1}(i)) (1 - kt / outer)``
(``2r + psi_{s-1}(i)`` when ``kt < 1``), capped at ``2 s r``. Monotonicity
``psi_s(i)(D) <= psi_s(i+1)(D')`` and ``R_s(j)(D) + ||z_s(D) - z_s(D')|| <= R_s(j+1)(D')``
follow by induction (the width at ``D'`` covers the width at ``D`` plus the centre shift, so
``core`` can only shrink and ``kt / outer`` only fall). Then, with ``c_k = 2r/max(1, m_t - k)``
and ``csum`` the Eq. (4) path sum at the public ``y_{t-1}``:
activation excluded for all of ``N_{k+1}(D)`` if ``||R_t(D)|| + R_t(k+1) + csum(k+1) <= tau``
(``A^(k) = c_k``), certain if ``||R_t(D)|| - R_t(k+1) - csum(k+1) > tau``
(``A^(k) = min{2r, psi_t(k)}``), else ``A^(k) = min{2r, max(c_k, psi_t(k) + tau)}``.
The certificate uses ``min`` of this and the annulus bound
(:mod:`fedmem.agent.brace.annulus`) (both sound, both
monotone, so the minimum is too); ``Certifier(bound="annulus")`` is the earlier, looser bound.
It is not App. B's exact branch enumeration: on activated steps it stays loose (it
compounds over steps and reaches ``2r`` by step 3-4 on the Sec. 6.1 bank).

:class:`PropagationBound` is the part of :class:`~fedmem.agent.brace.certificate.Certifier`
that runs this recursion; it reads and updates the certifier's ``_zc``, ``_psi`` and ``_R``
(and reads ``X``, ``p`` and ``K``).
"""

from __future__ import annotations

import numpy as np

from fedmem.agent.brace.annulus import SortedRows
from fedmem.agent.brace.lsr import sq_dists


class PropagationBound:
    """The clean-trajectory propagation recursion and its terms ``A^(k)``, a base of
    :class:`~fedmem.agent.brace.certificate.Certifier` (state ``_zc``, ``_psi``, ``_R``)."""

    def _clean_step(self, s: int) -> None:
        """Advance the clean-trajectory sensitivity recursion to step ``s`` (see the module
        docstring, "clean-trajectory propagation"): ``psi_s(i)``, ``R_s(j)`` and ``z_s(D)``."""
        r = self.p.r
        c = self._zc
        sq = sq_dists(self.X, c)
        sr = SortedRows(np.sqrt(sq))
        L = self.K + 2                                   # i = 0..K+1 (R_t(k+1) needs psi_t(0..K))
        omega = self._R[:, 1:L + 1]                      # R_{s-1}(i+1)
        tol = 1e-9 * max(r, 1.0)
        core = sr.count_le(r - omega - tol, -1).astype(np.float64)
        outer = sr.count_le(r + omega + tol, +1).astype(np.float64)
        kt = core - (np.arange(L)[None, :] + 1.0)        # core records no replacement touched
        delta = 2 * r + self._psi[:, :L]                 # diameter of the two gates' union
        f = np.where(kt >= 1, delta * (1.0 - kt / np.maximum(outer, 1.0)), delta)
        psi = np.minimum(f, 2 * s * r)
        self._psi = psi
        self._R = np.concatenate([np.zeros((psi.shape[0], 1)), np.cumsum(psi, axis=1)], axis=1)
        mask = sq <= r * r
        cnt = mask.sum(1)
        self._zc = np.where(cnt[:, None] > 0, (mask.astype(np.float64) @ self.X) / np.maximum(cnt, 1)[:, None], c)

    def _propagation_terms(self, k: np.ndarray, m: np.ndarray, a: np.ndarray):
        """``(A^(k), activation excluded)`` of the clean-trajectory propagation bound for the
        distances ``k``."""
        r, tau = self.p.r, self.p.threshold
        B = m.shape[0]
        psi_k = self._psi[:, k]
        Rk1 = self._R[:, k + 1]
        i = np.arange(int(k.max()) + 1)[None, :]
        csum = np.concatenate([np.zeros((B, 1)), np.cumsum(2 * r / np.maximum(1.0, m[:, None] - i), axis=1)],
                              axis=1)[:, k + 1]
        c = 2 * r / np.maximum(1.0, m[:, None] - k[None, :])
        Rn = np.linalg.norm(self._zc - a, axis=1)[:, None]       # ||R_t(D)||
        excluded = Rn + Rk1 + csum <= tau
        certain = Rn - Rk1 - csum > tau
        mixed = np.minimum(2 * r, np.maximum(c, psi_k + tau))
        return np.where(excluded, c, np.where(certain, np.minimum(2 * r, psi_k), mixed)), excluded
