"""Named exceptions for fedmem's domain failures.

Bad parameters raise the built-in ``ValueError``/``TypeError``; these classes are for
failures of the privacy machinery itself, which callers must be able to tell apart from
"nothing found".
"""

from __future__ import annotations


class FedmemError(Exception):
    """Base class of fedmem's domain errors."""


class BudgetExceeded(FedmemError):
    """A booking would push a ledger or accountant past its cap; nothing was booked."""


class SupportPrivacyViolation(FedmemError):
    """The federation refused a query: "no memory available for this query".

    This is never an empty result. What an agent receives is identical for every refusal
    (constant text, only the public ``query_id``), so a refusal carries no information
    about the private records; the reasons are in the operator's audit log
    (``Federation.audit``), never in the exception.
    """

    def __init__(self, message: str = "no memory available for this query", *, query_id: int | None = None):
        super().__init__(message)
        self.query_id = query_id


class ScenarioError(FedmemError):
    """A scenario file is invalid. ``problems`` holds every (location, message) found."""

    def __init__(self, problems: list[tuple[str, str]]):
        self.problems = list(problems)
        lines = [f"{loc}: {msg}" for loc, msg in self.problems]
        n = len(lines)
        head = f"{n} problem{'s' if n != 1 else ''} in scenario:"
        super().__init__("\n".join([head, *("  - " + s for s in lines)]))


class MpcFailure(FedmemError):
    """The secure computation did not complete (a compute party died, timed out or raised).

    No output of the failed batch reached the caller (the parties may have opened some of
    it among themselves before failing); callers must fail closed (release nothing).
    """


class ContractViolation(FedmemError):
    """A DP-MemView configuration or operation breaks the interface contract (C1-C6).

    Raised instead of running an interface whose transcript would not be B_a-DP; an
    ablation that reproduces such a failure must name it with ``unsafe_ablation=``.
    """


class FederationFault(FedmemError):
    """A shard host or compute party died or timed out mid-query.

    The query failed closed: nothing was released for it, and nothing was booked unless a
    channel had already been emitted (``booked`` lists those bookings).
    """

    def __init__(self, message: str, *, booked: tuple = ()):
        super().__init__(message)
        self.booked = tuple(booked)
