"""The federation engine: shard hosts -> compute parties -> aggregator -> gateway.

DESIGN.md, "One federated query, end to end"; papers/003. One call to
:meth:`Federation.retrieve` (or a batch through :meth:`Federation.retrieve_many`):

1. every shard host (a numpy-only Ray actor holding many shards) scores its records,
   keeps each shard's padded local top-k', clips, encodes and secret-shares them: one
   :class:`~fedmem.federation.sharing.SharePacket` per compute party;
2. the compute parties (:class:`~fedmem.federation.mpc.CryptenParties`, or the
   plaintext reference) select (top-k / threshold / broadcast) and open only what the
   release policy names (sum and count, plus tallies for ``expose``/``noised``);
3. the :class:`~fedmem.federation.aggregator.Aggregator` noises the aggregate and
   builds the support channels of the receipt policy;
4. the :class:`~fedmem.federation.gateway.Gateway` (if enabled) admits or rejects;
   every DP channel is booked in the accountant **before** the response is returned.
   A rejection raises :class:`~fedmem.errors.SupportPrivacyViolation` ("no memory
   available for this query"), never an empty response; with
   ``on_reject="rerun_broadcast"`` the query is first re-run under the support-safe
   broadcast selection and only that release is gated again.

Faults: every remote call is bounded by ``timeout_s``; a dead or hung shard host or
compute party fails the whole batch closed with :class:`~fedmem.errors.FederationFault`
before anything is released or booked. Dead hosts are re-created from the data on the
next call; :class:`~fedmem.federation.mpc.CryptenParties` restarts its parties itself.

Simulation caveat: shares travel through the driver process (Ray object refs are
resolved before the parties are called), so the driver could reconstruct them; a
deployment would send each party's packet straight from the host.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from fedmem import _validate as V
from fedmem.dp import Accountant
from fedmem.errors import BudgetExceeded, FederationFault, MpcFailure, SupportPrivacyViolation
from fedmem.federation.aggregator import (
    CALIBRATIONS, NOISES, RECEIPTS, SELECTIONS, Aggregator, Release, ReleasePolicy,
)
from fedmem.federation.gateway import Gateway
from fedmem.federation.shard_host import host_actor_class, split_shards
from fedmem.federation.sharing import decode, encode

MPCS = ("crypten", "plaintext")
ON_REJECT = ("raise", "rerun_broadcast")


@dataclass(frozen=True)
class FederationConfig:
    """Every knob of one federation (validated at construction; ``ValueError`` names the field)."""

    shards: int = 40
    records_per_shard: int = 50
    key_dim: int = 128
    value_dim: int = 128
    clip: float = 1.0                  # value vectors clipped to L2 norm <= clip
    k_local: int = 5                   # k': candidates each shard sends, padded to exactly k_local
    selection: str = "topk"            # "topk" | "threshold" | "broadcast"
    k: int = 5
    threshold: float = 0.5
    parties: int = 2
    mpc: str = "crypten"               # "crypten" | "plaintext"
    noise: str = "gaussian"            # "gaussian" | "laplace"
    sigma: float = 1.2                 # noise multiplier (noise std = sigma * sensitivity)
    delta: float = 1e-6
    calibration: str = "global"        # "global" (fixed n_bound, flawed) | "realized"
    n_bound: int = 40                  # global calibration's assumed contributor count
    receipts: str = "expose"           # "expose" | "suppress" | "noised" | "broadcast"
    receipt_sigma: float = 1.0         # noise multiplier of noised tallies
    gateway: bool = False
    support_budget_bits: float = 1.0
    tolerance: int = 2
    on_reject: str = "raise"           # "raise" | "rerun_broadcast"
    sampling: str = "fast"
    timeout_s: float = 30.0
    hosts: int = 2                     # shard-host actors

    def __post_init__(self):
        for name in ("shards", "records_per_shard", "key_dim", "value_dim", "k_local", "k", "n_bound", "hosts"):
            V.positive_int(name, getattr(self, name))
        V.positive_int("parties", self.parties, minimum=2)
        V.positive_int("tolerance", self.tolerance, minimum=0)
        for name in ("clip", "sigma", "receipt_sigma", "timeout_s"):
            V.positive(name, getattr(self, name))
        V.open_unit("delta", self.delta)
        V.nonnegative("support_budget_bits", self.support_budget_bits)
        t = V.finite("threshold", self.threshold)
        if not -1.0 <= t <= 1.0:
            raise ValueError(f"threshold must be a cosine similarity in [-1, 1]. Found {self.threshold!r}.")
        for name, allowed in (("selection", SELECTIONS), ("mpc", MPCS), ("noise", NOISES),
                              ("calibration", CALIBRATIONS), ("receipts", RECEIPTS), ("on_reject", ON_REJECT),
                              ("sampling", ("fast", "secure"))):
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {allowed}. Found {getattr(self, name)!r}.")
        if not isinstance(self.gateway, bool):
            raise TypeError(f"gateway must be a bool. Found {self.gateway!r}.")
        if self.mpc == "crypten" and self.parties > 3:
            raise ValueError(f"parties must be 2 or 3 with mpc='crypten'. Found {self.parties!r}.")
        if self.k > self.shards * self.k_local:
            raise ValueError(f"k must be <= shards * k_local = {self.shards * self.k_local} (the candidates "
                             f"sent). Found {self.k!r}.")
        if self.hosts > self.shards:
            raise ValueError(f"hosts must be <= shards ({self.shards}). Found {self.hosts!r}.")

    @property
    def effective_selection(self) -> str:
        """``receipts="broadcast"`` forces the broadcast selection (constant tallies need it)."""
        return "broadcast" if self.receipts == "broadcast" else self.selection


@dataclass(frozen=True)
class Response:
    """What the client (and the adversary) sees for one admitted query."""

    query_id: int
    value: np.ndarray               # noised released mean of the selected values
    count: float | None             # exact (expose), noised (noised), None (suppress), constant (broadcast)
    receipts: np.ndarray | None     # per-shard tallies as released, columns by ascending shard id
    channels: tuple[str, ...]       # channels that left, e.g. ("value", "receipts", "count")
    epsilon_spent: float            # accountant total after this response, at config.delta
    selection: str = "topk"         # the selection this answer came from ("broadcast" after a re-run)


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
    """Inside-the-boundary log of one query (evaluation and audit; not part of a Response)."""

    query_id: int
    family: str
    retry_of: int | None
    decision: str                   # "admitted" | "admitted_rerun" | "rejected" | "budget_exceeded"
    reasons: tuple[str, ...]
    selection: str
    realized_n: int
    calibrated_n: float
    denominator: float
    effective_noise_multiplier: float
    leak_bits: float
    channels: tuple[tuple[str, str], ...]    # (name, kind) of the channels that left (empty if none)
    unaccounted: tuple[str, ...]             # exact channels that left without a DP booking
    booking_id: int | None


def _ray():
    import ray

    return ray


class Federation:
    """A federated memory: shard hosts, compute parties, aggregator and gateway."""

    def __init__(self, config: FederationConfig, data, *, accountant: Accountant, rng: np.random.Generator,
                 ray_address: str | None = None, parties=None):
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
        self.audit: list[AuditRecord] = []
        self._next_id = 0
        self._closed = False
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
        self.gateway = Gateway(accountant, support_budget_bits=config.support_budget_bits,
                               tolerance=config.tolerance, delta=config.delta)

        ray = _ray()
        try:
            if not ray.is_initialized():
                if ray_address is None:
                    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
                else:
                    ray.init(address=ray_address, log_to_driver=False)
                self._owns_ray = True
            self._start_hosts()
            if parties is not None:
                if getattr(parties, "n_parties", None) != config.parties:
                    raise ValueError(f"parties must have n_parties={config.parties}. "
                                     f"Found {getattr(parties, 'n_parties', None)!r}.")
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
    def _new_host(self, h: int):
        ids = self._split[h]
        cls = host_actor_class()
        return cls.remote(ids, [self.data.keys[i] for i in ids], [self.data.values[i] for i in ids],
                          clip=self.config.clip, k_local=self.config.k_local, n_parties=self.config.parties,
                          seed=int(self._seed_rng.integers(0, 2**63)))

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
        norms = np.linalg.norm(q, axis=1, keepdims=True)
        if np.any(norms == 0):
            raise ValueError("q must be non-zero (it is normalised to a unit vector). Found a zero row.")
        return q / norms

    def _packets(self, q: np.ndarray, mode: str, method: str = "candidates_split"):
        ray = _ray()
        self._heal_hosts()
        P, T = self.config.parties, self.config.timeout_s
        try:
            refs = [getattr(h, method).options(num_returns=P).remote(q, mode) for h in self._hosts]
            flat = ray.get([r for hr in refs for r in hr], timeout=T)
        except Exception as exc:  # noqa: BLE001 - dead host, timeout, host error: fail closed
            self._hosts_dirty = True
            kind = "timed out" if isinstance(exc, ray.exceptions.GetTimeoutError) else "failed"
            raise FederationFault(f"shard hosts {kind} (timeout {T:g} s); nothing was released or booked: "
                                  f"{exc!r}") from exc
        H = len(self._hosts)
        return [[flat[h * P + p] for h in range(H)] for p in range(P)]

    def _compute(self, q: np.ndarray, policy: ReleasePolicy):
        packets = self._packets(q, policy.selection)
        try:
            return self.parties.run(packets, policy.selection_spec())
        except MpcFailure as exc:
            raise FederationFault(f"compute parties failed; nothing was released or booked: {exc}") from exc

    def _releases(self, q: np.ndarray, policy: ReleasePolicy) -> list[Release]:
        rev = self._compute(q, policy)
        agg = Aggregator(policy)
        out = []
        for b in range(q.shape[0]):
            tallies = None if rev.tallies is None else rev.tallies[b]
            out.append(agg.release(rev.sum[b], rev.count[b], tallies, self.rng))
        return out

    def _log(self, qid, fam, retry_of, decision, reasons, rel: Release, bits, emitted, booking):
        chans = tuple((c.name, c.kind) for c in rel.channels) if emitted else ()
        unacc = tuple(c.name for c in rel.channels if c.kind == "exact") if emitted else ()
        self.audit.append(AuditRecord(qid, fam, retry_of, decision, tuple(reasons), rel.selection, rel.realized_n,
                                      rel.calibrated_n, rel.denominator, rel.effective_noise_multiplier, bits,
                                      chans, unacc, None if booking is None else booking.id))

    def _respond(self, qid: int, rel: Release) -> Response:
        return Response(query_id=qid, value=rel.value, count=rel.count, receipts=rel.receipts,
                        channels=tuple(c.name for c in rel.channels),
                        epsilon_spent=self.accountant.spent(self.config.delta), selection=rel.selection)

    def retrieve_many(self, qs, families=None, retry_of=None) -> list:
        """Batched retrieval: one host round and one MPC run for all ``B`` queries.

        Returns one entry per query, in order: a :class:`Response`, or the
        :class:`~fedmem.errors.SupportPrivacyViolation` /
        :class:`~fedmem.errors.BudgetExceeded` instance that refused it (never an empty
        response). Queries are admitted in order, so a family's support leak composes
        exactly as if they had been issued one by one. A fault raises
        :class:`~fedmem.errors.FederationFault` for the whole batch (nothing booked).
        """
        if self._closed:
            raise FederationFault("federation is closed.")
        q = self._queries(qs)
        B = q.shape[0]
        fams = [None] * B if families is None else list(families)
        retries = [None] * B if retry_of is None else list(retry_of)
        if len(fams) != B or len(retries) != B:
            raise ValueError(f"families and retry_of must have one entry per query ({B}). "
                             f"Found {len(fams)} and {len(retries)}.")
        ids, resolved = [], []
        for b in range(B):
            qid = self._next_id
            self._next_id += 1
            ids.append(qid)
            resolved.append(self.gateway.register(qid, fams[b], retries[b]))
        rels = self._releases(q, self.policy)
        results: list = [None] * B
        rerun = []
        cfg = self.config
        for b in range(B):
            qid, fam, rel = ids[b], resolved[b], rels[b]
            label = f"q{qid} family={fam}" + (f" retry_of={retries[b]}" if retries[b] is not None else "")
            try:
                if not cfg.gateway:
                    booking = self.gateway.record_ungated(rel, fam, label)
                    self._log(qid, fam, retries[b], "admitted", (), rel, self.gateway.leak_bits(fam), True, booking)
                    results[b] = self._respond(qid, rel)
                    continue
                a = self.gateway.assess(rel, qid, fam, retries[b])
                if a.admitted:
                    booking = self.gateway.admit(rel, a, label)
                    self._log(qid, fam, retries[b], "admitted", (), rel, a.leak_bits, True, booking)
                    results[b] = self._respond(qid, rel)
                    continue
                exc = self.gateway.reject(a, emitted=(), label=label)
                self._log(qid, fam, retries[b], "rejected", a.reasons, rel, a.leak_bits, False, None)
                if cfg.on_reject == "rerun_broadcast":
                    rerun.append((b, exc))
                else:
                    results[b] = exc
            except BudgetExceeded as exc:
                self._log(qid, fam, retries[b], "budget_exceeded", ("budget",), rel, math.nan, False, None)
                results[b] = exc
        if rerun:
            idx = [b for b, _ in rerun]
            safe = self._releases(q[idx], self.safe_policy)
            for (b, first), rel in zip(rerun, safe):
                qid, fam = ids[b], resolved[b]
                label = f"q{qid} family={fam} rerun=broadcast"
                try:
                    a = self.gateway.assess(rel, qid, fam, retries[b])
                    if a.admitted:
                        booking = self.gateway.admit(rel, a, label)
                        self._log(qid, fam, retries[b], "admitted_rerun", first.reasons, rel, a.leak_bits, True,
                                  booking)
                        results[b] = self._respond(qid, rel)
                    else:
                        exc = self.gateway.reject(a, emitted=(), label=label)
                        self._log(qid, fam, retries[b], "rejected", a.reasons, rel, a.leak_bits, False, None)
                        results[b] = SupportPrivacyViolation(
                            f"{first} (broadcast re-run also rejected: {exc})",
                            reasons=tuple(dict.fromkeys(first.reasons + a.reasons)), booked=first.booked + exc.booked)
                except BudgetExceeded as exc:
                    self._log(qid, fam, retries[b], "budget_exceeded", ("budget",), rel, math.nan, False, None)
                    results[b] = exc
        return results

    def retrieve(self, q, family: str | None = None, retry_of: int | None = None) -> Response:
        """One query. Raises ``SupportPrivacyViolation`` ("no memory available"), never returns an empty response."""
        r = self.retrieve_many(np.asarray(q, dtype=np.float64)[None] if np.ndim(q) == 1 else q,
                               [family], [retry_of])
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
