"""The Flower engine's world: clustered shards and the membership game's candidate records,
built deterministically from a small public spec, so every Flower process rebuilds the same
data instead of receiving it with each message.

:mod:`fedmem.flower.apps` does not import this module (benchmark content is injected, never
imported by ``fedmem.flower``): a world spec names its factory as ``"module:function"``
(``fedmem.flower.apps.WORLD_FACTORY`` by default), resolved at run time in each process.
"""

from __future__ import annotations

import math

import numpy as np

from fedmem.bench.shards import make_clustered_shards, with_record


def clustered_membership_world(s: dict):
    """``(ShardData, targets, with_record)`` of a world spec (the dict of
    :func:`fedmem.flower.apps.world_spec`): the clustered shards, one candidate per target
    (``{"shard", "key", "value", "topic"}``) and the function that adds a candidate to a shard
    (``with_record(data, shard, key, value)``, world 1 of the membership game)."""
    rng = np.random.default_rng(s["seed"])
    data = make_clustered_shards(s["shards"], s["records_per_shard"], s["key_dim"], s["value_dim"], s["clip"],
                                 rng, clusters=s["clusters"], spread=s["spread"])
    trng = np.random.default_rng([s["seed"], 1])
    targets = []
    # Candidates: a record near the rarest topics, placed on a shard that does not hold that topic.
    for t in range(s["targets"]):
        topic = t % len(data.centers)
        holders = {i for i in range(data.n_shards) if np.any(data.topics[i] == topic)}
        free = [i for i in range(data.n_shards) if i not in holders] or list(range(data.n_shards))
        shard = int(free[int(trng.integers(0, len(free)))])
        key = data.centers[topic] + 0.05 * trng.standard_normal(data.key_dim) / math.sqrt(data.key_dim)
        key = key / np.linalg.norm(key)
        val = data.value_centers[topic] * 0.9 * s["clip"]
        targets.append({"shard": shard, "key": key, "value": val, "topic": topic})
    return data, targets, with_record
