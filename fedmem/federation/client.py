"""``MemoryClient``: the small retrieval API agent code uses.

A client is obtained from :meth:`Federation.connect`, which gives it a **principal**
identity: every budget (epsilon and support bits) is charged to that principal and to
the federation's totals, whatever labels the caller attaches. papers/003, Operational
Effect: a refused query surfaces as :class:`~fedmem.errors.SupportPrivacyViolation`, a
hard retrieval failure meaning "no memory available for this query", never as an empty
result; conflating the two makes agents re-query and silently compose epsilon. The
refusal is uniform (constant text, no reasons): the client learns nothing from it but
the fact, which is decided from public state only. A deliberate retry may say so
(``retry_of``); silent or not, every answer is booked to the principal.

The principal is a **capability**: ``Federation.connect()`` returns a client
holding a :class:`~fedmem.federation.gateway.Principal` (public random label + secret
token). Every query path checks it with the gateway: a client built on a forged, guessed
or merely known label gets the uniform refusal on every query (booked to the operator's
audit as ``unissued_principal``), and reads 0 as its spend.

Everything a client can see is the threat model's observable surface: the returned
:class:`~fedmem.federation.engine.Response`, the exception, and timing. The
simulation runs in one process, so nothing stops Python code from reaching into the
federation object; the client itself reaches it only through :class:`CapabilityService`.
"""

from __future__ import annotations

import abc

import numpy as np

from fedmem.errors import SupportPrivacyViolation


class CapabilityService(abc.ABC):
    """What a :class:`MemoryClient` may call on its federation, with its capability: retrieval
    and its own spend. :class:`~fedmem.federation.engine.Federation` implements it (the client
    module does not import the engine: no cycle)."""

    @abc.abstractmethod
    def retrieve(self, q, family: str | None = None, retry_of: int | None = None, *, principal=None):
        """One query: the response, or raises the uniform ``SupportPrivacyViolation``."""

    @abc.abstractmethod
    def retrieve_many(self, qs, families=None, retry_of=None, *, principal=None) -> list:
        """A batch: one response or uniform refusal per query."""

    @abc.abstractmethod
    def spent(self, capability) -> float:
        """The epsilon booked to the holder of ``capability`` (0 if unissued)."""

    @abc.abstractmethod
    def support_bits_spent(self, capability) -> float:
        """The support-channel bits booked to the holder of ``capability`` (0 if unissued)."""


class MemoryClient:
    """One agent's handle on a federation, with the principal id the federation issued."""

    def __init__(self, federation, *, principal, family: str | None = None):
        if not isinstance(federation, CapabilityService):
            raise TypeError(f"federation must be a Federation. Found {type(federation).__name__}.")
        if not isinstance(principal, str) or not principal:
            raise ValueError("principal must be a capability issued by Federation.connect() (a Principal or its "
                             f"token). Found {type(principal).__name__}.")
        self._federation = federation
        self.principal = principal
        self.family = family
        self.responses: list = []
        self.refusals: list[SupportPrivacyViolation] = []

    def retrieve(self, q, *, family: str | None = None, retry_of: int | None = None):
        """Released memory for ``q``, or raises ``SupportPrivacyViolation`` (no memory available)."""
        try:
            r = self._federation.retrieve(np.asarray(q, dtype=np.float64), family=family or self.family,
                                          retry_of=retry_of, principal=self.principal)
        except SupportPrivacyViolation as exc:
            self.refusals.append(exc)
            raise
        self.responses.append(r)
        return r

    def retrieve_many(self, qs, families=None, retry_of=None) -> list:
        """Batch of queries; one entry per query: a Response or the uniform refusal (not raised)."""
        return self._federation.retrieve_many(qs, families, retry_of, principal=self.principal)

    @property
    def epsilon_spent(self) -> float:
        """This principal's booked epsilon at the federation's delta."""
        return self._federation.spent(self.principal)

    @property
    def support_bits_spent(self) -> float:
        """This principal's booked support-channel bits."""
        return self._federation.support_bits_spent(self.principal)
