"""How share packets from the shard hosts are assembled into one party's tensors (and
resolved when they arrive as Ray object refs)."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from fedmem.errors import MpcFailure
from fedmem.federation.sharing import SealedPacket, SeedShares, SelectionSpec, SharePacket


def assemble(packets: Sequence[SharePacket], *, values: bool = True):
    """Concatenate one party's packets from every shard host in ascending shard-id order.

    Returns ``(scores (B, N), values (B, N, d), valid (B, N), shard_ids (S,), m)`` with
    flat candidate index ``j = s * m + c`` (``s`` = position of the shard in ascending
    global id order, ``c`` = candidate index within the shard). ``values=False`` leaves the
    values where they are (``None`` in their place; :func:`value_rows` reads selected rows) and
    also takes :class:`~fedmem.federation.sharing.SeedShares`.
    """
    packets = list(packets)
    if not packets:
        raise ValueError("packets must hold at least one SharePacket per party. Found [].")
    kinds = SharePacket if values else (SharePacket, SeedShares)   # a SeedShares has no values array
    for p in packets:
        if not isinstance(p, kinds):
            raise TypeError(f"packets must be SharePacket objects{'' if values else ' or SeedShares'}. "
                            f"Found {type(p).__name__}.")
    B, m, d = packets[0].batch, packets[0].m, packets[0].d
    for p in packets[1:]:
        if (p.batch, p.m, p.d) != (B, m, d):
            raise ValueError(f"packets must agree on (batch, m, d) = {(B, m, d)}. Found {(p.batch, p.m, p.d)}.")
    ids = np.concatenate([p.shard_ids for p in packets]).astype(np.int64)
    if len(np.unique(ids)) != len(ids):
        raise ValueError(f"shard_ids must be distinct across shard hosts. Found duplicates in {ids.tolist()!r}.")
    order = _shard_order(packets)
    S = len(ids)
    in_order = np.array_equal(order, np.arange(S))   # e.g. hosts holding ascending id ranges (split_shards)

    def cat(name):   # one host in order: a view; hosts in order: one copy; else a copy and a gather
        x = getattr(packets[0], name) if len(packets) == 1 else np.concatenate([getattr(p, name) for p in packets],
                                                                                axis=1)
        return x if in_order else x[:, order]

    return (cat("scores").reshape(B, S * m), cat("values").reshape(B, S * m, d) if values else None,
            cat("valid").reshape(B, S * m), ids[order], m)


def _shard_order(packets: Sequence[SharePacket]) -> np.ndarray:
    """For the s-th shard in ascending global id order, its position in the hosts' concatenation."""
    return np.argsort(np.concatenate([p.shard_ids for p in packets]), kind="stable")


def value_rows(packets: Sequence[SharePacket], b_idx: np.ndarray, n_idx: np.ndarray) -> np.ndarray:
    """``values[b_idx, n_idx]`` of :func:`assemble`'s layout (rows (len(b_idx), d)), read from the
    hosts' packets without concatenating them (the plaintext reference's selected rows)."""
    packets = list(packets)
    m = packets[0].m
    order = _shard_order(packets)
    starts = np.cumsum([0] + [len(p.shard_ids) for p in packets])
    g = order[np.asarray(n_idx) // m]                       # shard's position in the hosts' concatenation
    c = np.asarray(n_idx) % m
    h = np.searchsorted(starts, g, side="right") - 1      # its host
    out = np.empty((len(g), packets[0].d), dtype=np.int64)
    for i, p in enumerate(packets):   # every host, selected rows or none (no branch on which hosts were selected)
        sel = np.nonzero(h == i)[0]
        out[sel] = p.value_rows(np.asarray(b_idx)[sel], g[sel] - starts[i], c[sel])
    return out


def _check_packets(packets, n_parties: int):
    if not isinstance(packets, (list, tuple)) or len(packets) != n_parties:
        got = len(packets) if isinstance(packets, (list, tuple)) else type(packets).__name__
        raise ValueError(f"packets must be a list with one entry per party ({n_parties}). Found {got}.")
    per = [list(p) if isinstance(p, (list, tuple)) else [p] for p in packets]
    n_hosts = {len(p) for p in per}
    if len(n_hosts) != 1:
        raise ValueError(f"packets must give every party the same number of host packets. Found {sorted(n_hosts)}.")
    if any(_is_ref(x) for party in per for x in party):
        return per  # resolved inside each party; shard ids are cross-checked on the results
    ref = [tuple(x.shard_ids.tolist()) for x in per[0]]
    for party in per[1:]:
        if [tuple(x.shard_ids.tolist()) for x in party] != ref:
            raise ValueError("packets must list the same shard hosts (same shard_ids, same order) for every party.")
    return per


def _is_ref(x) -> bool:
    try:
        import ray
    except ImportError:  # pragma: no cover - ray is a hard dependency
        return False
    return isinstance(x, ray.ObjectRef)


def _resolve(packets, timeout_s: float | None = None):
    """Fetch any Ray ObjectRefs among one party's packets (inside that party's process).

    A ref whose shard host (its owner) died, a lost object or a timeout raises
    :class:`~fedmem.errors.MpcFailure`: the caller must fail closed.
    """
    packets = list(packets)
    idx = [i for i, x in enumerate(packets) if _is_ref(x)]
    if idx:
        import ray

        try:
            got = ray.get([packets[i] for i in idx], timeout=timeout_s)
        except Exception as exc:  # noqa: BLE001 - dead host, lost object, timeout: fail closed
            raise MpcFailure(f"shares could not be fetched from the shard hosts: {exc!r}") from exc
        for i, g in zip(idx, got):
            packets[i] = g
    return packets


def _check_spec(spec):
    if not isinstance(spec, SelectionSpec):
        raise TypeError(f"spec must be a SelectionSpec. Found {type(spec).__name__}.")


def _unseal(packets, key, run_id: bytes | None, rank: int, *, lazy: bool = False, buffers=None):
    """Open one party's fetched packets with its :class:`~fedmem.federation.sharing.PartyKey`.

    With a ``run_id`` (the engine's sealed path) every packet must be a
    :class:`~fedmem.federation.sharing.SealedPacket` for this run and rank, and open under
    this party's key; anything else (a plaintext packet, another run's or party's packet, a
    modified byte) raises :class:`~fedmem.errors.MpcFailure`: fail closed. Without one
    (direct use with in-memory packets) sealed packets are refused, plaintext ones pass.

    ``lazy``: seed packets open as :class:`~fedmem.federation.sharing.SeedShares`
    (:meth:`PartyKey.open`). ``buffers``: ``None`` or a callable ``(i, ciphertext bytes) ->
    writable uint8 array or None``, the buffer the i-th packet's shares are decrypted into
    (``PartyKey.open(into=...)``)."""
    packets = list(packets)
    if run_id is None:
        if any(isinstance(p, SealedPacket) for p in packets):
            raise MpcFailure("sealed packets need the run id they were sealed for; no output was computed.")
        return packets
    if key is None:
        raise MpcFailure("this party has no key to open sealed packets; no output was computed.")
    try:
        return [key.open(p, run_id, rank, lazy=lazy,
                         into=None if buffers is None or getattr(p, "kind", None) != "shares"
                         else buffers(i, len(p.ciphertext)))
                for i, p in enumerate(packets)]
    except ValueError as exc:
        raise MpcFailure(f"sealed share packet refused: {exc}") from None
