"""``MemoryClient``: the small retrieval API agent code uses.

papers/003, Operational Effect: a refused query surfaces as
:class:`~fedmem.errors.SupportPrivacyViolation`, a hard retrieval failure meaning "no
memory available for this query", never as an empty result; conflating the two makes
agents re-query and silently compose epsilon. The client therefore has no "maybe" path:
:meth:`MemoryClient.retrieve` returns a :class:`~fedmem.federation.engine.Response` or
raises. A deliberate retry must say so (``retry_of``), so that the gateway composes it
with the original.
"""

from __future__ import annotations

import numpy as np

from fedmem.errors import SupportPrivacyViolation
from fedmem.federation.engine import Federation, Response


class MemoryClient:
    """One agent's handle on a :class:`Federation` (default query family ``family``)."""

    def __init__(self, federation: Federation, *, family: str | None = None):
        if not isinstance(federation, Federation):
            raise TypeError(f"federation must be a Federation. Found {type(federation).__name__}.")
        self.federation = federation
        self.family = family
        self.responses: list[Response] = []
        self.refusals: list[SupportPrivacyViolation] = []

    def retrieve(self, q, *, family: str | None = None, retry_of: int | None = None) -> Response:
        """Released memory for ``q``, or raises ``SupportPrivacyViolation`` (no memory available)."""
        try:
            r = self.federation.retrieve(np.asarray(q, dtype=np.float64), family=family or self.family,
                                         retry_of=retry_of)
        except SupportPrivacyViolation as exc:
            self.refusals.append(exc)
            raise
        self.responses.append(r)
        return r

    @property
    def epsilon_spent(self) -> float:
        """Accountant total at the federation's delta (everything booked so far)."""
        return self.federation.accountant.spent(self.federation.config.delta)
