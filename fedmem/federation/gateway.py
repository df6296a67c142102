"""Gateway: admission control at the aggregation boundary (papers/003, Decision Boundary).

"Acceptance is not the default; it is the outcome of a positive check on the support
channel." For every candidate :class:`~fedmem.federation.aggregator.Release` the
gateway runs three checks and admits only if all pass:

1. ``support_leak``: the family's support-leak estimate, including this release, must
   not exceed ``support_budget_bits``.
2. ``calibration_mismatch``: ``|realized n - calibrated n| <= tolerance`` (papers/003,
   "the contributing-set size used for calibration differs from the realized size by
   more than a tolerance").
3. ``retry_unbooked``: a retry (``retry_of=j``) is admitted only if query ``j`` was
   issued through this gateway, so that the retry joins ``j``'s family and composes
   with it; a retry of an unknown query cannot be composed and is refused.

**Support-leak estimator** (bits, per query family; data-independent by design, so the
admit/reject decision of checks 1 and 3 reveals nothing about the records). A family is
the client's ``family`` label (``None`` puts the query into one shared default family:
fail closed), and a retry always joins its original's family. The estimate is the sum
over the family's *emitted* support channels plus the candidate's:

* ``"public"`` channel (constant by construction, e.g. broadcast tallies, top-k count):
  0 bits;
* ``"exact"`` channel (exposed tallies or count, or a mean divided by the exact count):
  **infinite**. A deterministic data-dependent count separates some neighbouring pair
  with certainty (papers/003's cardinality differencing, "epsilon-free"), so no finite
  privacy-loss bound exists. papers/003 suggests estimating leakage "from the
  receipt-count variance across the query family"; a plug-in variance/entropy estimate
  is 0 for the first query of every family and would admit exactly the leaky response
  the record documents, so fedmem uses the worst case for exact channels;
* ``"dp"`` channels (noised tallies): the log-ratio (privacy-loss) bound of their
  composition, ``epsilon_F(delta) / ln 2`` bits, where ``epsilon_F`` is the RDP
  composition (dp-accounting) of every noised support event of the family at the
  gateway's ``delta``. Since an epsilon-DP channel's privacy loss is at most epsilon
  nats, this upper-bounds what the family's receipts reveal about any one record;
* ``"derived"`` channels (post-processing of the above): 0 extra bits.

:meth:`Gateway.empirical_bits` additionally reports the plug-in entropy of the released
counts across a family (the quantity papers/003 gestures at) as a diagnostic only.

The calibration check (2) compares the exact realized count with the calibration count,
so under ``calibration="global"`` the *rejection itself* depends on the data (it reveals
whether ``|n - n_bound| > tolerance``). That one bit per query is not booked; under
``calibration="realized"`` the check always passes and the decision is data-independent.

**Operational effect** (papers/003): on rejection the gateway (a) drops the aggregate and
receipts, (b) books only what was already emitted (:meth:`reject` takes the emitted
channels; in the engine nothing leaves before the gateway decides, so a rejection books
nothing, but a channel emitted earlier, e.g. by a fault path, still counts), and
(c) raises :class:`~fedmem.errors.SupportPrivacyViolation`; the engine may re-run the
query under the support-safe broadcast selection (``on_reject="rerun_broadcast"``).
On admission, every DP channel is booked in the durable accountant **before** the
release is returned (:meth:`admit`).
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
from dp_accounting import rdp

from fedmem import _validate as V
from fedmem.dp import Accountant
from fedmem.errors import SupportPrivacyViolation
from fedmem.federation.aggregator import Release, book_release

DEFAULT_FAMILY = "__default__"
REASONS = ("support_leak", "calibration_mismatch", "retry_unbooked")


@dataclass
class _Family:
    support_events: list = field(default_factory=list)   # DP events of emitted noised support channels
    exact_emitted: int = 0                                 # exact support channels emitted (gateway off only)
    counts: list = field(default_factory=list)            # released counts (diagnostic)
    queries: list = field(default_factory=list)


@dataclass(frozen=True)
class Assessment:
    """The gateway's verdict on one candidate release."""

    query_id: int
    family: str
    reasons: tuple[str, ...]
    messages: tuple[str, ...]
    leak_bits: float

    @property
    def admitted(self) -> bool:
        return not self.reasons


class Gateway:
    """Support-leak, calibration and retry checks; books before anything leaves."""

    def __init__(self, accountant: Accountant, *, support_budget_bits: float = 1.0, tolerance: int = 2,
                 delta: float = 1e-6):
        if not isinstance(accountant, Accountant):
            raise TypeError(f"accountant must be a fedmem.dp.Accountant. Found {type(accountant).__name__}.")
        self.accountant = accountant
        self.support_budget_bits = V.nonnegative("support_budget_bits", support_budget_bits)
        if isinstance(tolerance, bool) or not isinstance(tolerance, (int, np.integer)) or tolerance < 0:
            raise ValueError(f"tolerance must be a non-negative integer. Found {tolerance!r}.")
        self.tolerance = int(tolerance)
        self.delta = V.open_unit("delta", delta)
        self._families: dict[str, _Family] = {}
        self._issued: dict[int, str] = {}   # query id -> family

    # ------------------------------------------------------------------ families
    def register(self, query_id: int, family: str | None = None, retry_of: int | None = None) -> str:
        """Record that ``query_id`` was issued; returns its family (a retry joins its original's)."""
        if retry_of is not None and retry_of in self._issued:
            fam = self._issued[retry_of]
        else:
            fam = DEFAULT_FAMILY if family is None else str(family)
        self._issued[int(query_id)] = fam
        self._families.setdefault(fam, _Family()).queries.append(int(query_id))
        return fam

    def family_of(self, query_id: int) -> str | None:
        return self._issued.get(query_id)

    # ------------------------------------------------------------------ estimator
    def _bits_of(self, fam: _Family, release: Release | None) -> float:
        events = list(fam.support_events)
        exact = fam.exact_emitted
        if release is not None:
            for c in release.channels:
                if not c.support:
                    continue
                if c.kind == "exact":
                    exact += 1
                elif c.kind == "dp":
                    events.append(c.event)
        if exact:
            return math.inf
        if not events:
            return 0.0
        acc = rdp.RdpAccountant()
        for e in events:
            acc.compose(e)
        return float(acc.get_epsilon(self.delta)) / math.log(2.0)

    def leak_bits(self, family: str, release: Release | None = None) -> float:
        """Support-leak estimate (bits) of ``family`` after emitting ``release`` (module docstring)."""
        return self._bits_of(self._families.get(family, _Family()), release)

    def empirical_bits(self, family: str) -> float:
        """Diagnostic: plug-in entropy (bits) of the released counts across ``family`` (rounded)."""
        counts = self._families.get(family, _Family()).counts
        if not counts:
            return 0.0
        freq = np.array(list(Counter(int(round(c)) for c in counts).values()), dtype=np.float64)
        p = freq / freq.sum()
        return float(-(p * np.log2(p)).sum())

    # ------------------------------------------------------------------ decision
    def assess(self, release: Release, query_id: int, family: str, retry_of: int | None = None) -> Assessment:
        """Run the three checks on a candidate release (nothing is booked or emitted)."""
        if not isinstance(release, Release):
            raise TypeError(f"release must be a Release. Found {type(release).__name__}.")
        reasons, msgs = [], []
        bits = self.leak_bits(family, release)
        if bits > self.support_budget_bits:
            exact = release.exact_channels
            reasons.append("support_leak")
            msgs.append(f"support leak {bits:.3f} bits exceeds budget {self.support_budget_bits:.3f} bits"
                        + (f" (exact support channels: {', '.join(exact)})" if exact else ""))
        gap = abs(release.realized_n - release.calibrated_n)
        if gap > self.tolerance:
            reasons.append("calibration_mismatch")
            msgs.append(f"calibrated_n={release.calibrated_n:g} but realized n={release.realized_n}; "
                        f"DP scale is invalid for this query (tolerance {self.tolerance})")
        if retry_of is not None and retry_of not in self._issued:
            reasons.append("retry_unbooked")
            msgs.append(f"retry of query {retry_of} which this gateway never issued: its composition "
                        "cannot be booked")
        return Assessment(int(query_id), family, tuple(reasons), tuple(msgs), bits)

    def _record_emitted(self, family: str, channels, count) -> None:
        fam = self._families.setdefault(family, _Family())
        for c in channels:
            if not c.support:
                continue
            if c.kind == "dp":
                fam.support_events.append(c.event)
            elif c.kind == "exact":
                fam.exact_emitted += 1
        if count is not None:
            fam.counts.append(float(count))

    def admit(self, release: Release, assessment: Assessment, label: str):
        """Book every DP channel (before anything leaves) and record the support emission."""
        if not assessment.admitted:
            raise ValueError(f"assessment must be an admission. Found reasons {assessment.reasons!r}.")
        booking = book_release(self.accountant, release, label)
        self._record_emitted(assessment.family, release.channels, release.count)
        return booking

    def record_ungated(self, release: Release, family: str, label: str):
        """Gateway disabled: book the DP channels and record (unbooked) exact ones for the family."""
        booking = book_release(self.accountant, release, label)
        self._record_emitted(family, release.channels, release.count)
        return booking

    def reject(self, assessment: Assessment, emitted=(), label: str = "") -> SupportPrivacyViolation:
        """Drop the release; book only channels already ``emitted``; return the exception to raise."""
        booked = []
        dp = [c for c in emitted if c.kind == "dp"]
        if dp:
            import dp_accounting

            ev = dp[0].event if len(dp) == 1 else dp_accounting.ComposedDpEvent([c.event for c in dp])
            booked.append(self.accountant.book(ev, label=f"{label} (rejected, already emitted)"))
        self._record_emitted(assessment.family, emitted, None)
        msg = "no memory available for this query: " + "; ".join(assessment.messages)
        return SupportPrivacyViolation(msg, reasons=assessment.reasons, booked=tuple(booked))
