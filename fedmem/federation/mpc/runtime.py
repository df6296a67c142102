"""The CrypTen runtime: compute parties as Ray actors (rendezvous on node addresses, placement
on distinct nodes), and :class:`CryptenParties`, the driver-side handle."""

from __future__ import annotations

import os
import time

import numpy as np

from fedmem import _validate as V
from fedmem.errors import MpcFailure
from fedmem.federation.mpc.endpoints import free_port, ifname_for, node_ip, url_host
from fedmem.federation.mpc.layout import _check_packets, _check_spec, _resolve, _unseal, assemble
from fedmem.federation.mpc.networks import IMPLS, PROVIDERS, secure_program
from fedmem.federation.parties import Parties
from fedmem.federation.sharing import REVEALABLE, PartyKey, Revealed, SelectionSpec
from fedmem._ray import ensure_ray, kill_actor


class _CryptenParty:
    """One compute party (the body of a Ray actor). Holds only its own shares.

    Start-up is two calls so that the rendezvous can live on any node: rank 0's
    :meth:`endpoint` picks a free port on its own node's IP; the driver hands that
    address to every party's :meth:`init`. A query is ONE call, :meth:`load_run`: it
    fetches this party's packets (Ray ObjectRefs are resolved here, never in the driver;
    the fetch is bounded by the timeout), then all parties exchange public metadata
    (fetch failed?, shapes, a checksum of the shard ids) in one all-gather *before* the
    protocol: a dead shard host fails the query on every party alike, none enters the
    protocol and none is stranded inside it; otherwise :meth:`run` executes the secure
    program on the loaded shares.
    """

    def __init__(self, rank: int, world_size: int, provider: str, threads: int):
        from fedmem._malloc import keep_freed_memory

        keep_freed_memory()   # the protocol's tensors stay in this party's heap between batches (fedmem._malloc)
        self.rank, self.world_size, self.provider = rank, world_size, provider
        self._loaded = None
        self._key = PartyKey()   # X25519 key pair made here: the private key never leaves this process
        import torch

        torch.set_num_threads(threads)

    def public_key(self) -> bytes:
        """This party's raw X25519 public key (shard hosts seal its share packets to it)."""
        return self._key.public

    def node(self) -> dict:
        """Where this party runs: ``{"node_id", "ip", "pid"}`` (public placement facts)."""
        import ray

        return {"node_id": ray.get_runtime_context().get_node_id(), "ip": node_ip(), "pid": os.getpid()}

    def endpoint(self) -> str:
        """Rank 0 only: ``tcp://<this node's IP>:<free port on it>`` for the CrypTen rendezvous."""
        ip = node_ip()
        return f"tcp://{url_host(ip)}:{free_port(ip)}"

    def _env(self, rank: int, rendezvous: str):
        env = {"RANK": str(rank), "WORLD_SIZE": str(self.world_size), "RENDEZVOUS": rendezvous,
               "DISTRIBUTED_BACKEND": "gloo"}
        ifname = os.environ.get("FEDMEM_GLOO_IFNAME") or ifname_for(node_ip())
        if ifname:
            env["GLOO_SOCKET_IFNAME"] = ifname
        os.environ.update(env)

    def init(self, rendezvous: str):
        from fedmem._crypten import crypten  # lazy: loads crypten, torch, onnx (~6.1 s)

        self._env(self.rank, rendezvous)
        crypten.cfg.mpc.provider = self.provider
        crypten.cfg.communicator.verbose = True
        crypten.init()
        return self.node()

    def serve_ttp(self, rendezvous: str):
        """TTP provider only: run CrypTen's trusted-third-party server loop (returns at shutdown)."""
        from fedmem._crypten import crypten  # lazy: loads crypten, torch, onnx (~6.1 s)
        from crypten.mpc.provider.ttp_provider import TTPServer

        self._env(self.world_size, rendezvous)
        crypten.cfg.mpc.provider = "TTP"
        crypten.cfg.communicator.verbose = True
        crypten.init()
        TTPServer()
        return "ttp done"

    def load(self, packets, timeout_s: float | None = None, run_id: bytes | None = None):
        """Fetch, open (sealed packets, with ``run_id``) and assemble this party's packets;
        returns public metadata or the fetch/authentication error."""
        self._loaded = None
        try:
            got = _unseal(_resolve(packets, timeout_s), self._key, run_id, self.rank)
            scores, values, valid, ids, m = assemble(got)
        except MpcFailure as exc:
            return {"error": str(exc)}
        self._loaded = (scores, values, valid, ids, m)
        return {"ids": ids, "shape": (scores.shape[0], scores.shape[1], values.shape[2], m)}

    def load_run(self, packets, timeout_s, spec, impl="auto", shards_sorted=False, run_id=None):
        """:meth:`load`, an agreement step, then :meth:`run`, in ONE actor call (one Ray round trip).

        Agreement: every party contributes ``[fetch failed, B, N, d, m, crc32(shard ids)]``
        to one all-gather (before the protocol's statistics start). Only when every party
        fetched and all agree does any party enter the protocol; otherwise each returns the
        same ``{"error": ...}`` and stays warm (no share was used)."""
        import zlib

        import torch

        from fedmem._crypten import comm  # lazy: loads crypten, torch, onnx (~6.1 s)

        meta = self.load(packets, timeout_s, run_id)
        if "error" in meta:
            mine = [1, 0, 0, 0, 0, 0]
        else:
            B, N, d, m = meta["shape"]
            mine = [0, B, N, d, m, zlib.crc32(np.ascontiguousarray(meta["ids"], dtype=np.int64).tobytes())]
        got = comm.get().all_gather(torch.tensor(mine, dtype=torch.long))
        rows = [g.tolist() for g in got]
        if any(r[0] for r in rows):
            self._loaded = None
            return {"error": meta.get("error") or "another party could not fetch or open its shares from the "
                                                  "shard hosts (shares could not be fetched)"}
        if any(r != rows[0] for r in rows[1:]):
            self._loaded = None
            return {"error": "parties received packets from different shards or of different shapes; no output "
                             "was computed."}
        return self.run(spec, impl, shards_sorted)

    def run(self, spec, impl="auto", shards_sorted=False):
        from fedmem._crypten import comm  # lazy: loads crypten, torch, onnx (~6.1 s)

        if self._loaded is None:
            raise MpcFailure("run called without loaded packets.")
        scores, values, valid, ids, m = self._loaded
        self._loaded = None
        c = comm.get()
        c.reset_communication_stats()
        t0, c0 = time.perf_counter(), time.process_time()
        out = secure_program(scores, values, valid, m, spec, self.rank, impl, shards_sorted)
        st = c.get_communication_stats()
        out["_stats"] = {"seconds": time.perf_counter() - t0, "cpu_seconds": time.process_time() - c0,
                         "rounds": int(st["rounds"]), "bytes": int(st["bytes"])}
        out["_ids"] = ids
        from fedmem.federation.mpc.rounds import prefill_async  # lazy: loads torch (~2.5 s)

        prefill_async()   # correlated randomness for the next query, generated while this party is idle
        return out

    def pid(self):
        return os.getpid()

    def configure(self, prg: str | None = None, pool_mb: float | None = None) -> dict:
        """Benchmarks only: this party's triple generator (``"aes"`` or the old ``"torch"``) and
        pool size. Every party must be configured alike (SPMD) before the next query."""
        from fedmem.federation.mpc import keystreams as MR   # torch: imported where used (test_lazy_imports)

        MR.pause_prefill()
        if prg is not None:
            if prg not in MR.PRGS:
                raise ValueError(f"prg must be one of {MR.PRGS}. Found {prg!r}.")
            MR.PRG["name"] = prg
        if pool_mb is not None:
            os.environ["FEDMEM_TRIPLE_POOL_MB"] = str(float(pool_mb))
            for pair in MR.STREAMS.values():
                for st in pair:
                    st.cap = MR.pool_elements() if isinstance(st, MR.KeyStream) else 0
        return {"prg": MR.PRG["name"], "pool_elements": MR.pool_elements()}

    def peak_rss(self) -> int:
        """Peak resident memory of this party process so far, in bytes (benchmarks)."""
        import resource

        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024

    def shutdown(self):
        from fedmem._crypten import crypten  # lazy: loads crypten, torch, onnx (~6.1 s)
        from fedmem.federation.mpc.rounds import pause_prefill  # lazy: loads torch (~2.5 s)

        pause_prefill()

        crypten.uninit()
        return True


class SharedNodeWarning(UserWarning):
    """The compute parties share a Ray node (fewer alive nodes than parties): no separation."""


PLACEMENTS = ("auto", "spread", "pack")
_BUNDLE = {"CPU": 0.01}
"""A party's placement-group bundle: a token CPU share (parties are idle between queries)."""


def _eligible_nodes() -> int:
    import ray

    return sum(1 for n in ray.nodes() if n.get("Alive") and n.get("Resources", {}).get("CPU", 0) >= _BUNDLE["CPU"])


class CryptenParties(Parties):
    """``n_parties`` CrypTen compute parties as Ray actors over gloo, one per node when possible.

    Starts its actors on construction (Ray must be initialised, or is initialised
    locally) and keeps them warm across :meth:`run` calls. Placement (``placement``):

    * ``"auto"`` (default): when the cluster has at least ``n_parties`` alive nodes with
      a CPU, the parties go to distinct nodes (a ``STRICT_SPREAD`` placement group, one
      token bundle ``{"CPU": 0.01}`` per party); otherwise they share a node and a
      :class:`SharedNodeWarning` says so (the single-machine simulation);
    * ``"spread"``: distinct nodes or :class:`~fedmem.errors.MpcFailure` at start;
    * ``"pack"``: no placement group and no warning (benchmarks on one machine).

    Rendezvous: rank 0 picks a free port on its own node's IP
    (``ray.util.get_node_ip_address()`` inside the actor) and returns
    ``tcp://IP:PORT``; the driver passes it to every party, and gloo binds to the
    interface that carries each party's node IP (``FEDMEM_GLOO_IFNAME`` overrides).
    :attr:`nodes` records where each rank runs. With ``provider="TTP"`` the trusted third
    party is one more actor, spread too when there are ``n_parties + 1`` nodes.

    Starting (CrypTen rendezvous) is bounded by ``start_timeout_s`` and every
    :meth:`run` by ``timeout_s``; a timeout, a dead actor or a party exception raises
    :class:`~fedmem.errors.MpcFailure` after killing all parties (no output of that
    batch reaches the caller); the next :meth:`run` starts fresh parties. Shares that
    cannot be fetched from a shard host raise ``MpcFailure`` before any party enters the
    protocol (the parties stay warm). ``threads`` is each party's torch intra-op thread count.

    ``shards_sorted=True`` trusts that every shard sends its rows sorted by score
    descending (ties by lower candidate index) with invalid/padding rows last, as
    fedmem's shard hosts do, and skips the in-MPC shard sort of the merge method (about a
    third of its comparisons). Secrecy is unaffected; if a shard breaks the promise the
    top-k may be wrong, including for other shards' candidates, so the default is False.
    It has no effect on ``rank``, ``threshold`` or ``broadcast``.
    """

    def __init__(self, n_parties: int = 2, *, timeout_s: float = 60.0, provider: str = "TFP", threads: int = 1,
                 start_timeout_s: float = 180.0, shards_sorted: bool = False, placement: str = "auto"):
        self.n_parties = V.positive_int("n_parties", n_parties, minimum=2)
        if self.n_parties > 3:
            raise ValueError(f"n_parties must be 2 or 3. Found {n_parties!r}.")
        self.timeout_s = V.positive("timeout_s", timeout_s)
        self.start_timeout_s = V.positive("start_timeout_s", start_timeout_s)
        if provider not in PROVIDERS:
            raise ValueError(f"provider must be one of {PROVIDERS}. Found {provider!r}.")
        self.provider = provider
        self.threads = V.positive_int("threads", threads)
        if not isinstance(shards_sorted, bool):
            raise TypeError(f"shards_sorted must be a bool. Found {shards_sorted!r}.")
        if placement not in PLACEMENTS:
            raise ValueError(f"placement must be one of {PLACEMENTS}. Found {placement!r}.")
        self.shards_sorted = shards_sorted
        self.placement = placement
        self._actors: list = []
        self._ttp = None
        self._ttp_ref = None
        self._pg = None
        self._closed = False
        self.restarts = 0
        self.nodes: list[dict] = []
        self.strategy = None
        self._public_keys: list[bytes] = []
        self._start()

    # -- lifecycle
    def _placement(self, n_actors: int) -> list[dict]:
        """Ray ``.options`` per actor (parties in rank order, then the TTP if any)."""
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        n = self.n_parties
        nodes = _eligible_nodes() if self.placement != "pack" else 0
        if self.placement == "pack" or nodes < n:
            if self.placement == "spread":
                raise MpcFailure(f"placement='spread' needs {n} alive nodes with a CPU; the cluster has {nodes}.")
            if self.placement == "auto":
                import warnings

                warnings.warn(f"the {n} compute parties share one Ray node (the cluster has {nodes} alive node(s) "
                              f"with a CPU): this simulates the protocol but separates no trust. Start one node per "
                              f"party (docs/cluster.md).", SharedNodeWarning, stacklevel=4)
            self.strategy = None
            return [{} for _ in range(n_actors)]
        spread = n_actors if nodes >= n_actors else n
        self._pg = ray.util.placement_group([dict(_BUNDLE) for _ in range(spread)], strategy="STRICT_SPREAD")
        try:
            ray.get(self._pg.ready(), timeout=self.start_timeout_s)
        except Exception as exc:  # noqa: BLE001 - cannot place: fail closed
            self._kill()
            raise MpcFailure(f"compute parties could not be placed on {spread} distinct nodes within "
                             f"{self.start_timeout_s:g} s: {exc!r}") from exc
        self.strategy = "STRICT_SPREAD"
        return [{"scheduling_strategy": PlacementGroupSchedulingStrategy(self._pg, placement_group_bundle_index=i)}
                if i < spread else {} for i in range(n_actors)]

    def _start(self):
        import ray

        ensure_ray()
        actor_cls = ray.remote(num_cpus=0, max_restarts=0)(_CryptenParty)
        n = self.n_parties
        opts = self._placement(n + (self.provider == "TTP"))
        self._actors = [actor_cls.options(**opts[r]).remote(r, n, self.provider, self.threads) for r in range(n)]
        try:
            rdv = ray.get(self._actors[0].endpoint.remote(), timeout=self.start_timeout_s)
            refs = [a.init.remote(rdv) for a in self._actors]
            if self.provider == "TTP":
                self._ttp = actor_cls.options(**opts[n]).remote(n, n, self.provider, self.threads)
                self._ttp_ref = self._ttp.serve_ttp.remote(rdv)
            self.nodes = ray.get(refs, timeout=self.start_timeout_s)
            self._public_keys = ray.get([a.public_key.remote() for a in self._actors], timeout=self.start_timeout_s)
        except Exception as exc:  # noqa: BLE001 - any start failure is an MPC failure
            self._kill()
            raise MpcFailure(f"compute parties failed to start within {self.start_timeout_s:g} s: {exc!r}") from exc
        self.rendezvous = rdv

    def _kill(self):
        import ray

        for a in [*self._actors, *([self._ttp] if self._ttp is not None else [])]:
            kill_actor(a)
        self._actors, self._ttp, self._ttp_ref = [], None, None
        if self._pg is not None:
            try:
                ray.util.remove_placement_group(self._pg)
            except Exception:  # noqa: BLE001 - already gone
                pass
            self._pg = None

    @property
    def public_keys(self) -> list[bytes]:
        """Each party's raw X25519 public key, rank order (restarts stopped parties first, so the
        keys are those of the parties that will run next)."""
        if not self._actors and not self._closed:
            self.restarts += 1
            self._start()
        return list(self._public_keys)

    @property
    def actors(self) -> list:
        """The live party actors (rank order); exposed for fault-injection tests."""
        return list(self._actors)

    def close(self):
        import ray

        if self._closed:
            return
        self._closed = True
        if self._actors:
            try:
                ray.get([a.shutdown.remote() for a in self._actors], timeout=min(10.0, self.timeout_s))
            except Exception:  # noqa: BLE001 - best effort; killed below
                pass
        self._kill()

    # -- compute
    def run(self, packets, spec: SelectionSpec, *, impl: str = "auto", run_id: bytes | None = None) -> Revealed:
        """Secure selection/aggregation; see the module docstring. Never hangs past ``timeout_s``.

        ``packets[p]`` lists party p's packets, one per shard host, as ``SharePacket`` or as
        Ray ``ObjectRef`` to one (what fedmem's shard hosts hand out): refs are fetched
        inside party p's actor, straight from the host's node, so the driver never holds a
        share. Each party fetches, then the parties check among themselves that every one
        got its shares and the same shards (an all-gather of public metadata); only then do
        they enter the protocol (one actor call per party and query).

        ``run_id``: the packets are :class:`~fedmem.federation.sharing.SealedPacket` sealed
        to :attr:`public_keys` for this run (what the engine's hosts send); each party opens
        its own and refuses anything else (fail closed, no party enters the protocol).
        :attr:`public_keys` change when the parties restart.
        """
        import ray

        if self._closed:
            raise MpcFailure("CryptenParties is closed.")
        _check_spec(spec)
        if impl not in IMPLS:
            raise ValueError(f"impl must be one of {IMPLS}. Found {impl!r}.")
        per = _check_packets(packets, self.n_parties)
        if not self._actors:
            self.restarts += 1
            self._start()
        t0 = time.perf_counter()
        deadline = t0 + self.timeout_s
        try:
            # one call per party: fetch, agree (all fetched, same shards and shapes), then the protocol
            refs = [a.load_run.remote(per[r], self.timeout_s, spec, impl, self.shards_sorted, run_id)
                    for r, a in enumerate(self._actors)]
            outs = ray.get(refs, timeout=max(0.001, deadline - time.perf_counter()))
            errors = [o["error"] for o in outs if "error" in o]
            if errors:   # no party entered the protocol: fail closed, parties stay warm
                fetch = [e for e in errors if "could not be fetched" in e]
                raise MpcFailure(f"no output was computed: {(fetch or errors)[0]}")
        except MpcFailure:
            raise
        except Exception as exc:  # noqa: BLE001 - timeout, dead actor or party error: fail closed
            self._kill()
            kind = "timed out" if isinstance(exc, ray.exceptions.GetTimeoutError) else "failed"
            raise MpcFailure(f"secure computation {kind} (timeout {self.timeout_s:g} s); "
                             f"no output reached the caller, parties were stopped: {exc!r}") from exc
        first = outs[0]
        if any(not np.array_equal(o["_ids"], first["_ids"]) for o in outs[1:]):
            self._kill()
            raise MpcFailure("parties received packets from different shards; results discarded.")
        for o in outs[1:]:
            for name in REVEALABLE & set(first):
                if not np.array_equal(o[name], first[name]):
                    raise MpcFailure(f"parties opened different values for {name!r}: inconsistent run.")
        stats = {
            "secure": True,
            "seconds": time.perf_counter() - t0,
            "party_seconds": max(o["_stats"]["seconds"] for o in outs),
            # CPU time of the busiest party process: a load-insensitive measure of the work.
            "party_cpu_seconds": max(o["_stats"]["cpu_seconds"] for o in outs),
            "rounds": first["_stats"]["rounds"],
            # CrypTen logs per party; the system total is the sum over parties halved.
            "bytes": sum(o["_stats"]["bytes"] for o in outs) // 2,
        }
        return Revealed(sum=first.get("sum"), count=first.get("count"), tallies=first.get("tallies"),
                        stats=stats, shard_ids=first["_ids"])
