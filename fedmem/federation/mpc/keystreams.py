"""Correlated randomness of the compute parties: the AES-CTR keystreams that deal the
two-party TFP triples of :class:`~fedmem.federation.mpc.rounds.Rounds`, their bounded
precomputed pools and the background refill between queries (moved out of ``rounds``).

Both holders of the pairwise key read the same stream as long as they request the same sizes
in the same order (SPMD), so precomputation never changes the values; ``TorchStream`` is the
old ``torch.randint`` generator, kept for before/after benchmarks.
"""

from __future__ import annotations

import os
import secrets
import threading
from collections import deque

import torch

from fedmem.federation.sharing import keystream_words


POOL_MB_DEFAULT = 32
"""Keystream each correlated-randomness stream keeps ready between queries (MiB; bounded
memory: at most this much per stream, two streams per party). ``FEDMEM_TRIPLE_POOL_MB``
overrides; 0 turns precomputation off (everything is drawn on demand)."""

_CHUNK = 1 << 17   # int64 elements generated per refill step (1 MiB): the refill thread stops within one


class KeyStream:
    """AES-256-CTR keystream read as int64 ring elements: a cryptographic PRG.

    Both holders of ``key`` read the same stream as long as they request the same sizes in
    the same order (every party runs the same program, SPMD). Up to ``cap`` elements are
    generated ahead of time by :meth:`refill` (between queries, in a background thread) and
    handed out in stream order by :meth:`take`, so precomputation never changes the values.
    """

    def __init__(self, key: bytes, cap_elements: int):
        from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

        if len(key) != 32:
            raise ValueError(f"key must be 32 bytes. Found {len(key)}.")
        self._enc = Cipher(algorithms.AES(key), modes.CTR(bytes(16))).encryptor()
        self.cap = max(0, int(cap_elements))
        self._pool: deque = deque()
        self._pooled = 0
        self._lock = threading.Lock()

    def _gen(self, n: int) -> torch.Tensor:
        return torch.from_numpy(keystream_words(self._enc, n))

    def take(self, n: int) -> torch.Tensor:
        """The next ``n`` elements of the stream (from the pool first, then freshly generated)."""
        with self._lock:
            parts, need = [], n
            while need and self._pool:
                t = self._pool[0]
                if t.numel() <= need:
                    self._pool.popleft()
                    parts.append(t)
                    need -= t.numel()
                    self._pooled -= t.numel()
                else:
                    parts.append(t[:need])
                    self._pool[0] = t[need:]
                    self._pooled -= need
                    need = 0
            if need:
                parts.append(self._gen(need))
        return parts[0] if len(parts) == 1 else torch.cat(parts)

    def refill(self, stop: threading.Event) -> None:
        """Generate ahead until the pool holds ``cap`` elements or ``stop`` is set."""
        while not stop.is_set():
            with self._lock:
                if self._pooled >= self.cap:
                    return
                n = min(_CHUNK, self.cap - self._pooled)
                self._pool.append(self._gen(n))
                self._pooled += n


class TorchStream:
    """The previous generator, for before/after benchmarks only: ``torch.randint`` on CrypTen's
    seeded generators (Mersenne Twister: not cryptographic), drawn on demand."""

    cap = 0

    def __init__(self, gen):
        self.gen = gen

    def take(self, n: int) -> torch.Tensor:
        return torch.randint(-2**63, 2**63 - 1, (n,), generator=self.gen, dtype=torch.long)

    def refill(self, stop) -> None:
        return None


PRGS = ("aes", "torch")
PRG = {"name": "aes"}
"""The triple generator of this party process: ``"aes"`` (default) or ``"torch"`` (benchmark
baseline; set through ``_CryptenParty.configure``)."""

STREAMS: dict = {}
_PREFILL: dict = {"thread": None, "stop": None}


def pool_elements() -> int:
    mb = os.environ.get("FEDMEM_TRIPLE_POOL_MB")
    mb = POOL_MB_DEFAULT if mb in (None, "") else float(mb)
    if mb < 0:
        raise ValueError(f"FEDMEM_TRIPLE_POOL_MB must be >= 0. Found {mb!r}.")
    return int(mb * (1 << 20)) // 8


def pause_prefill() -> None:
    """Stop the background refill (called when a query starts: the protocol gets the CPU)."""
    th, stop = _PREFILL["thread"], _PREFILL["stop"]
    if th is not None:
        stop.set()
        th.join()
        _PREFILL["thread"] = None


def prefill_async() -> None:
    """Refill every stream's pool in a background thread (called when a query ends)."""
    pause_prefill()
    streams = list(STREAMS.values())
    if not streams or all(s.cap == 0 for pair in streams for s in pair):
        return
    stop = threading.Event()

    def work():
        for pair in streams:
            for s in pair:
                s.refill(stop)

    th = threading.Thread(target=work, name="fedmem-triple-prefill", daemon=True)
    _PREFILL["thread"], _PREFILL["stop"] = th, stop
    th.start()


def party_streams(comm_, group, dist, rank: int):
    """(shared, local) key streams of this party, made once per CrypTen session.

    The shared key is drawn by party 0 (OS randomness) and sent to party 1 once; the local
    key never leaves the party. Same trust model as CrypTen's TFP: party 0 knows every triple."""
    ident = (id(comm_), PRG["name"])
    got = STREAMS.get(ident)
    if got is not None:
        return got
    for old in [k for k in STREAMS if k[0] != ident[0]]:   # streams of an earlier CrypTen session
        del STREAMS[old]
    if PRG["name"] == "torch":
        from crypten import generators

        got = (TorchStream(generators["next" if rank == 0 else "prev"][torch.device("cpu")]),
               TorchStream(generators["local"][torch.device("cpu")]))
        STREAMS[ident] = got
    else:
        key = torch.frombuffer(bytearray(secrets.token_bytes(32)), dtype=torch.long) if rank == 0 else \
            torch.zeros(4, dtype=torch.long)
        dist.broadcast(key, src=0, group=group)
        cap = pool_elements()
        got = (KeyStream(key.numpy().tobytes(), cap), KeyStream(secrets.token_bytes(32), cap))
        STREAMS[ident] = got
    return got
