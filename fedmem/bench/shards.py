"""Synthetic clustered memory shards for federated retrieval (numpy only).

papers/003 observed that *which* and *how many* of 40 shards contribute to a retrieval
varied from 3 to 40 with the query. :func:`make_clustered_shards` reproduces that shape
of data: keys are unit vectors drawn around ``clusters`` topic centres; each topic has a
*prevalence* (the fraction of shards that hold records on it) spread log-uniformly from
about 3/40 up to 1, and each shard draws its topics independently by prevalence (at
least one topic per shard). A query near a rare topic therefore reaches a few shards and
a query near a common topic reaches nearly all of them. Values are per-topic directions
plus noise, clipped to L2 norm ``clip``, so a released mean is meaningful (it points
toward the queried topic's value direction) and utility can be measured.

A record is ``(key, value)`` plus, optionally, a short text. Neighbouring datasets for
membership attacks are built with :func:`with_record` / :func:`without_record`
(add/remove-one-record adjacency, the adjacency fedmem's aggregator is calibrated for).
Nothing here imports torch: shard hosts use these arrays directly.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from fedmem import _validate as V

QUERY_KINDS = ("cluster", "record", "uniform")


def _unit(x: np.ndarray) -> np.ndarray:
    n = np.linalg.norm(x, axis=-1, keepdims=True)
    return x / np.where(n > 0, n, 1.0)


def _clip(x: np.ndarray, clip: float) -> np.ndarray:
    n = np.linalg.norm(x, axis=-1, keepdims=True)
    return x * np.minimum(1.0, clip / np.where(n > 0, n, 1.0))


@dataclass(frozen=True)
class ShardData:
    """Per-shard records. ``keys[i]`` (n_i, key_dim) unit-norm; ``values[i]`` (n_i, value_dim) with norm <= clip.

    ``centers`` (clusters, key_dim) are the topic centres (public to the experimenter,
    not to the adversary); ``topics[i]`` the topic of each record of shard ``i`` (for
    evaluation); ``texts`` optional per-record strings. Shard sizes ``n_i`` are treated
    as public metadata (they fix the padded message sizes anyway).
    """

    keys: list
    values: list
    centers: np.ndarray
    texts: list | None = None
    clip: float = 1.0
    topics: list | None = None
    value_centers: np.ndarray | None = field(default=None, repr=False)
    recipe: object | None = field(default=None, repr=False, compare=False)
    """The :class:`ShardRecipe` these shards were built from (``ShardRecipe.build()``), or None.
    A :class:`~fedmem.federation.engine.Federation` given data with a recipe lets every
    host generate its own shards from it (no record leaves the driver); the modified
    neighbours of :func:`with_record` / :func:`without_record` carry no recipe."""

    def __post_init__(self):
        V.positive("clip", self.clip)
        if not isinstance(self.keys, list) or not isinstance(self.values, list):
            raise TypeError(f"keys and values must be lists of per-shard arrays. Found {type(self.keys).__name__}, "
                            f"{type(self.values).__name__}.")
        if len(self.keys) == 0 or len(self.keys) != len(self.values):
            raise ValueError(f"keys and values must list the same, non-zero number of shards. Found "
                             f"{len(self.keys)} and {len(self.values)}.")
        kd, vd = self.keys[0].shape[1], self.values[0].shape[1]
        for i, (k, v) in enumerate(zip(self.keys, self.values)):
            if k.ndim != 2 or v.ndim != 2 or k.shape[0] != v.shape[0] or k.shape[1] != kd or v.shape[1] != vd:
                raise ValueError(f"shard {i} must hold keys (n, {kd}) and values (n, {vd}). Found {k.shape}, {v.shape}.")
        if self.texts is not None and [len(t) for t in self.texts] != self.sizes.tolist():
            raise ValueError("texts must hold one string per record of every shard.")
        if self.recipe is not None:
            r = self.recipe
            if not getattr(r, "generated_at_hosts", False):
                raise TypeError(f"recipe must be a ShardRecipe. Found {type(r).__name__}.")
            if (r.shards, r.key_dim, r.value_dim) != (self.n_shards, self.key_dim, self.value_dim) or \
                    not np.array_equal(r.sizes, self.sizes):
                raise ValueError(f"recipe must describe these shards ({self.n_shards} shards, key_dim {self.key_dim}, "
                                 f"value_dim {self.value_dim}). Found {r!r}.")

    @property
    def n_shards(self) -> int:
        return len(self.keys)

    @property
    def key_dim(self) -> int:
        return int(self.keys[0].shape[1])

    @property
    def value_dim(self) -> int:
        return int(self.values[0].shape[1])

    @property
    def sizes(self) -> np.ndarray:
        return np.array([k.shape[0] for k in self.keys], dtype=np.int64)


def make_clustered_shards(shards: int, records_per_shard: int, key_dim: int, value_dim: int, clip: float,
                          rng: np.random.Generator, *, clusters: int = 12, spread: float = 0.35,
                          min_prevalence: float | None = None, texts: bool = False,
                          dtype=np.float64) -> ShardData:
    """Clustered shards: rare topics live on few shards, common topics on almost all.

    Topic ``c`` has prevalence ``p_c`` log-spaced from ``min_prevalence`` (default
    ``min(1, 3 / shards)``, papers/003's "3 of 40") to 1; shard ``i`` holds topic ``c``
    with probability ``p_c``. Keys: ``unit(center_c + spread * g / sqrt(key_dim))``;
    values: ``clip(0.8 * clip * u_c + 0.3 * clip * g / sqrt(value_dim))``.
    ``dtype=np.float32`` halves memory for very large federations.
    """
    S = V.positive_int("shards", shards)
    n = V.positive_int("records_per_shard", records_per_shard)
    kd = V.positive_int("key_dim", key_dim)
    vd = V.positive_int("value_dim", value_dim)
    clip = V.positive("clip", clip)
    V.rng_check("rng", rng)
    C = V.positive_int("clusters", clusters)
    spread = V.positive("spread", spread)
    lo = min(1.0, 3.0 / S) if min_prevalence is None else V.positive("min_prevalence", min_prevalence)
    if lo > 1.0:
        raise ValueError(f"min_prevalence must be <= 1. Found {min_prevalence!r}.")
    if np.dtype(dtype) not in (np.dtype(np.float32), np.dtype(np.float64)):
        raise ValueError(f"dtype must be float32 or float64. Found {dtype!r}.")

    centers = _unit(rng.standard_normal((C, kd)))
    value_centers = _unit(rng.standard_normal((C, vd)))
    prevalence = np.geomspace(lo, 1.0, C) if C > 1 else np.ones(1)
    holds = rng.random((S, C)) < prevalence  # (S, C) which topics each shard holds
    empty = ~holds.any(axis=1)
    holds[np.flatnonzero(empty), rng.integers(0, C, size=int(empty.sum()))] = True

    keys, values, topics, txt = [], [], [], [] if texts else None
    for i in range(S):
        mine = np.flatnonzero(holds[i])
        t = mine[rng.integers(0, len(mine), size=n)]
        k = _unit(centers[t] + spread * rng.standard_normal((n, kd)) / np.sqrt(kd))
        v = _clip(0.8 * clip * value_centers[t] + 0.3 * clip * rng.standard_normal((n, vd)) / np.sqrt(vd), clip)
        keys.append(k.astype(dtype))
        values.append(_clip(v.astype(dtype), clip).astype(dtype))
        topics.append(t.astype(np.int64))
        if texts:
            txt.append([f"shard {i} record {j}: note on topic {int(t[j])}" for j in range(n)])
    return ShardData(keys=keys, values=values, centers=centers, texts=txt, clip=clip, topics=topics,
                     value_centers=value_centers)


def _replace_shard(data: ShardData, shard: int, keys, values, topics, texts) -> ShardData:
    ks, vs = list(data.keys), list(data.values)
    ks[shard], vs[shard] = keys, values
    tp = None
    if data.topics is not None:
        tp = list(data.topics)
        tp[shard] = topics
    tx = None
    if data.texts is not None:
        tx = list(data.texts)
        tx[shard] = texts
    return ShardData(keys=ks, values=vs, centers=data.centers, texts=tx, clip=data.clip, topics=tp,
                     value_centers=data.value_centers)


def _check_shard(data: ShardData, shard) -> int:
    s = V.positive_int("shard", shard, minimum=0)
    if s >= data.n_shards:
        raise ValueError(f"shard must be < {data.n_shards}. Found {shard!r}.")
    return s


def with_record(data: ShardData, shard: int, key, value, *, text: str | None = None, topic: int = -1) -> ShardData:
    """Neighbour of ``data`` with one record appended to ``shard`` (key normalised, value clipped check).

    ``value`` must already satisfy ``||value|| <= clip`` (raises ``ValueError`` rather
    than silently clipping, so an attack's candidate is exactly what was asked for).
    """
    s = _check_shard(data, shard)
    k = V.finite_array("key", key, ndim=1, dim=data.key_dim)
    v = V.finite_array("value", value, ndim=1, dim=data.value_dim)
    nk = float(np.linalg.norm(k))
    if nk == 0.0:
        raise ValueError("key must be non-zero. Found the zero vector.")
    if np.linalg.norm(v) > data.clip * (1 + 1e-9):
        raise ValueError(f"value must have L2 norm <= clip={data.clip}. Found {np.linalg.norm(v)!r}.")
    dt = data.keys[s].dtype
    keys = np.vstack([data.keys[s], (k / nk).astype(dt)[None]])
    values = np.vstack([data.values[s], v.astype(dt)[None]])
    topics = None if data.topics is None else np.append(data.topics[s], np.int64(topic))
    texts = None if data.texts is None else [*data.texts[s], text or f"shard {s} inserted record"]
    return _replace_shard(data, s, keys, values, topics, texts)


def without_record(data: ShardData, shard: int, index: int) -> ShardData:
    """Neighbour of ``data`` with record ``index`` of ``shard`` removed."""
    s = _check_shard(data, shard)
    n_i = data.keys[s].shape[0]
    i = V.positive_int("index", index, minimum=0)
    if i >= n_i:
        raise ValueError(f"index must be < {n_i} (records on shard {s}). Found {index!r}.")
    keep = np.arange(n_i) != i
    topics = None if data.topics is None else data.topics[s][keep]
    texts = None if data.texts is None else [t for j, t in enumerate(data.texts[s]) if j != i]
    return _replace_shard(data, s, data.keys[s][keep], data.values[s][keep], topics, texts)


def sample_queries(data: ShardData, n: int, rng: np.random.Generator, *, kind: str = "cluster",
                   noise: float = 0.25) -> np.ndarray:
    """``n`` unit query vectors (n, key_dim).

    ``cluster``: a uniformly chosen topic centre plus ``noise`` (relative); ``record``: a
    uniformly chosen stored key plus noise; ``uniform``: uniform on the sphere.
    """
    n = V.positive_int("n", n)
    V.rng_check("rng", rng)
    noise = V.nonnegative("noise", noise)
    if kind not in QUERY_KINDS:
        raise ValueError(f"kind must be one of {QUERY_KINDS}. Found {kind!r}.")
    d = data.key_dim
    g = rng.standard_normal((n, d)) / np.sqrt(d)
    if kind == "uniform":
        return _unit(g)
    if kind == "cluster":
        base = data.centers[rng.integers(0, len(data.centers), size=n)]
    else:
        sizes = data.sizes
        shard = rng.choice(len(sizes), size=n, p=sizes / sizes.sum())
        base = np.stack([data.keys[s][rng.integers(0, sizes[s])] for s in shard]).astype(np.float64)
    return _unit(base + noise * g)


# --------------------------------------------------------------------------- data generated at the hosts

@dataclass(frozen=True)
class ShardRecipe:
    """Clustered shards defined by a seed, so that every shard host can generate its own.

    Same model as :func:`make_clustered_shards` (topic prevalences, keys around topic
    centres, clipped values), but every shard has its **own** random stream:
    the public layout (``centers``, ``value_centers``, which topics each shard holds)
    comes from ``SeedSequence(seed, spawn_key=(0,))`` and shard ``i``'s records from
    ``SeedSequence(seed, spawn_key=(1, i))``. Hence :meth:`shard` gives shard ``i``
    identically in any process, in any order, and :meth:`build` (all shards in one
    process) equals what the hosts generate for their ranges. The records themselves
    never have to pass through the driver: pass the recipe to
    :class:`~fedmem.federation.engine.Federation` as ``data`` and each host builds its
    shards (``ShardHostCore(..., recipe=...)``). Not the same draws as
    :func:`make_clustered_shards` with an rng of the same seed (a different stream layout).
    """

    shards: int
    records_per_shard: int
    key_dim: int
    value_dim: int
    seed: int
    clip: float = 1.0
    clusters: int = 12
    spread: float = 0.35
    min_prevalence: float | None = None
    dtype: str = "float64"

    generated_at_hosts = True   # marker for the engine: send the recipe, not the records

    def __post_init__(self):
        for name in ("shards", "records_per_shard", "key_dim", "value_dim", "clusters"):
            V.positive_int(name, getattr(self, name))
        V.positive("clip", self.clip)
        V.positive("spread", self.spread)
        if isinstance(self.seed, bool) or not isinstance(self.seed, (int, np.integer)) or self.seed < 0:
            raise ValueError(f"seed must be a non-negative integer. Found {self.seed!r}.")
        if self.dtype not in ("float32", "float64"):
            raise ValueError(f"dtype must be 'float32' or 'float64'. Found {self.dtype!r}.")
        lo = self._lo()
        if not 0 < lo <= 1.0:
            raise ValueError(f"min_prevalence must be in (0, 1]. Found {self.min_prevalence!r}.")

    def _lo(self) -> float:
        return min(1.0, 3.0 / self.shards) if self.min_prevalence is None else float(self.min_prevalence)

    def layout(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(centers (C, key_dim), value_centers (C, value_dim), holds (S, C) bool)``: public structure."""
        rng = np.random.default_rng(np.random.SeedSequence(int(self.seed), spawn_key=(0,)))
        C, S = self.clusters, self.shards
        centers = _unit(rng.standard_normal((C, self.key_dim)))
        value_centers = _unit(rng.standard_normal((C, self.value_dim)))
        prevalence = np.geomspace(self._lo(), 1.0, C) if C > 1 else np.ones(1)
        holds = rng.random((S, C)) < prevalence
        empty = ~holds.any(axis=1)
        holds[np.flatnonzero(empty), rng.integers(0, C, size=int(empty.sum()))] = True
        return centers, value_centers, holds

    def shard(self, i: int, layout=None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Shard ``i``'s ``(keys, values, topics)``, identical wherever it is generated."""
        i = V.positive_int("i", i, minimum=0)
        if i >= self.shards:
            raise ValueError(f"i must be < shards={self.shards}. Found {i!r}.")
        centers, value_centers, holds = self.layout() if layout is None else layout
        rng = np.random.default_rng(np.random.SeedSequence(int(self.seed), spawn_key=(1, i)))
        n, kd, vd, clip, dt = self.records_per_shard, self.key_dim, self.value_dim, self.clip, np.dtype(self.dtype)
        mine = np.flatnonzero(holds[i])
        t = mine[rng.integers(0, len(mine), size=n)]
        k = _unit(centers[t] + self.spread * rng.standard_normal((n, kd)) / np.sqrt(kd))
        v = _clip(0.8 * clip * value_centers[t] + 0.3 * clip * rng.standard_normal((n, vd)) / np.sqrt(vd), clip)
        return k.astype(dt), _clip(v.astype(dt), clip).astype(dt), t.astype(np.int64)

    def shards_for(self, ids) -> tuple[list, list]:
        """``(keys, values)`` lists of the shards ``ids`` (what one host generates)."""
        lay = self.layout()
        got = [self.shard(int(i), lay) for i in ids]
        return [g[0] for g in got], [g[1] for g in got]

    def build(self) -> ShardData:
        """Every shard in this process (the single-process reference of the hosts' data)."""
        lay = self.layout()
        got = [self.shard(i, lay) for i in range(self.shards)]
        return ShardData(keys=[g[0] for g in got], values=[g[1] for g in got], centers=lay[0], clip=self.clip,
                         topics=[g[2] for g in got], value_centers=lay[1], recipe=self)

    # what the engine and sample_queries(kind="cluster") read; public by construction
    @property
    def n_shards(self) -> int:
        return self.shards

    @property
    def sizes(self) -> np.ndarray:
        return np.full(self.shards, self.records_per_shard, dtype=np.int64)

    @property
    def centers(self) -> np.ndarray:
        return self.layout()[0]


def clustered_data(shards: int, records_per_shard: int, key_dim: int, value_dim: int, clip: float,
                   rng: np.random.Generator, *, clusters: int = 12, spread: float = 0.35,
                   at_hosts: bool = False) -> ShardData:
    """The scenario's clustered shards: :func:`make_clustered_shards`, or with ``at_hosts``
    a :class:`ShardRecipe` (seed drawn from ``rng``) built here for evaluation and carried
    in ``ShardData.recipe``, so that a Federation's hosts generate the identical shards
    themselves (scenario key ``federation.generate_at_hosts``). The two are different
    random streams: switching changes the data, not its distribution."""
    if not isinstance(at_hosts, bool):
        raise TypeError(f"at_hosts must be a bool. Found {at_hosts!r}.")
    if not at_hosts:
        return make_clustered_shards(shards, records_per_shard, key_dim, value_dim, clip, rng, clusters=clusters,
                                     spread=spread)
    V.rng_check("rng", rng)
    return ShardRecipe(shards=shards, records_per_shard=records_per_shard, key_dim=key_dim, value_dim=value_dim,
                       seed=int(rng.integers(0, 2**63)), clip=clip, clusters=clusters, spread=spread).build()
