"""The plain engine computation: shard hosts -> compute parties -> aggregator (no principals, no booking).

DESIGN.md, "One federated query, end to end", steps 1-3; papers/003. :class:`Engine` computes
the releases of a batch of queries under one public
:class:`~fedmem.federation.aggregator.ReleasePolicy` and nothing else: it knows no principal,
decides no admission and books nothing. :class:`~fedmem.federation.engine.Federation` wraps it
with the :class:`~fedmem.federation.gateway.Gateway` (decision before computing, booking before
returning), the way Flower's DP wrappers and fedmem's own
:class:`~fedmem.flower.gateway.SupportGatewayStrategy` wrap a strategy: one call in
(:meth:`Engine.compute`, once per admitted route), one result out.

1. every shard host (a numpy-only Ray actor holding many shards) scores its records,
   keeps each shard's padded local top-k', clips, encodes and secret-shares them: one
   :class:`~fedmem.federation.sharing.SharePacket` per compute party, sealed to that party;
2. the compute parties (:class:`~fedmem.federation.parties.Parties`: CrypTen or the
   plaintext reference) select (top-k / threshold / broadcast) and open only what the
   release policy names;
3. the :class:`~fedmem.federation.aggregator.Aggregator` fills the policy's public release
   plan with the data (noise calibrated as planned).

The releases :meth:`Engine.compute` returns are not yet booked: only the gateway wrapper may
book and return them. Faults (a dead or hung host or party, a release that does not fit its
plan) raise :class:`~fedmem.errors.FederationFault` (a machine fault) or :class:`ReleaseFailed` (a
release failed on its data; the gateway wrapper turns it into the uniform refusal of every query of
the batch) for the whole batch, with value-free messages and no exception chain.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from fedmem import _validate as V
from fedmem._ray import ensure_ray, kill_actor
from fedmem.errors import FederationFault, MpcFailure
from fedmem.federation import host_pool
from fedmem.federation.aggregator import Aggregator, Release, ReleasePolicy
from fedmem.federation.config import FederationConfig
from fedmem.federation.parties import Parties
from fedmem.federation.shard_host import check_shards, host_actor_class, split_shards
from fedmem.federation.sharing import SelectionSpec, decode, encode, new_run_id


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



class ReleaseFailed(Exception):
    """A release of the batch failed on its data (inside the trust boundary only): nothing of the batch
    may be released or booked, and the querying side must see only the uniform refusal.

    Carries no value: the message is one constant, ``args`` hold nothing else, and it is always
    raised ``from None``; the operator's value-free reason is appended to ``Engine.fault_details``."""

    def __init__(self):
        super().__init__("a release of this batch failed on its data; nothing was released or booked")


def fault_reason(stage: str, exc: BaseException) -> str:
    """The operator's value-free record of a failure: the stage and the exception's type (and, for a
    remote task's error, its cause's type), never its text (which may carry a record's value)."""
    cause = getattr(exc, "cause", None)
    inner = f" <- {type(cause).__name__}" if isinstance(cause, BaseException) else ""
    return f"{stage}: {type(exc).__name__}{inner}"


DATA_ERRORS = (ValueError, ArithmeticError, TypeError, IndexError)
"""Exceptions of a computation step that depend on the data it was given (not on the machine)."""


def _data_error(exc: BaseException) -> bool:
    """``exc`` (or a Ray task error's cause) is a data error, not a dead or slow machine."""
    return isinstance(exc, DATA_ERRORS) or isinstance(getattr(exc, "cause", None), DATA_ERRORS)


@dataclass(frozen=True)
class Computation:
    """What :meth:`Engine.compute` returns for one batch: its releases (not yet booked) and
    the public MPC cost of the run that computed them (``None`` for the plaintext reference)."""

    releases: list[Release]
    mpc_rounds: int | None
    mpc_bytes: int | None
    mpc_batch: int | None

    @property
    def mpc(self) -> dict:
        return {"mpc_rounds": self.mpc_rounds, "mpc_bytes": self.mpc_bytes, "mpc_batch": self.mpc_batch}


def _ray():
    import ray

    return ray


SHARED_QUERIES_BYTES = 64 * 1024
"""Above this size a batch's query array is put in the object store once and every host reads that
object; a smaller one travels inside each host call (Ray inlines arguments up to 100 KiB)."""

POOLED_LOAD_TIMEOUT_S = 10.0
"""How long a federation waits for a pooled host to load its shards before it replaces it by a new
actor (a pooled host answers in milliseconds unless it is dead or still busy)."""


class Engine:
    """Shard hosts, compute parties and aggregator: the plain computation the gateway wraps."""

    def __init__(self, config: FederationConfig, data, *, rng: np.random.Generator,
                 ray_address: str | None = None, parties=None, ray_options: dict | None = None):
        ray_options = dict(ray_options or {})
        if not isinstance(config, FederationConfig):
            raise TypeError(f"config must be a FederationConfig. Found {type(config).__name__}.")
        V.rng_check("rng", rng)
        if not isinstance(rng, np.random.Generator):
            raise TypeError(f"rng must be a numpy.random.Generator. Found {type(rng).__name__}.")
        for name, want, got in (("shards", config.shards, data.n_shards), ("key_dim", config.key_dim, data.key_dim),
                                ("value_dim", config.value_dim, data.value_dim)):
            if want != got:
                raise ValueError(f"data must match config.{name}={want}. Found {got!r}.")
        self.config, self.data, self.rng = config, data, rng
        # a ShardRecipe, or ShardData built by one (ShardData.recipe): the hosts generate their own shards
        self.recipe = data if getattr(data, "generated_at_hosts", False) else getattr(data, "recipe", None)
        if self.recipe is None:   # the records' structure (public metadata), before any host starts
            check_shards(data.keys, data.values, key_dim=config.key_dim, value_dim=config.value_dim,
                         sizes=data.sizes)
        self.fault_details: list[str] = []     # operator-only details of plan-mismatch faults
        self._closed = False
        # operator-side profile (benchmarks): wall seconds per stage, summed over calls
        self.timings = {"hosts": 0.0, "mpc": 0.0, "mpc_party": 0.0, "aggregator": 0.0, "runs": 0}
        self.seal = True   # seal share packets to their party (benchmarks switch it off to measure the cost)
        self._owns_ray = False
        self._owns_parties = False
        self._hosts: list = []
        self._starting: list = []    # ping refs of hosts not yet waited for (_start_hosts / _await_hosts)
        self._hosts_dirty = False
        self._args: dict = {}        # host index -> its constructor arguments (a pooled host's replacement)
        self._placed: dict = {}      # host index -> where it was pinned (the host pool's key)
        self._seed_rng = np.random.default_rng(rng.integers(0, 2**63))
        self._split = split_shards(config.shards, config.hosts)
        self.policy, self.safe_policy = self._release_policies(config, data.sizes)
        # the routes a gateway may admit a query by: its primary policy, or the support-safe broadcast
        self.policies = {"primary": self.policy, "fallback": self.safe_policy}

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
                self.parties = parties
            else:
                from fedmem.federation import mpc  # lazy: ~110 ms, no heavy package

                if config.mpc == "plaintext":
                    self.parties = mpc.PlaintextParties(config.parties)
                else:
                    self.parties = mpc.CryptenParties(config.parties, timeout_s=config.timeout_s)
                self._owns_parties = True
        except BaseException:
            self.close()
            raise

    @staticmethod
    def _release_policies(config: FederationConfig, sizes) -> tuple[ReleasePolicy, ReleasePolicy]:
        """The primary release policy (from the configuration) and the support-safe broadcast one."""
        import dataclasses

        S, kp = config.shards, config.k_local
        sel = config.effective_selection
        public = S * kp if sel == "broadcast" else (
            config.k if sel == "topk" and int(np.minimum(sizes, kp).sum()) >= config.k else None)
        policy = ReleasePolicy(
            selection=sel, shards=S, k_local=kp, clip=config.clip, value_dim=config.value_dim, k=config.k,
            threshold=config.threshold, noise=config.noise, sigma=config.sigma, calibration=config.calibration,
            n_bound=config.n_bound, receipts=config.receipts, receipt_sigma=config.receipt_sigma,
            sampling=config.sampling, public_count=public)
        safe = dataclasses.replace(policy, selection="broadcast", receipts="broadcast",
                                   calibration="realized", public_count=S * kp)
        return policy, safe

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

    @staticmethod
    def _placement_key(strategy) -> str:
        """The host pool's key for a placement: the pinned node's id, or Ray's default."""
        return strategy if isinstance(strategy, str) else f"node:{strategy.node_id}"

    def _host_args(self, h: int) -> tuple[tuple, dict]:
        """Host ``h``'s constructor arguments (draws its seed from the engine's generator)."""
        ids = self._split[h]
        kw = dict(clip=self.config.clip, k_local=self.config.k_local, n_parties=self.config.parties,
                  seed=int(self._seed_rng.integers(0, 2**63)), sizes=[int(self.data.sizes[i]) for i in ids])
        recipe = self.recipe
        if recipe is not None:   # each host generates its own shards: no record leaves the driver
            return (ids, None, None), dict(kw, recipe=recipe)
        return (ids, [self.data.keys[i] for i in ids], [self.data.values[i] for i in ids]), kw

    def _new_host(self, h: int, args=None, *, pooled: bool = False):
        """Host ``h``: with ``pooled``, an idle host of this driver's pool loaded with the shards if one
        is pinned to the same place (:mod:`fedmem.federation.host_pool`), else a new actor. Returns
        ``(actor, ready_ref, reused)``; ``args`` (from :meth:`_host_args`) are drawn when not given."""
        strategy = self._host_placement(h)
        args, kw = args if args is not None else self._host_args(h)
        self._args[h] = (args, kw)
        self._placed[h] = self._placement_key(strategy)
        if pooled:
            actor = host_pool.take(self._placed[h])
            if actor is not None:
                return actor, actor.load.remote(*args, **kw), True
        actor = host_actor_class().options(scheduling_strategy=strategy).remote(*args, **kw)
        return actor, actor.ping.remote(), False

    def _start_hosts(self):
        """Create (or take from the pool) the host actors and return without waiting: their start-up
        (a Ray worker process, imports, the shards) overlaps the parties' start and whatever the
        caller does next (e.g. a second federation of a membership game); the first use waits
        (:meth:`_await_hosts`)."""
        started = [self._new_host(h, pooled=True) for h in range(len(self._split))]
        self._hosts = [a for a, _, _ in started]
        self._starting = [(r, reused) for _, r, reused in started]

    def _await_hosts(self):
        """Wait for the hosts started by :meth:`_start_hosts` (once). A pooled host that does not
        answer its ``load`` in time (killed, busy) is killed and replaced by a new actor loaded with
        the same arguments (it held no data of this federation). A new host that fails to start
        fails the call that needed it closed (:class:`~fedmem.errors.FederationFault`, nothing
        computed or booked) and is replaced at the next call (:meth:`_heal_hosts`)."""
        starting, self._starting = self._starting, []
        if not starting:
            return
        ray = _ray()
        wait = max(self.config.timeout_s, 60.0)
        try:
            stale = []
            for h, (ref, reused) in enumerate(starting):
                if not reused:
                    continue
                try:
                    ray.get(ref, timeout=min(wait, POOLED_LOAD_TIMEOUT_S))
                except ValueError:
                    raise                       # the shards themselves are invalid: a new actor fails the same way
                except Exception:  # noqa: BLE001 - dead or busy pooled host: a new actor takes its place
                    stale.append(h)
            for h in stale:
                kill_actor(self._hosts[h])
                self._hosts[h], ref, _ = self._new_host(h, self._args[h])
                starting[h] = (ref, False)
            ray.get([ref for ref, reused in starting if not reused], timeout=wait)
        except Exception as exc:  # noqa: BLE001
            self._hosts_dirty = True
            self.fault_details.append(fault_reason("hosts start", exc))
            # value-free: a host's error text may quote a record (details: fault_details, by type only)
            raise FederationFault("shard hosts failed to start; nothing was released or booked") from None

    @property
    def hosts(self) -> list:
        """The live shard-host actors (exposed for fault-injection tests)."""
        return list(self._hosts)

    def _heal_hosts(self):
        """Wait for the hosts' start (first use), then re-create any host that no longer answers (after a fault)."""
        self._await_hosts()
        if not self._hosts_dirty:
            return
        ray = _ray()
        for h, actor in enumerate(self._hosts):
            try:
                ray.get(actor.ping.remote(), timeout=min(5.0, self.config.timeout_s))
            except Exception:  # noqa: BLE001 - dead or hung: replace it
                kill_actor(actor)
                self._hosts[h] = self._new_host(h)[0]
        ray.get([a.ping.remote() for a in self._hosts], timeout=max(self.config.timeout_s, 60.0))
        self._hosts_dirty = False

    # ------------------------------------------------------------------ pipeline
    def queries(self, qs) -> np.ndarray:
        """``qs`` checked (finite, shape (key_dim,) or (B, key_dim), B <= max_batch, no zero row) and
        normalised to unit rows, as every computation uses them."""
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

    def packets(self, q: np.ndarray, mode: str, keys=None, run_id: bytes | None = None):
        """``packets[p][h]``: an ObjectRef to host h's packet for party p, or that packet itself when it is
        sealed and small (ciphertext; ``shard_host.INLINE_SEALED_BYTES``): the driver never holds a share in the clear;
        sealed to party p's public key ``keys[p]`` for this ``run_id`` when keys are given."""
        ray = _ray()
        self._heal_hosts()
        P, T = self.config.parties, self.config.timeout_s
        try:
            # a batch's queries (public) put once for every host instead of serialised into each call
            qa = ray.put(q) if q.nbytes > SHARED_QUERIES_BYTES and len(self._hosts) > 1 else q
            metas = ray.get([h.candidates_refs.remote(qa, mode, keys, run_id) for h in self._hosts], timeout=T)
            if any(len(m["refs"]) != P for m in metas):
                raise ValueError(f"every shard host must return one packet per party ({P}).")
        except Exception as exc:  # noqa: BLE001 - dead host, timeout, host error: fail closed
            self._hosts_dirty = True
            self.fault_details.append(fault_reason("hosts", exc))
            if _data_error(exc):      # a host refused its data (e.g. a value out of range): uniform refusal
                raise ReleaseFailed() from None
            kind = "timed out" if isinstance(exc, ray.exceptions.GetTimeoutError) else "failed"
            raise FederationFault(f"shard hosts {kind} (timeout {T:g} s); nothing was released or "
                                  "booked") from None
        return [[m["refs"][p] for m in metas] for p in range(P)]

    def _run_parties(self, q: np.ndarray, policy: ReleasePolicy):
        # seal every packet to its party when the parties publish keys (both shipped backends do)
        keys = (self.parties.public_keys or None) if self.seal else None
        run_id = new_run_id() if keys else None
        tm = self.timings
        t0 = time.perf_counter()
        packets = self.packets(q, policy.selection, keys, run_id)
        t1 = time.perf_counter()
        tm["hosts"] += t1 - t0
        try:
            rev = self.parties.run(packets, policy.selection_spec(), run_id=run_id, impl=self.config.mpc_impl)
            tm["mpc"] += time.perf_counter() - t1
            tm["mpc_party"] += float((getattr(rev, "stats", None) or {}).get("party_seconds", 0.0))
            tm["runs"] += 1
            return rev
        except MpcFailure as exc:
            self._hosts_dirty = True   # the failure may be a host that died after handing out its refs
            self.fault_details.append(fault_reason("parties", exc))
            raise FederationFault("compute parties failed; nothing was released or booked") from None
        except DATA_ERRORS as exc:   # the parties refused what the hosts sent (shapes, flags): uniform refusal
            self._hosts_dirty = True
            self.fault_details.append(fault_reason("parties", exc))
            raise ReleaseFailed() from None

    def compute(self, q: np.ndarray, policy: ReleasePolicy) -> Computation:
        """The releases of the batch ``q`` (unit rows, :meth:`queries`) under ``policy``: one host
        round, one run of the parties, one aggregator pass. Not booked: the caller (the gateway
        wrapper) books them before anything leaves. Raises
        :class:`~fedmem.errors.FederationFault` for the whole batch on any fault."""
        if self._closed:
            raise FederationFault("federation is closed.")
        if not isinstance(policy, ReleasePolicy):
            raise TypeError(f"policy must be a ReleasePolicy. Found {type(policy).__name__}.")
        rev = self._run_parties(q, policy)
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
        except DATA_ERRORS as exc:   # data that does not fit the public plan (or the sampler): fail closed
            # value-free for everyone: the querying side gets the uniform refusal (Federation), the
            # operator the stage and type (the text may name a private count or sum)
            self.fault_details.append(fault_reason("aggregator", exc))
            raise ReleaseFailed() from None
        self.timings["aggregator"] += time.perf_counter() - t_agg
        return Computation(out, **meta)

    # ------------------------------------------------------------------ evaluation
    def ground_truth_many(self, qs) -> list[Truth]:
        """Exact selection (plaintext, same encoding and tie-break as the parties); evaluation only."""
        from fedmem.federation.mpc import plaintext_mask  # lazy: ~110 ms, no heavy package

        q = self.queries(qs)
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
        if self._owns_parties:
            try:
                self.parties.close()
            except Exception:  # noqa: BLE001
                pass
        # healthy hosts of a driver that keeps its Ray go back to the pool, unloaded (host_pool)
        keep = not self._owns_ray and not self._hosts_dirty and ray.is_initialized()
        for h, actor in enumerate(self._hosts):
            if keep:
                try:
                    actor.unload.remote()
                    if host_pool.give(self._placed[h], actor):
                        continue
                except Exception:  # noqa: BLE001 - not poolable: killed below
                    pass
            kill_actor(actor)
        self._hosts = []
        if self._owns_ray and ray.is_initialized():
            for actor in host_pool.clear():
                kill_actor(actor)
            ray.shutdown()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

