"""The federation engine: gateway decision -> shard hosts -> compute parties -> aggregator -> booking.

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

Shares never pass through the driver: every host ``ray.put``s its per-party packets
and hands the driver only the object refs (and public shard ids); each compute party
fetches its own packets from the host's node (``mpc.CryptenParties``, phase ``load``).
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
import time
from dataclasses import dataclass

import numpy as np

from fedmem import _validate as V
from fedmem.dp import Accountant
from fedmem.errors import BudgetExceeded, FederationFault, MpcFailure
from fedmem.federation.aggregator import Aggregator, Release, ReleasePolicy
from fedmem.federation.config import FederationConfig
from fedmem.federation.gateway import ANONYMOUS, UNISSUED, Decision, Gateway, Principal, refusal
from fedmem.federation.parties import Parties
from fedmem.federation.shard_host import host_actor_class, split_shards
from fedmem.federation.sharing import decode, encode

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
class Truth:
    """Evaluation only, never shown to the adversary: the exact selection for a query."""

    sum: np.ndarray
    count: int
    tallies: np.ndarray
    contributing: np.ndarray        # bool (S,): shard contributed at least one selected record

    @property
    def mean(self) -> np.ndarray:
        return self.sum / max(1, self.count)

    @property
    def contributors(self) -> int:
        return int(self.contributing.sum())


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


def _ray():
    import ray

    return ray


class Federation:
    """A federated memory: shard hosts, compute parties, aggregator and gateway."""

    def __init__(self, config: FederationConfig, data, *, accountant: Accountant, rng: np.random.Generator,
                 ray_address: str | None = None, parties=None, ray_options: dict | None = None):
        ray_options = dict(ray_options or {})
        if not isinstance(config, FederationConfig):
            raise TypeError(f"config must be a FederationConfig. Found {type(config).__name__}.")
        if not isinstance(accountant, Accountant):
            raise TypeError(f"accountant must be a fedmem.dp.Accountant. Found {type(accountant).__name__}.")
        V.rng_check("rng", rng)
        if not isinstance(rng, np.random.Generator):
            raise TypeError(f"rng must be a numpy.random.Generator. Found {type(rng).__name__}.")
        for name, want, got in (("shards", config.shards, data.n_shards), ("key_dim", config.key_dim, data.key_dim),
                                ("value_dim", config.value_dim, data.value_dim)):
            if want != got:
                raise ValueError(f"data must match config.{name}={want}. Found {got!r}.")
        self.config, self.data, self.accountant, self.rng = config, data, accountant, rng
        # a ShardRecipe, or ShardData built by one (ShardData.recipe): the hosts generate their own shards
        self.recipe = data if getattr(data, "generated_at_hosts", False) else getattr(data, "recipe", None)
        self.audit: list[AuditRecord] = []
        self.fault_details: list[str] = []     # operator-only details of plan-mismatch faults
        self._closed = False
        # operator-side profile (benchmarks): wall seconds per stage, summed over calls
        self.timings = {"hosts": 0.0, "mpc": 0.0, "mpc_party": 0.0, "aggregator": 0.0, "runs": 0}
        self._seal = True   # seal share packets to their party (benchmarks switch it off to measure the cost)
        self._owns_ray = False
        self._hosts: list = []
        self._hosts_dirty = False
        self._seed_rng = np.random.default_rng(rng.integers(0, 2**63))
        self._split = split_shards(config.shards, config.hosts)

        sizes = data.sizes
        S, kp = config.shards, config.k_local
        sel = config.effective_selection
        public = S * kp if sel == "broadcast" else (
            config.k if sel == "topk" and int(np.minimum(sizes, kp).sum()) >= config.k else None)
        self.policy = ReleasePolicy(
            selection=sel, shards=S, k_local=kp, clip=config.clip, value_dim=config.value_dim, k=config.k,
            threshold=config.threshold, noise=config.noise, sigma=config.sigma, calibration=config.calibration,
            n_bound=config.n_bound, receipts=config.receipts, receipt_sigma=config.receipt_sigma,
            sampling=config.sampling, public_count=public)
        self.safe_policy = dataclasses.replace(self.policy, selection="broadcast", receipts="broadcast",
                                               calibration="realized", public_count=S * kp)
        self.plans = {"primary": self.policy.plan()}
        if config.on_reject == "rerun_broadcast":
            self.plans["fallback"] = self.safe_policy.plan()
        self._policies = {"primary": self.policy, "fallback": self.safe_policy}
        self.gateway = Gateway(accountant, enabled=config.gateway, delta=config.delta, **config.budgets)
        if config.gateway and not self.plans["primary"].bookable and "fallback" not in self.plans:
            import warnings

            warnings.warn(f"every query of this federation will be refused: its releases carry unbookable "
                          f"channels {self.plans['primary'].exact_channels} and on_reject='raise'. Use "
                          "on_reject='rerun_broadcast', receipts='noised' or 'broadcast', or a public-count "
                          "selection.", stacklevel=2)
        from fedmem._ray import ensure_ray

        if parties is not None:     # checked before anything starts
            if not isinstance(parties, Parties):
                raise TypeError("parties must implement fedmem.federation.parties.Parties (PlaintextParties, "
                                f"CryptenParties or a subclass). Found {type(parties).__name__}.")
            if parties.n_parties != config.parties:
                raise ValueError(f"parties must have n_parties={config.parties}. Found {parties.n_parties!r}.")
        try:
            self._owns_ray = ensure_ray(ray_address, num_cpus=ray_options.get("num_cpus"),
                                        object_store_mb=ray_options.get("object_store_mb"))
            self._start_hosts()
            if parties is not None:
                self.parties, self._owns_parties = parties, False
            else:
                from fedmem.federation import mpc

                if config.mpc == "plaintext":
                    self.parties = mpc.PlaintextParties(config.parties)
                else:
                    self.parties = mpc.CryptenParties(config.parties, timeout_s=config.timeout_s)
                self._owns_parties = True
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ hosts
    @staticmethod
    def _host_placement(h: int):
        """Host ``h`` goes to alive node ``h mod N`` (hard node affinity).

        Ray's ``SPREAD`` is only best effort, and zero-CPU host actors often all land on one
        node; round-robin over the alive nodes spreads them deterministically. Hard, not soft:
        a soft affinity falls back to the local node whenever the scheduling raylet's view of
        the target is not yet current (measured on a fresh 3-node cluster: the 3 hosts landed on
        1, 2, 2, 3 nodes in repeated runs). A host whose node dies before or after it starts is
        a dead host: the call fails closed and the next call re-creates it on the nodes alive then."""
        ray = _ray()
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        nodes = sorted(n["NodeID"] for n in ray.nodes() if n.get("Alive"))
        if len(nodes) <= 1:
            return "DEFAULT"
        return NodeAffinitySchedulingStrategy(nodes[h % len(nodes)], soft=False)

    def _new_host(self, h: int):
        ids = self._split[h]
        cls = host_actor_class().options(scheduling_strategy=self._host_placement(h))
        kw = dict(clip=self.config.clip, k_local=self.config.k_local, n_parties=self.config.parties,
                  seed=int(self._seed_rng.integers(0, 2**63)))
        recipe = self.recipe
        if recipe is not None:   # each host generates its own shards: no record leaves the driver
            return cls.remote(ids, None, None, recipe=recipe, **kw)
        return cls.remote(ids, [self.data.keys[i] for i in ids], [self.data.values[i] for i in ids], **kw)

    def _start_hosts(self):
        ray = _ray()
        self._hosts = [self._new_host(h) for h in range(len(self._split))]
        try:
            ray.get([h.ping.remote() for h in self._hosts], timeout=max(self.config.timeout_s, 60.0))
        except Exception as exc:  # noqa: BLE001
            raise FederationFault(f"shard hosts failed to start: {exc!r}") from exc

    @property
    def hosts(self) -> list:
        """The live shard-host actors (exposed for fault-injection tests)."""
        return list(self._hosts)

    def _heal_hosts(self):
        """Re-create any host that no longer answers (after a fault)."""
        if not self._hosts_dirty:
            return
        ray = _ray()
        for h, actor in enumerate(self._hosts):
            try:
                ray.get(actor.ping.remote(), timeout=min(5.0, self.config.timeout_s))
            except Exception:  # noqa: BLE001 - dead or hung: replace it
                try:
                    ray.kill(actor, no_restart=True)
                except Exception:  # noqa: BLE001
                    pass
                self._hosts[h] = self._new_host(h)
        ray.get([a.ping.remote() for a in self._hosts], timeout=max(self.config.timeout_s, 60.0))
        self._hosts_dirty = False

    # ------------------------------------------------------------------ pipeline
    def _queries(self, qs) -> np.ndarray:
        q = V.finite_array("q", qs)
        if q.ndim == 1:
            q = q[None]
        if q.ndim != 2 or q.shape[1] != self.config.key_dim:
            raise ValueError(f"q must have shape ({self.config.key_dim},) or (B, {self.config.key_dim}). "
                             f"Found {np.shape(qs)}.")
        if q.shape[0] > self.config.max_batch:
            raise ValueError(f"q must hold at most max_batch={self.config.max_batch} queries. Found {q.shape[0]}.")
        # scale by the largest entry first: the norm of a huge (1e300) vector overflows to inf
        peak = np.max(np.abs(q), axis=1, keepdims=True)
        if np.any(peak == 0):
            raise ValueError("q must be non-zero (it is normalised to a unit vector). Found a zero row.")
        q = q / peak
        return q / np.linalg.norm(q, axis=1, keepdims=True)

    def _packets(self, q: np.ndarray, mode: str, keys=None, run_id: bytes | None = None):
        """``packets[p][h]``: an ObjectRef to host h's packet for party p (the driver never holds a share);
        sealed to party p's public key ``keys[p]`` for this ``run_id`` when keys are given."""
        ray = _ray()
        self._heal_hosts()
        P, T = self.config.parties, self.config.timeout_s
        try:
            metas = ray.get([h.candidates_refs.remote(q, mode, keys, run_id) for h in self._hosts], timeout=T)
            if any(len(m["refs"]) != P for m in metas):
                raise ValueError(f"every shard host must return one packet per party ({P}).")
        except Exception as exc:  # noqa: BLE001 - dead host, timeout, host error: fail closed
            self._hosts_dirty = True
            kind = "timed out" if isinstance(exc, ray.exceptions.GetTimeoutError) else "failed"
            raise FederationFault(f"shard hosts {kind} (timeout {T:g} s); nothing was released or booked: "
                                  f"{exc!r}") from exc
        return [[m["refs"][p] for m in metas] for p in range(P)]

    def _compute(self, q: np.ndarray, policy: ReleasePolicy):
        from fedmem.federation.sharing import new_run_id

        # seal every packet to its party when the parties publish keys (both shipped backends do)
        keys = (self.parties.public_keys or None) if self._seal else None
        run_id = new_run_id() if keys else None
        tm = self.timings
        t0 = time.perf_counter()
        packets = self._packets(q, policy.selection, keys, run_id)
        t1 = time.perf_counter()
        tm["hosts"] += t1 - t0
        try:
            rev = self.parties.run(packets, policy.selection_spec(), run_id=run_id)
            tm["mpc"] += time.perf_counter() - t1
            tm["mpc_party"] += float((getattr(rev, "stats", None) or {}).get("party_seconds", 0.0))
            tm["runs"] += 1
            return rev
        except MpcFailure as exc:
            self._hosts_dirty = True   # the failure may be a host that died after handing out its refs
            raise FederationFault(f"compute parties failed; nothing was released or booked: {exc}") from exc

    def _releases(self, q: np.ndarray, policy: ReleasePolicy) -> tuple[list[Release], dict]:
        """The batch's releases and the public MPC cost of the run that computed them."""
        rev = self._compute(q, policy)
        st = getattr(rev, "stats", None) or {}
        mpc = bool(st.get("secure"))   # a real MPC (CryptenParties), not the plaintext reference
        meta = {"mpc_rounds": int(st["rounds"]) if mpc else None,
                "mpc_bytes": int(st["bytes"]) if mpc else None,
                "mpc_batch": int(q.shape[0]) if mpc else None}
        t_agg = time.perf_counter()
        agg = Aggregator(policy)
        out = []
        try:
            for b in range(q.shape[0]):
                tallies = None if rev.tallies is None else rev.tallies[b]
                out.append(agg.release(rev.sum[b], rev.count[b], tallies, self.rng))
        except ValueError as exc:   # data that does not fit the public plan: fail closed
            # the details (which may name a private count) go to the operator, not into the exception
            self.fault_details.append(repr(exc))
            raise FederationFault("a release did not fit its public plan; nothing was released or booked "
                                  "(details in Federation.fault_details)") from None
        self.timings["aggregator"] += time.perf_counter() - t_agg
        return out, meta

    def _log(self, d: Decision, decision: str, rel: Release | None, bookings=(), emitted: bool = False,
             mpc: dict | None = None):
        sel = self._policies[d.route].selection if d.route else self.policy.selection
        chans = tuple((c.name, c.kind) for c in rel.channels) if (emitted and rel is not None) else ()
        unacc = tuple(c.name for c in rel.channels if c.kind == "exact") if (emitted and rel is not None) else ()
        self.audit.append(AuditRecord(
            d.query_id, d.principal, d.family, d.retry_of, decision, d.reasons, sel,
            None if rel is None else rel.realized_n, None if rel is None else rel.denominator,
            None if rel is None else rel.effective_noise_multiplier, self.gateway.support_bits(d.principal),
            chans, unacc, tuple(b.id for b in bookings), **(mpc or {})))

    def _respond(self, d: Decision, rel: Release, mpc: dict | None = None) -> Response:
        ev = rel.event()
        from fedmem.dp.accountant import event_to_dict

        return Response(query_id=d.query_id, value=rel.value, count=rel.count, receipts=rel.receipts,
                        channels=tuple(c.name for c in rel.channels),
                        epsilon_spent=self.gateway.principal_spent(d.principal), selection=rel.selection,
                        principal=d.principal, event=None if ev is None else event_to_dict(ev), **(mpc or {}))

    def connect(self, principal: str | None = None):
        """A :class:`~fedmem.federation.client.MemoryClient` with its own principal identity.

        ``principal=None`` (what an agent gets): a fresh :class:`~fedmem.federation.gateway.Principal`
        (random public label + secret capability token, durable, never reused). Passing an
        issued capability (the ``Principal`` or its token) re-attaches that principal (e.g.
        after a restart: its spend is still charged); anything else — a label, a guessed or
        forged id — is refused (the message does not say whether the label exists).
        """
        from fedmem.federation.client import MemoryClient

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
        q = self._queries(qs)
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
            decisions = [gw.decide(ids[b], pids[b], fams[b], retries[b], self.plans) for b in range(B)]
            rels: dict[int, Release] = {}
            mpcs: dict[int, dict] = {}
            for route in ("primary", "fallback"):
                idx = [b for b, d in enumerate(decisions) if d.route == route]
                if idx:
                    route_rels, meta = self._releases(q[idx], self._policies[route])
                    for b, rel in zip(idx, route_rels):
                        rels[b], mpcs[b] = rel, meta
        except FederationFault:
            for d in decisions:
                self._log(d, "fault", None)
            raise
        finally:
            gw.clear_pending()
        results: list = [None] * B
        for b, d in enumerate(decisions):
            if not d.admitted:
                self._log(d, "refused", None)
                results[b] = refusal(d.query_id)
                continue
            rel = rels[b]
            label = f"q{d.query_id} principal={d.principal} family={d.family}" + (
                f" retry_of={d.retry_of}" if d.retry_of is not None else "") + (
                " route=fallback" if d.route == "fallback" else "")
            try:
                bookings = gw.book(d, rel.plan, label)
            except BudgetExceeded:
                self._log(d, "budget_exceeded", rel, mpc=mpcs[b])
                results[b] = refusal(d.query_id)
                continue
            self._log(d, "admitted" if d.route == "primary" else "admitted_fallback", rel, bookings, True,
                      mpc=mpcs[b])
            results[b] = self._respond(d, rel, mpcs[b])
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
        from fedmem.federation.mpc import plaintext_mask
        from fedmem.federation.sharing import SelectionSpec

        q = self._queries(qs)
        sel = self.policy.selection
        ray = _ray()
        self._heal_hosts()
        try:
            parts = ray.get([h.plain_candidates.remote(q, sel) for h in self._hosts], timeout=self.config.timeout_s)
        except Exception as exc:  # noqa: BLE001
            self._hosts_dirty = True
            raise FederationFault(f"shard hosts failed while computing the ground truth: {exc!r}") from exc
        scores = np.concatenate([p[0] for p in parts], axis=1)
        values = np.concatenate([p[1] for p in parts], axis=1)
        valid = np.concatenate([p[2] for p in parts], axis=1)
        B, S, m = scores.shape
        spec = SelectionSpec(mode=sel, k=self.config.k, threshold=self.config.threshold)
        mask = plaintext_mask(encode(scores).reshape(B, S * m), valid.reshape(B, S * m), spec).reshape(B, S, m)
        ring = encode(values)
        out = []
        for b in range(B):
            with np.errstate(over="ignore"):
                tot = decode(np.where(mask[b][..., None], ring[b], 0).sum(axis=(0, 1), dtype=np.int64))
            tallies = mask[b].sum(axis=1).astype(np.int64)
            out.append(Truth(sum=tot, count=int(tallies.sum()), tallies=tallies, contributing=tallies > 0))
        return out

    def ground_truth(self, q) -> Truth:
        return self.ground_truth_many(np.asarray(q, dtype=np.float64)[None])[0]

    # ------------------------------------------------------------------ lifecycle
    def close(self):
        if self._closed:
            return
        self._closed = True
        ray = _ray()
        if getattr(self, "_owns_parties", False):
            try:
                self.parties.close()
            except Exception:  # noqa: BLE001
                pass
        for h in self._hosts:
            try:
                ray.kill(h, no_restart=True)
            except Exception:  # noqa: BLE001
                pass
        self._hosts = []
        if self._owns_ray and ray.is_initialized():
            ray.shutdown()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
