"""The federation: the gateway wrapped around the engine computation.

decision (gateway) -> :meth:`Engine.compute <fedmem.federation.compute.Engine.compute>` (shard
hosts -> compute parties -> aggregator) -> booking (gateway) -> response.

:class:`Federation` composes a :class:`~fedmem.federation.gateway.Gateway` (principals,
decisions, booking) with a :class:`~fedmem.federation.compute.Engine` (the computation; it
knows no principal and books nothing), the way Flower's DP wrappers and fedmem's
:class:`~fedmem.flower.gateway.SupportGatewayStrategy` wrap a strategy: the engine is called
once per admitted route of a batch and never calls back.

DESIGN.md, "One federated query, end to end"; papers/003. One call to
:meth:`Federation.retrieve` (or a batch through :meth:`Federation.retrieve_many`), for
one principal (the identity :meth:`Federation.connect` gave the client):

0. the :class:`~fedmem.federation.gateway.Gateway` decides, for every query and from
   public state only (configuration, the release plan, what is already booked), whether
   it is answered and by which route (the primary policy, or the support-safe broadcast
   with ``on_reject="rerun_broadcast"``). Nothing private has been computed yet, so the
   decision cannot depend on the records;
1. every shard host (a numpy-only Ray actor holding many shards) scores its records,
   keeps each shard's padded local top-k', clips, encodes and secret-shares them: one
   :class:`~fedmem.federation.sharing.SharePacket` per compute party;
2. the compute parties (:class:`~fedmem.federation.mpc.CryptenParties`, or the
   plaintext reference) select (top-k / threshold / broadcast) and open only what the
   release policy names (sum and count, plus tallies for ``expose``/``noised``);
3. the :class:`~fedmem.federation.aggregator.Aggregator` fills the policy's public
   release plan with the data (noise calibrated as planned);
4. every DP channel is booked — per principal, in total, and the support channels in
   the support accountants — in one SQLite transaction **before** the response is
   returned. A refused query gets the uniform
   :class:`~fedmem.errors.SupportPrivacyViolation` ("no memory available for this
   query"), never an empty response and never a reason; reasons go to
   :attr:`Federation.audit`.

Faults: every remote call is bounded by ``timeout_s``; a dead or hung shard host or
compute party fails the whole batch closed with :class:`~fedmem.errors.FederationFault`
before anything is booked or released (booking happens after all computation of the
batch). Dead hosts are re-created from the data on the next call;
:class:`~fedmem.federation.mpc.CryptenParties` restarts its parties itself.

Timing: a refused query is not computed and an admitted one is computed by its route's
policy; both are decided from public state, so *whether* work happens reveals nothing.
The computation itself is oblivious (fixed-size packets and circuits); the timing attack
of :mod:`fedmem.attacks.observable` measures what is left.

Shares never pass through the driver in the clear: every host ``ray.put``s its per-party
packets and hands the driver only the object refs (and public shard ids), except that a
sealed packet of at most 64 KiB of ciphertext (a 48-byte sealed seed, or a small batch's
shares) comes back by value (``shard_host.INLINE_SEALED_BYTES``: each host-owned object
costs a few ms of Ray bookkeeping per call); each compute party fetches its own packets
from the host's node (``mpc.CryptenParties``, phase ``load``).
Every packet is sealed to its party first (X25519 + HKDF + AES-256-GCM, bound to a fresh
run id, the party and the shards; ``sharing.seal_packet``), so the object store and its
plasma file hold only ciphertext, and a party refuses any packet that does not open.
Hosts are spread round-robin over the cluster's alive nodes (hard node affinity) and the
parties go to distinct nodes when there are enough (docs/cluster.md). The MPC's rounds
and bytes (public: functions of the batch shape only) are carried into every
:class:`Response` and :class:`AuditRecord` (``mpc_rounds``, ``mpc_bytes``, ``mpc_batch``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from fedmem.dp import Accountant
from fedmem.dp.accountant import event_to_dict
from fedmem.errors import BudgetExceeded, FederationFault
from fedmem.federation.aggregator import Release
from fedmem.federation.client import CapabilityService, MemoryClient
from fedmem.federation.compute import Engine, ReleaseFailed, Truth
from fedmem.federation.config import FederationConfig
from fedmem.federation.gateway import ANONYMOUS, UNISSUED, Decision, Gateway, Principal, refusal

RELEASE_FAILED = "release_failed"
"""The audit reason of a query whose batch failed on its data (value-free; details by type only in
``Federation.fault_details``)."""


@dataclass(frozen=True)
class Response:
    """What the client (and the adversary) sees for one admitted query.

    Every field is either a booked DP release (``value``, noised ``receipts``/``count``),
    post-processing of one, a public constant, or — for undefended federations only — an
    exact support channel listed in the operator's audit log as unaccounted.
    """

    query_id: int
    value: np.ndarray               # noised released mean of the selected values
    count: float | None             # exact (expose), noised (noised), None (suppress), constant (broadcast)
    receipts: np.ndarray | None     # per-shard tallies as released, columns by ascending shard id
    channels: tuple[str, ...]       # channels that left, e.g. ("value", "receipts", "count")
    epsilon_spent: float            # this principal's booked epsilon after this response, at config.delta
    selection: str = "topk"         # the selection this answer came from (public: decided before computing)
    principal: str = "anonymous"
    event: dict | None = None       # the DP event booked for this response (dp-accounting terms)
    # --- MPC cost of the run that answered this query (public: shapes only; None for the plaintext reference)
    mpc_rounds: int | None = None   # communication rounds of that run (shared by its whole batch)
    mpc_bytes: int | None = None    # bytes exchanged by the parties in that run (whole batch)
    mpc_batch: int | None = None    # queries computed in that run (per-query bytes = mpc_bytes / mpc_batch)


@dataclass(frozen=True)
class AuditRecord:
    """Operator's log of one query (inside the boundary; never shown to an agent)."""

    query_id: int
    principal: str
    family: str
    retry_of: int | None
    decision: str                   # "admitted" | "admitted_fallback" | "refused" | "budget_exceeded" | "fault"
    reasons: tuple[str, ...]
    selection: str
    realized_n: int | None          # None when nothing was computed (refused before computing)
    denominator: float | None
    effective_noise_multiplier: float | None
    leak_bits: float                # principal's support bits after this query
    channels: tuple[tuple[str, str], ...]    # (name, kind) of the channels that left (empty if none)
    unaccounted: tuple[str, ...]             # exact channels that left without a DP booking
    booking_ids: tuple[int, ...]
    mpc_rounds: int | None = None            # MPC cost of the run that computed it (see Response)
    mpc_bytes: int | None = None
    mpc_batch: int | None = None


class Federation(CapabilityService):
    """A federated memory: the :class:`~fedmem.federation.gateway.Gateway` wrapped around an
    :class:`~fedmem.federation.compute.Engine` (shard hosts, compute parties, aggregator).

    The engine computes and knows no principal; the gateway owns principals, decisions and
    booking. :meth:`retrieve_many` decides every query from public state, calls
    :meth:`Engine.compute <fedmem.federation.compute.Engine.compute>` once per admitted route,
    books, and only then returns.
    """

    def __init__(self, config: FederationConfig, data, *, accountant: Accountant, rng: np.random.Generator,
                 ray_address: str | None = None, parties=None, ray_options: dict | None = None):
        if not isinstance(config, FederationConfig):
            raise TypeError(f"config must be a FederationConfig. Found {type(config).__name__}.")
        if not isinstance(accountant, Accountant):
            raise TypeError(f"accountant must be a fedmem.dp.Accountant. Found {type(accountant).__name__}.")
        self.config, self.accountant = config, accountant
        self.audit: list[AuditRecord] = []
        self._closed = False
        self.engine = Engine(config, data, rng=rng, ray_address=ray_address, parties=parties,
                             ray_options=ray_options)
        try:
            self.plans = {"primary": self.engine.policy.plan()}
            if config.on_reject == "rerun_broadcast":
                self.plans["fallback"] = self.engine.safe_policy.plan()
            self.gateway = Gateway(accountant, enabled=config.gateway, delta=config.delta, **config.budgets)
        except BaseException:
            self.engine.close()
            raise
        if config.gateway and not self.plans["primary"].bookable and "fallback" not in self.plans:
            import warnings

            warnings.warn(f"every query of this federation will be refused: its releases carry unbookable "
                          f"channels {self.plans['primary'].exact_channels} and on_reject='raise'. Use "
                          "on_reject='rerun_broadcast', receipts='noised' or 'broadcast', or a public-count "
                          "selection.", stacklevel=2)

    # ------------------------------------------------------------------ the wrapped engine (operator side)
    data = property(lambda self: self.engine.data)
    recipe = property(lambda self: self.engine.recipe)
    rng = property(lambda self: self.engine.rng)
    policy = property(lambda self: self.engine.policy, doc="The primary release policy (public).")
    safe_policy = property(lambda self: self.engine.safe_policy, doc="The support-safe broadcast policy.")
    parties = property(lambda self: self.engine.parties)
    timings = property(lambda self: self.engine.timings, doc="Operator profile: wall seconds per stage.")
    fault_details = property(lambda self: self.engine.fault_details,
                             doc="Operator-only details of plan-mismatch faults.")

    @property
    def hosts(self) -> list:
        """The live shard-host actors (exposed for fault-injection tests)."""
        return self.engine.hosts

    # ------------------------------------------------------------------ what a capability holder may read
    def spent(self, capability) -> float:
        """The epsilon booked to the holder of ``capability`` at ``config.delta`` (0 if unissued)."""
        label = self.gateway.resolve(capability)
        return 0.0 if label is None else self.gateway.principal_spent(label)

    def support_bits_spent(self, capability) -> float:
        """The support-channel bits booked to the holder of ``capability`` (0 if unissued)."""
        label = self.gateway.resolve(capability)
        return 0.0 if label is None else self.gateway.support_bits(label)

    # ------------------------------------------------------------------ gateway around the engine

    def _log(self, d: Decision, decision: str, rel: Release | None, bookings=(), emitted: bool = False,
             mpc: dict | None = None, support_bits: float | None = None):
        sel = self.engine.policies[d.route].selection if d.route else self.engine.policy.selection
        chans = tuple((c.name, c.kind) for c in rel.channels) if (emitted and rel is not None) else ()
        unacc = tuple(c.name for c in rel.channels if c.kind == "exact") if (emitted and rel is not None) else ()
        self.audit.append(AuditRecord(
            d.query_id, d.principal, d.family, d.retry_of, decision, d.reasons, sel,
            None if rel is None else rel.realized_n, None if rel is None else rel.denominator,
            None if rel is None else rel.effective_noise_multiplier,
            self.gateway.support_bits(d.principal) if support_bits is None else support_bits,
            chans, unacc, tuple(b.id for b in bookings), **(mpc or {})))

    def _respond(self, d: Decision, rel: Release, mpc: dict | None, spent: float) -> Response:
        ev = rel.event()
        return Response(query_id=d.query_id, value=rel.value, count=rel.count, receipts=rel.receipts,
                        channels=tuple(c.name for c in rel.channels),
                        epsilon_spent=spent, selection=rel.selection,
                        principal=d.principal, event=None if ev is None else event_to_dict(ev), **(mpc or {}))

    def connect(self, principal: str | None = None):
        """A :class:`~fedmem.federation.client.MemoryClient` with its own principal identity.

        ``principal=None`` (what an agent gets): a fresh :class:`~fedmem.federation.gateway.Principal`
        (random public label + secret capability token, durable, never reused). Passing an
        issued capability (the ``Principal`` or its token) re-attaches that principal (e.g.
        after a restart: its spend is still charged); anything else — a label, a guessed or
        forged id — is refused (the message does not say whether the label exists).
        """
        if principal is None:
            principal = self.gateway.new_principal()
        else:
            label = self.gateway.resolve(principal)
            if label is None:
                raise ValueError("principal must be an id this federation issued, i.e. its capability (connect() "
                                 "without one issues a new one). Found an unissued value.")
            token = principal.capability if isinstance(principal, Principal) else principal
            principal = Principal(label, token)
        return MemoryClient(self, principal=principal)

    def retrieve_many(self, qs, families=None, retry_of=None, *, principal=None) -> list:
        """Batched retrieval for one principal: one host round and one MPC run per route.

        Returns one entry per query, in order: a :class:`Response`, or the uniform
        :class:`~fedmem.errors.SupportPrivacyViolation` that refused it (never an empty
        response). Admission is decided for every query, in order, **before** anything
        private is computed (:meth:`Gateway.decide`), so a batch composes exactly as if
        its queries had been issued one by one and whether (and how) a query is answered
        never depends on the records. A fault raises
        :class:`~fedmem.errors.FederationFault` for the whole batch: nothing is booked or
        released (booking happens only after every computation of the batch succeeded).
        """
        if self._closed:
            raise FederationFault("federation is closed.")
        q = self.engine.queries(qs)
        B = q.shape[0]
        # a principal is a capability: anything the gateway did not issue is booked as
        # "unissued" and refused uniformly below; None is the in-process operator's own queries
        plist = list(principal) if isinstance(principal, (list, tuple)) else [principal] * B
        pids = [ANONYMOUS if p is None else (self.gateway.resolve(p) or UNISSUED) for p in plist]
        fams = [None] * B if families is None else list(families)
        retries = [None] * B if retry_of is None else list(retry_of)
        if len(fams) != B or len(retries) != B or len(pids) != B:
            raise ValueError(f"families, retry_of and principal must have one entry per query ({B}). "
                             f"Found {len(fams)}, {len(retries)} and {len(pids)}.")
        fams = ["default" if f is None else str(f) for f in fams]
        gw = self.gateway
        ids = gw.register(pids, fams, retries)
        decisions: list[Decision] = []
        try:
            decisions = gw.decide_many(ids, pids, fams, retries, self.plans)
            rels: dict[int, Release] = {}
            mpcs: dict[int, dict] = {}
            for route in ("primary", "fallback"):
                idx = [b for b, d in enumerate(decisions) if d.route == route]
                if idx:
                    done = self.engine.compute(q[idx], self.engine.policies[route])   # the one call in
                    for b, rel in zip(idx, done.releases):
                        rels[b], mpcs[b] = rel, done.mpc
        except FederationFault:
            for d in decisions:
                self._log(d, "fault", None)
            raise
        except ReleaseFailed:
            # a release failed on its data: every query of the batch gets the uniform refusal (the same
            # object an unadmitted query gets: type, text, args, attributes; no chain), nothing is booked
            # or released, and the operator's log keeps the value-free reason
            for d in decisions:
                self._log(dataclasses.replace(d, reasons=(*d.reasons, RELEASE_FAILED)), "fault", None)
            failed = True
        else:
            failed = False
        finally:
            gw.clear_pending()
        if failed:
            return [refusal(d.query_id) for d in decisions]
        results: list = [None] * B
        labels = {b: f"q{d.query_id} principal={d.principal} family={d.family}" + (
            f" retry_of={d.retry_of}" if d.retry_of is not None else "") + (
            " route=fallback" if d.route == "fallback" else "") for b, d in enumerate(decisions) if d.admitted}
        # every admitted release booked in ONE transaction (all or nothing, before anything is returned);
        # None: it does not fit as a whole (a concurrent writer), so book query by query below
        # (the audit's support bits of each query are then the principal's right after it, as booked one by one;
        # a refusal logs its principal's bits before the batch plus those of the admissions before it)
        bits_now = {p: gw.support_bits(p) for p in dict.fromkeys(d.principal for d in decisions if not d.admitted)
                    } if labels else {}
        batch = gw.book_many([(decisions[b], rels[b].plan, labels[b]) for b in labels]) if labels else None
        booked = dict(zip(labels, batch)) if batch is not None else {}
        for b, d in enumerate(decisions):
            if not d.admitted:
                self._log(d, "refused", None, support_bits=bits_now.get(d.principal) if booked else None)
                results[b] = refusal(d.query_id)
                continue
            rel = rels[b]
            if b in booked:
                bookings, spent, bits = booked[b]
                bits_now[d.principal] = bits
            else:
                try:
                    bookings = gw.book(d, rel.plan, labels[b])
                except BudgetExceeded:
                    self._log(d, "budget_exceeded", rel, mpc=mpcs[b])
                    results[b] = refusal(d.query_id)
                    continue
                spent, bits = gw.principal_spent(d.principal), None
            self._log(d, "admitted" if d.route == "primary" else "admitted_fallback", rel, bookings, True,
                      mpc=mpcs[b], support_bits=bits)
            results[b] = self._respond(d, rel, mpcs[b], spent)
        return results

    def retrieve(self, q, family: str | None = None, retry_of: int | None = None, *,
                 principal: str | None = None) -> Response:
        """One query. Raises ``SupportPrivacyViolation`` ("no memory available"), never returns an empty response."""
        r = self.retrieve_many(np.asarray(q, dtype=np.float64)[None] if np.ndim(q) == 1 else q,
                               [family], [retry_of], principal=principal)
        if len(r) != 1:
            raise ValueError(f"q must be one query vector of dimension {self.config.key_dim}. Found shape "
                             f"{np.shape(q)}.")
        if isinstance(r[0], Exception):
            raise r[0]
        return r[0]

    # ------------------------------------------------------------------ evaluation
    def ground_truth_many(self, qs) -> list[Truth]:
        """Exact selection (plaintext, same encoding and tie-break as the parties); evaluation only."""
        return self.engine.ground_truth_many(qs)

    def ground_truth(self, q) -> Truth:
        return self.engine.ground_truth(q)

    # ------------------------------------------------------------------ lifecycle
    def close(self):
        if self._closed:
            return
        self._closed = True
        self.engine.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
