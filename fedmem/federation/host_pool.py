"""Idle shard-host actors kept for this driver's next federation (a start-up cost, not a channel).

Starting a shard-host actor costs a Ray worker process: Python, Ray's worker start-up and
fedmem's imports, about 1 s of a core each on the 2-core development machine (measured:
0.23-0.27 s when Ray had a prestarted worker idle, 0.97-1.0 s otherwise). A membership game
builds two federations per target and a scenario run plays several games, so a run used to
start and kill dozens of identical host processes. :meth:`Engine.close
<fedmem.federation.compute.Engine.close>` now hands a healthy host back here *unloaded* (its
shards, keys, values and generator dropped: :meth:`~fedmem.federation.shard_host._HostActor.unload`),
and the next federation's :meth:`~fedmem.federation.compute.Engine._new_host` takes it and
loads its own shards into it (:meth:`~fedmem.federation.shard_host._HostActor.load`: the same
constructor, the same seed from the engine's generator, so the same candidates and shares as a
new actor; tested).

What may come back here: a host of an engine that closes normally and whose hosts are not
suspect (no fault since their last heal). A host of a faulted engine is killed, as before, and a
pooled host that does not answer its ``load`` in time (killed, or still busy with something) is
killed and replaced by a new actor at the same place without failing the federation (it held no
data of it). Pools are per driver process and per Ray connection (a host of a previous
``ray.init`` is never reused), per placement (the node a host was pinned to, or Ray's default),
and bounded by :data:`LIMIT` idle hosts in all (an idle host is an idle Python process, ~100 MB);
beyond it a closing engine kills its hosts as before. The pooled actors are ordinary
(non-detached) actors of this driver: they end with the driver or its Ray instance.
"""

from __future__ import annotations

import threading

LIMIT = 8
"""Idle hosts kept per driver process, all placements together."""

_LOCK = threading.Lock()
_IDLE: dict = {}          # placement key -> [actor, ...]
_OWNER: tuple | None = None


def _connection() -> tuple | None:
    """(job id, driver node id) of this process's Ray connection: unique per ``ray.init``."""
    import ray

    if not ray.is_initialized():
        return None
    ctx = ray.get_runtime_context()
    return ctx.get_job_id(), ctx.get_node_id()


def _current() -> dict:
    """The idle hosts of the current Ray connection (those of an earlier connection are forgotten)."""
    global _OWNER
    conn = _connection()
    if conn != _OWNER:
        _IDLE.clear()
        _OWNER = conn
    return _IDLE


def take(placement) -> object | None:
    """An idle (unloaded) host pinned like ``placement``, or None."""
    with _LOCK:
        idle = _current().get(placement)
        return idle.pop() if idle else None


def give(placement, actor) -> bool:
    """Keep ``actor`` (already sent ``unload``) for a later federation; False when the pool is full
    or Ray is gone (the caller kills it then)."""
    with _LOCK:
        pool = _current()
        if _OWNER is None or sum(len(v) for v in pool.values()) >= LIMIT:
            return False
        pool.setdefault(placement, []).append(actor)
        return True


def idle() -> int:
    """How many idle hosts the current connection holds (tests, diagnostics)."""
    with _LOCK:
        return sum(len(v) for v in _current().values())


def clear() -> list:
    """Forget every idle host and return them (the caller may kill them)."""
    with _LOCK:
        out = [a for v in _IDLE.values() for a in v]
        _IDLE.clear()
        return out
