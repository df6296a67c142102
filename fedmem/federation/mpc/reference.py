"""The plaintext reference: the selection computed on reconstructed values, bit-identical to
the secure program (the ``mpc="plaintext"`` backend and the tests' oracle)."""

from __future__ import annotations

import contextlib
import threading
import time

import numpy as np

from fedmem import _validate as V
from fedmem.errors import MpcFailure
from fedmem.federation.mpc.layout import _check_packets, _check_spec, _resolve, _unseal, assemble, value_rows
from fedmem.federation.mpc.networks.program import IMPLS
from fedmem.federation.parties import Parties
from fedmem.federation.sharing import MASK_FILL, PartyKey, Revealed, SelectionSpec, decode, encode, reconstruct


def plaintext_mask(scores_int: np.ndarray, valid_int: np.ndarray, spec: SelectionSpec) -> np.ndarray:
    """Selection mask (B, N) bool on reconstructed ring elements: the semantic reference."""
    valid = valid_int.astype(bool)
    if spec.mode == "broadcast":
        return valid
    if spec.mode == "threshold":
        return (scores_int >= encode(spec.threshold)) & valid
    B, N = scores_int.shape
    eff = np.where(valid, scores_int + encode(MASK_FILL), 0)
    # Stable sort of -eff: higher effective score first, ties keep the lower flat index first.
    top = np.argsort(-eff, axis=1, kind="stable")[:, : spec.k]
    mask = np.zeros((B, N), dtype=bool)
    np.put_along_axis(mask, top, True, axis=1)
    return mask & valid


KEPT_BUFFER_BYTES = 64 << 20
"""Most bytes of packet buffers :class:`PlaintextParties` keeps between runs, over all its buffers
(a packet that does not fit gets a fresh buffer)."""


class PlaintextParties(Parties):
    """Reference compute parties: reconstruct the shares and select in numpy (no secrecy).

    Same inputs, semantics and outputs as :class:`CryptenParties`; ``stats`` reports
    wall seconds and zero rounds/bytes. Like the secure parties it holds one X25519 key
    pair per party (:attr:`public_keys`) and opens packets sealed to them (``run_id``),
    so the engine's object store holds only ciphertext with either backend.
    """

    def __init__(self, n_parties: int = 2):
        self.n_parties = V.positive_int("n_parties", n_parties, minimum=2)
        self._keys = [PartyKey() for _ in range(self.n_parties)]
        self._public_keys = [k.public for k in self._keys]
        # per (party, host): the buffer its shares are decrypted into, kept for the next batch (a fresh
        # 10 MB buffer is 2,560 pages mapped in again, ~4 ms per packet on the development VM); one run
        # at a time uses them (nothing a run returns refers to them), a concurrent run allocates afresh
        self._buffers: dict = {}
        self._lock = threading.Lock()

    def _buffer(self, party: int, host: int, nbytes: int):
        """The kept buffer of (party, host) with room for ``nbytes``; ``None`` (a fresh buffer) when
        keeping it would hold more than KEPT_BUFFER_BYTES over all kept buffers."""
        buf = self._buffers.get((party, host))
        if buf is not None and buf.nbytes >= nbytes:
            return buf
        others = sum(b.nbytes for k, b in self._buffers.items() if k != (party, host))
        if others + nbytes > KEPT_BUFFER_BYTES:
            return None
        buf = self._buffers[(party, host)] = np.empty(nbytes, dtype=np.uint8)
        return buf

    @property
    def public_keys(self) -> list[bytes]:
        return list(self._public_keys)

    def run(self, packets, spec: SelectionSpec, *, run_id: bytes | None = None, impl: str = "auto") -> Revealed:
        """``packets[p]``: party p's packets, one per shard host (``SharePacket`` or Ray
        ``ObjectRef`` to one; refs are fetched here); sealed to party p when ``run_id`` is given.
        ``impl`` is checked as :class:`CryptenParties` checks it; every protocol selects the same
        records, which this reference computes directly."""
        _check_spec(spec)
        if impl not in IMPLS:
            raise ValueError(f"impl must be one of {IMPLS}. Found {impl!r}.")
        t0 = time.perf_counter()
        with contextlib.ExitStack() as held:
            mine = self._lock.acquire(blocking=False)
            if mine:
                held.callback(self._lock.release)
            return self._run(packets, spec, run_id, t0, mine)

    def _run(self, packets, spec, run_id, t0, kept: bool) -> Revealed:
        # seeds open lazily: only the selected value rows of a seed's share are ever generated
        per = [_unseal(_resolve(p), self._keys[r], run_id, r, lazy=True,
                       buffers=(lambda h, n, r=r: self._buffer(r, h, n)) if kept else None)
               for r, p in enumerate(_check_packets(packets, self.n_parties))]
        per = _check_packets(per, self.n_parties)
        parts = [assemble(p, values=False) for p in per]
        ids, m = parts[0][3], parts[0][4]
        scores = reconstruct([p[0] for p in parts])
        valid = reconstruct([p[2] for p in parts])
        if not np.all((valid == 0) | (valid == 1)):
            raise MpcFailure("valid flags reconstruct to values other than 0/1: inconsistent shares.")
        mask = plaintext_mask(scores, valid, spec)
        B, N = mask.shape
        out = {}
        if "sum" in spec.reveal:
            # ring sum of the selected values = sum over parties of the selected share rows (mod 2^64):
            # no party's values are reconstructed, and no (B, N, d) temporary is built
            ring = np.zeros((B, per[0][0].d), dtype=np.int64)
            b_idx, n_idx = np.nonzero(mask)
            with np.errstate(over="ignore"):
                for p in per:   # the selected rows straight from each host's packet (no concatenation)
                    np.add.at(ring, b_idx, value_rows(p, b_idx, n_idx))
            out["sum"] = decode(ring)
        if "count" in spec.reveal:
            out["count"] = mask.sum(axis=1).astype(np.int64)
        if "tallies" in spec.reveal:
            out["tallies"] = mask.reshape(B, N // m, m).sum(axis=2).astype(np.int64)
        stats = {"seconds": time.perf_counter() - t0, "rounds": 0, "bytes": 0, "secure": False}
        return Revealed(sum=out.get("sum"), count=out.get("count"), tallies=out.get("tallies"),
                        stats=stats, shard_ids=ids)

