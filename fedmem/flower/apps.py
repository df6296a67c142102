"""Shards as Flower ClientApps, one query per round, SecAgg+ for the value channel.

Pieces (Flower 1.42 legacy ``Strategy`` API + ``SecAggPlusWorkflow``):

* :func:`build_world` (cached per process): the clustered shards and the membership
  candidates, built deterministically from a small spec, so every Ray worker rebuilds the
  same data instead of receiving it with each message. The spec names the factory that
  builds them (``"module:function"``, :data:`WORLD_FACTORY` by default:
  ``fedmem.bench.membership_world``), resolved at run time: benchmark content is injected,
  never imported by ``fedmem.flower``.
* :class:`ShardClient` (a ``NumPyClient``): one round = one query. Local selection: the
  shard's top-k' by cosine score (ties to the lower index), kept if score >= threshold
  (local threshold selection; **global top-k is out of scope for the Flower engine**:
  it needs a selection across shards, which SecAgg+ cannot compute). It replies with the
  clipped local sum and the local count, ``[sum (value_dim), count]``, encoded on the
  SecAgg+ grid (:mod:`fedmem.flower.fixedpoint`). Contract ``"fedmem"``: always replies,
  ``num_examples = k'`` (a public constant, also SecAgg+'s weight: exactly 1.0), no
  metrics: the count travels only inside the masked vector. Contract ``"stock"``: the
  Flower convention, ``num_examples = local count`` and ``metrics = {"matches": count}``
  (papers/003's per-shard receipts, in plaintext to the server).
* :class:`QueryStrategy`: sends round r's query in ``FitIns.config`` (bytes) with constant
  zero parameters, and turns SecAgg+'s aggregate into the mean over the replies (decoding
  the exact integer sum under the fedmem contract, kept in ``fixed_sums``). Inside
  fedmem's gateway with ``dp="fedmem"`` (``inner_of_gateway=True``) it receives the
  gateway's one noised mean and returns it; ``aggregates`` records what it returned (its
  view, an observer row of the Flower report).
* :class:`Recorder`: the outermost wrapper, recording what the server strategy received
  (reply set, num_examples, metrics, and under the fedmem contract the decoded exact
  SecAgg+ sum: ``fixed_sum``) and what the wrapped strategy returned.

The membership game's two neighbouring datasets are selected per round by
``config["world"]`` (the target shard holds the candidate record only in world 1): a
simulation shortcut so both worlds run in one Flower simulation.
"""

from __future__ import annotations

import functools
import importlib
import json
import time

import numpy as np
from flwr.client import NumPyClient
from flwr.common import FitIns, Parameters, ndarrays_to_parameters, parameters_to_ndarrays
from flwr.server.client_manager import ClientManager
from flwr.server.strategy import Strategy

from fedmem.flower.fixedpoint import SecAggGrid

CONTRACTS = ("fedmem", "stock")


WORLD_FACTORY = "fedmem.bench.membership_world:clustered_membership_world"
"""The world factory a spec without a ``"factory"`` key names: ``factory(spec: dict) ->
(ShardData, targets, with_record)`` (see :mod:`fedmem.bench.membership_world`)."""


def resolve_factory(path: str):
    """The callable a ``"module:function"`` path names (imported here, at run time)."""
    module, _, name = str(path).partition(":")
    if not module or not name:
        raise ValueError(f"a world factory is named 'module:function'. Found {path!r}.")
    return getattr(importlib.import_module(module), name)


@functools.lru_cache(maxsize=4)
def _world_cached(spec_json: str):
    s = json.loads(spec_json)
    return resolve_factory(s.get("factory", WORLD_FACTORY))(s)


def world_spec(*, seed: int, shards: int, records_per_shard: int, key_dim: int, value_dim: int, clip: float,
               clusters: int, spread: float, targets: int, factory: str = WORLD_FACTORY) -> str:
    """The public spec (JSON) of a world; ``factory`` (``"module:function"``) builds it. The
    default factory is not written into the spec (same spec text as before the injection)."""
    spec = dict(seed=seed, shards=shards, records_per_shard=records_per_shard, key_dim=key_dim,
                value_dim=value_dim, clip=clip, clusters=clusters, spread=spread, targets=targets)
    if factory != WORLD_FACTORY:
        spec["factory"] = str(factory)
    return json.dumps(spec, sort_keys=True)


def build_world(spec_json: str):
    """``(ShardData, targets)`` of a spec (cached per process)."""
    data, targets, _ = _world_cached(spec_json)
    return data, targets


def shard_records(spec_json: str, shard: int, world: int, target: int):
    """Keys and values of ``shard`` in the given world (world 1 adds target ``target``'s candidate)."""
    data, targets, with_record = _world_cached(spec_json)
    if world == 1 and 0 <= target < len(targets) and targets[target]["shard"] == shard:
        t = targets[target]
        data = with_record(data, shard, t["key"], t["value"])
    return data.keys[shard], data.values[shard]


def local_selection(keys, values, q, k_local: int, threshold: float) -> tuple[np.ndarray, int]:
    """Local top-k' (ties to the lower index) kept if score >= threshold: (clipped sum, count)."""
    scores = np.asarray(keys, dtype=np.float64) @ np.asarray(q, dtype=np.float64)
    order = np.lexsort((np.arange(scores.size), -scores))[:k_local]
    keep = order[scores[order] >= threshold]
    return np.asarray(values, dtype=np.float64)[keep].sum(axis=0), int(keep.size)


def client_vector(spec_json: str, shard: int, q, world: int, target: int, k_local: int, threshold: float,
                  grid: SecAggGrid) -> np.ndarray:
    """The shard's reply vector ``[sum, count]`` on the SecAgg+ grid."""
    keys, values = shard_records(spec_json, shard, world, target)
    s, c = local_selection(keys, values, q, k_local, threshold)
    return grid.on_grid(np.r_[s, float(c)])


def plaintext_fixed_sum(spec_json: str, q, world: int, target: int, k_local: int, threshold: float,
                        grid: SecAggGrid, shards=None) -> np.ndarray:
    """Reference: the integer sum of every shard's grid coordinates, computed in the clear."""
    data, _ = build_world(spec_json)
    ids = range(data.n_shards) if shards is None else shards
    return sum(grid.encode(client_vector(spec_json, i, q, world, target, k_local, threshold, grid)) for i in ids)


class ShardClient(NumPyClient):
    """One shard (module docstring). ``drop``: {round: True} makes this client fail that round."""

    def __init__(self, spec_json: str, shard: int, *, contract: str, k_local: int, threshold: float,
                 grid: SecAggGrid, drop_rounds=(), offset_units: int = 0, stall_rounds=(), stall_s: float = 0.0):
        if contract not in CONTRACTS:
            raise ValueError(f"contract must be one of {CONTRACTS}. Found {contract!r}.")
        self.spec_json, self.shard, self.contract = spec_json, int(shard), contract
        self.k_local, self.threshold, self.grid = int(k_local), float(threshold), grid
        self.drop_rounds = set(drop_rounds)
        self.stall_rounds = set(stall_rounds)
        self.stall_s = float(stall_s)
        self.offset_units = int(offset_units)

    def fit(self, parameters, config):
        rnd = int(config["round"])
        if rnd in self.drop_rounds:
            raise RuntimeError(f"shard {self.shard} dropped in round {rnd} (injected fault)")
        if rnd in self.stall_rounds:
            # Silent dropout: the reply comes after the round's deadline (the server never hears of it in time).
            time.sleep(self.stall_s)
        q = np.frombuffer(config["query"], dtype=np.float64)
        x = client_vector(self.spec_json, self.shard, q, int(config["world"]), int(config["target"]),
                          self.k_local, self.threshold, self.grid)
        c = int(round(x[-1]))
        # Public offset (Flower DP only): Flower 1.42's fixedclipping_mod divides by the update's norm and
        # raises ZeroDivisionError on an all-zero update (a shard with no match), so the client adds a
        # public constant of `offset_units` grid steps per coordinate; the server subtracts it.
        x = x + self.offset_units * self.grid.step
        if self.contract == "fedmem":
            return [x], self.k_local, {}
        return [x], c, {"matches": c}


def message_bytes_mod(path: str):
    """A client mod that appends ``round,bytes_in,bytes_out`` for every message to ``path``.

    Sizes are the protobuf-serialized message contents (``RecordDict``) as they cross the
    client boundary (outermost mod: SecAgg+'s stage messages and masked vectors included);
    Flower's simulation reports no bytes itself. Lines are short single ``write`` calls on
    an ``O_APPEND`` file, so concurrent actor processes do not interleave them.
    """
    import os

    from flwr.common.serde import recorddict_to_proto

    def mod(msg, context, call_next):
        out = call_next(msg, context)
        b_in = recorddict_to_proto(msg.content).ByteSize()
        b_out = recorddict_to_proto(out.content).ByteSize() if out.has_content() else 0
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, f"{msg.metadata.group_id},{b_in},{b_out}\n".encode())
        finally:
            os.close(fd)
        return out

    return mod


def make_client_app(spec_json: str, *, contract: str, k_local: int, threshold: float, grid: SecAggGrid,
                    flower_dp: bool = False, drops: dict | None = None, offset_units: int | None = None,
                    stalls: dict | None = None, stall_s: float = 0.0, bytes_log: str | None = None):
    """A Flower ``ClientApp`` of shards with ``secaggplus_mod`` (and ``fixedclipping_mod`` for Flower DP).

    ``drops``: {partition_id: [rounds]} clients that fail (raise) in those rounds.
    ``stalls``: {partition_id: [rounds]} clients that reply ``stall_s`` seconds late in those rounds
    (after the round's deadline: a silent dropout, no error message reaches the server).
    ``bytes_log``: a file :func:`message_bytes_mod` appends message sizes to (benchmarks).
    """
    from flwr.client import ClientApp
    from flwr.client.mod import fixedclipping_mod, secaggplus_mod

    drops = {int(k): tuple(v) for k, v in (drops or {}).items()}
    stalls = {int(k): tuple(v) for k, v in (stalls or {}).items()}
    offset = (1 if flower_dp else 0) if offset_units is None else int(offset_units)

    def client_fn(context):
        pid = int(context.node_config["partition-id"])
        return ShardClient(spec_json, pid, contract=contract, k_local=k_local, threshold=threshold, grid=grid,
                           drop_rounds=drops.get(pid, ()), offset_units=offset, stall_rounds=stalls.get(pid, ()),
                           stall_s=stall_s).to_client()

    mods = ([message_bytes_mod(bytes_log)] if bytes_log else []) + [secaggplus_mod] + (
        [fixedclipping_mod] if flower_dp else [])
    return ClientApp(client_fn=client_fn, mods=mods)


class QueryStrategy(Strategy):
    """One query per fit round over all ``num_clients`` nodes (module docstring).

    ``rounds``: list of ``{"query": vector, "world": 0|1, "target": int}``.
    """

    def __init__(self, rounds, *, num_clients: int, value_dim: int, grid: SecAggGrid, contract: str,
                 offset_units: int = 0, inner_of_gateway: bool = False):
        super().__init__()
        # Under the fedmem contract every weight is the same public constant: the aggregate is the
        # unweighted mean (what fedmem's gateway books for dp="flower").
        self.fedmem_mean_aggregate = contract == "fedmem"
        self.inner_of_gateway = bool(inner_of_gateway)
        self.rounds = list(rounds)
        self.num_clients = int(num_clients)
        self.value_dim = int(value_dim)
        self.grid = grid
        self.contract = contract
        self.offset_units = int(offset_units)
        self.fixed_sums: dict[int, np.ndarray] = {}
        self.aggregates: dict[int, np.ndarray] = {}   # what this strategy returned (before any DP wrapper noise)
        self._zero = ndarrays_to_parameters([np.zeros(self.value_dim + 1)])

    def __repr__(self) -> str:
        return f"QueryStrategy(rounds={len(self.rounds)}, num_clients={self.num_clients}, contract={self.contract!r})"

    def initialize_parameters(self, client_manager: ClientManager) -> Parameters | None:
        return self._zero

    def configure_fit(self, server_round: int, parameters: Parameters, client_manager: ClientManager):
        r = self.rounds[server_round - 1]
        clients = client_manager.sample(self.num_clients, min_num_clients=self.num_clients)
        cfg = {"query": np.asarray(r["query"], dtype=np.float64).tobytes(), "world": int(r.get("world", 0)),
               "target": int(r.get("target", -1)), "round": int(server_round)}
        return [(c, FitIns(self._zero, dict(cfg))) for c in clients]

    def aggregate_fit(self, server_round: int, results, failures):
        if not results:
            return None, {}
        # SecAggPlusWorkflow gives every result the same aggregate (the weighted mean).
        agg = parameters_to_ndarrays(results[0][1].parameters)[0].astype(np.float64)
        if self.inner_of_gateway:      # the gateway's one noised mean: nothing to decode
            self.aggregates[server_round] = agg.copy()
            return ndarrays_to_parameters([agg]), {}
        if self.contract == "fedmem":
            fixed = self.grid.decode_mean(agg, len(results)) - self.offset_units * len(results)
            self.fixed_sums[server_round] = fixed
            agg = self.grid.to_float(fixed) / len(results)
        else:
            agg = agg - self.offset_units * self.grid.step
        self.aggregates[server_round] = np.asarray(agg, dtype=np.float64).copy()
        return ndarrays_to_parameters([agg]), {}

    def configure_evaluate(self, server_round, parameters, client_manager):
        return []

    def aggregate_evaluate(self, server_round, results, failures):
        return None, {}

    def evaluate(self, server_round, parameters):
        return None


class Recorder(Strategy):
    """Outermost wrapper: records the server's view (inputs) and the released output of each fit round."""

    def __init__(self, strategy: Strategy, log_sink: list | None = None, grid: SecAggGrid | None = None,
                 offset_units: int = 0):
        super().__init__()
        self.strategy = strategy
        self.grid, self.offset_units = grid, int(offset_units)   # grid: decode the exact SecAgg+ sum (fedmem contract)
        self.records: dict[int, dict] = {}
        self.log_sink = log_sink      # a list a logging handler appends to (Flower's warnings), or None

    def __repr__(self) -> str:
        return f"Recorder({self.strategy!r})"

    def initialize_parameters(self, client_manager):
        return self.strategy.initialize_parameters(client_manager)

    def configure_fit(self, server_round, parameters, client_manager):
        ins = self.strategy.configure_fit(server_round, parameters, client_manager)
        self.records[server_round] = {"round": server_round, "sampled": len(ins), "replied": [], "num_examples": [],
                                      "metrics": [], "failures": 0, "output": None, "configured": bool(ins),
                                      "t_configured": time.perf_counter()}
        return ins

    def aggregate_fit(self, server_round, results, failures):
        rec = self.records.setdefault(server_round, {"round": server_round, "sampled": 0, "output": None,
                                                     "configured": False})
        rec["replied"] = [int(p.node_id) for p, _ in results]
        rec["num_examples"] = [int(r.num_examples) for _, r in results]
        rec["metrics"] = [dict(r.metrics or {}) for _, r in results]
        rec["failures"] = len(failures)
        if self.grid is not None and results:
            agg = parameters_to_ndarrays(results[0][1].parameters)[0].astype(np.float64)
            rec["fixed_sum"] = self.grid.decode_mean(agg, len(results)) - self.offset_units * len(results)
        rec["t_replied"] = time.perf_counter()
        n0 = len(self.log_sink) if self.log_sink is not None else 0
        params, metrics = self.strategy.aggregate_fit(server_round, results, failures)
        rec["warnings"] = list(self.log_sink[n0:]) if self.log_sink is not None else []
        rec["output"] = None if params is None else parameters_to_ndarrays(params)[0].astype(np.float64)
        rec["output_metrics"] = dict(metrics or {})
        rec["t_aggregated"] = time.perf_counter()
        return params, metrics

    def configure_evaluate(self, server_round, parameters, client_manager):
        return self.strategy.configure_evaluate(server_round, parameters, client_manager)

    def aggregate_evaluate(self, server_round, results, failures):
        return self.strategy.aggregate_evaluate(server_round, results, failures)

    def evaluate(self, server_round, parameters):
        return self.strategy.evaluate(server_round, parameters)
