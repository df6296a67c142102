"""Agent integration: a client holding a BRACE-protected memory bank (papers/001).

:class:`BraceMemory` keeps the private bank and answers :meth:`recall` with the released
endpoint ``Y_T`` of one BRACE trajectory started at the query. Before anything is
computed from the bank for a query, one ``ApproxDpEvent(epsilon, delta, "brace")`` is
booked in the (durable) accountant; if the budget refuses, ``BudgetExceeded`` propagates
and nothing is released. A crash after booking loses nothing booked (fail closed). The
clean trajectory never leaves this object.

With ``sampling="secure"`` the released points lie on the public grid
``params.secure_grid(bank size)`` (fixed by public parameters and the public bank size,
never by the data-dependent ``sigma_t``; see :mod:`fedmem.agent.brace.mechanism`).
"""

from __future__ import annotations

import numpy as np

from fedmem import _validate as V
from fedmem.agent.brace.mechanism import NoiseSource, brace_run
from fedmem.agent.brace.params import BraceParams
from fedmem.dp import Accountant


class BraceMemory:
    """A private LSR memory bank that releases BRACE retrievals under an accountant."""

    def __init__(self, bank, params: BraceParams, accountant: Accountant, rng, *, sampling: str = "secure",
                 label: str = "brace recall"):
        if not isinstance(params, BraceParams):
            raise TypeError(f"params must be a BraceParams. Found {type(params).__name__}.")
        if not params.dp_guarantee:
            raise ValueError(f"params.gamma_mode must be 'eq8' for a private memory (the paper's gamma = 0.25 "
                             f"violates Eq. (8): not a DP guarantee). Found {params.gamma_mode!r}.")
        if not isinstance(accountant, Accountant):
            raise TypeError(f"accountant must be a fedmem.dp.Accountant. Found {type(accountant).__name__}.")
        self._bank = V.finite_array("bank", bank, ndim=2, dim=params.d)
        V.rng_check("rng", rng)
        if sampling not in ("fast", "secure"):
            raise ValueError(f"sampling must be 'fast' or 'secure'. Found {sampling!r}.")
        self.params = params
        self.accountant = accountant
        self._rng = rng
        self.sampling = sampling
        self.label = label
        self.recalls = 0

    @property
    def size(self) -> int:
        return self._bank.shape[0]

    def recall_trajectory(self, q) -> np.ndarray:
        """Released ``(Y_1, ..., Y_T)`` of shape ``(T, d)``; books before computing."""
        q = V.finite_array("q", q, ndim=1, dim=self.params.d)
        self.accountant.book(self.params.event(), label=f"{self.label} #{self.recalls}")
        self.recalls += 1
        run = brace_run(self._bank, q[None, :], self.params,
                        NoiseSource(rng=self._rng, sampling=self.sampling))
        return run.Y[0].copy()

    def recall(self, q) -> np.ndarray:
        """The released endpoint ``Y_T`` (the retrieved memory pattern)."""
        return self.recall_trajectory(q)[-1]
