"""Fused communication rounds for the compute parties (runs inside one CrypTen party).

CrypTen's ``MPCTensor`` layer costs about 2 ms of Python per protocol step on a 2-core
machine (config look-ups through omegaconf, validation hooks, wrapper objects), which
for a 40-shard top-k was most of the 0.12 s of a query, and it runs one protocol at a
time: two independent multiplications take two rounds. This module runs the same
protocols on the raw ``int64`` share tensors, with CrypTen's own communicator (gloo)
and CrypTen's correlated randomness (the trust model is unchanged, see
``docs/federation-mpc.md``), and lets independent sub-protocols share rounds. With 2
parties and the ``TFP`` provider the triples are dealt as CrypTen's TFP deals them, party
0 knowing them, but party 1's shares come straight from the seed it shares with party 0
(:meth:`Rounds.triple`), which halves the random numbers drawn; otherwise (``TTP``, 3
parties) the provider's own ``generate_additive_triple`` / ``generate_binary_triple`` /
``B2A_rng`` are used.

A sub-protocol is a Python generator that yields a list of *requests* for the next
round and receives their results:

* ``("mul", op, x, y)``: arithmetic shares of ``op(x, y)`` (``op`` in ``"mul"``,
  ``"matmul"``; Beaver triple from the provider, one opening of ``x - a``, ``y - b``);
* ``("and", x, y)``: XOR shares of ``x & y`` (binary Beaver triple);
* ``("b2a", bit, ys)``: arithmetic shares of the XOR-shared bit ``bit & 1`` and of
  ``bit * y`` for every ``(y, nd)`` in ``ys`` (``bit`` viewed with ``nd`` trailing unit
  axes), in ONE round: a random bit shared both ways ``(rA, rB)`` is used to open
  ``z = bit ^ rB`` while ``rA * y`` is computed by Beaver at the same time, so
  ``bit = z + (1 - 2z) rA`` and ``bit * y = z y + (1 - 2z) (rA y)`` are linear afterwards;
* ``("open", x)``: the plaintext of arithmetic shares ``x`` (every party gets it).

:meth:`Rounds.drive` runs a generator; :func:`par` merges several generators so that
their requests of the same step travel in one exchange (one ``all_reduce`` for all
arithmetic openings and one for all XOR openings, issued together; logged as one round
with CrypTen's byte accounting: ``2 * elements`` per party per ``all_reduce``).

Comparison (:meth:`Rounds.ltz`): shares of ``[x < 0]`` for ring elements known to lie
in ``(-2^L, 2^L)`` (a public bound). Each party's arithmetic share becomes a trivial
XOR sharing (its own value, zeros elsewhere; safe because every AND opening is masked
by a fresh triple); with 3 parties one carry-save layer (one round) reduces three
addends to two; then a Kogge-Stone carry network finds the carry into bit ``L``
(``1 + ceil(log2 L)`` rounds) and bit ``L`` of the sum, the sign, is converted to an
arithmetic bit (one round, fused with any products by that bit). ``L = 63`` is the
general case (8 rounds with 2 parties, as CrypTen's ``_ltz``); small public ranges,
like ranks compared with ``k``, need ``L <= 8`` and 5 rounds.

The correlated randomness behind the TFP triples (AES-CTR keystreams, their pools and the
background refill) lives in :mod:`fedmem.federation.mpc.keystreams`.
"""

from __future__ import annotations

import math

import torch

# The keystreams live in keystreams.py (runtime.CryptenParty.configure uses them there); the
# names below are re-exported for scripts and tests that import them from rounds.
from fedmem.federation.mpc.keystreams import (POOL_MB_DEFAULT, PRG, PRGS, KeyStream, TorchStream,  # noqa: F401
                                              party_streams, pause_prefill, pool_elements, prefill_async)

__all__ = ["BIG", "L_FULL", "POOL_MB_DEFAULT", "PRG", "PRGS", "KeyStream", "Rounds", "TorchStream", "bits_for",
           "ltz_rounds", "mul", "par", "pause_prefill", "pool_elements", "prefill_async"]

L_FULL = 63
BIG = 1 << 20
"""Tensors with at least this many elements are opened by their own collective, in place."""


def bits_for(bound: int) -> int:
    """Smallest ``L`` with ``2**L > bound`` (values in ``(-2^L, 2^L)``), at most 63."""
    bound = int(bound)
    if bound < 0:
        raise ValueError(f"bound must be >= 0. Found {bound!r}.")
    return min(L_FULL, max(1, bound.bit_length()))


def par(*gens):
    """Run sub-protocol generators side by side: one merged request list per round.

    Returns the list of their return values (in order)."""
    results = [None] * len(gens)
    sends = [None] * len(gens)
    active = list(range(len(gens)))
    while True:
        reqs = {}
        for i in list(active):
            try:
                r = gens[i].send(sends[i])
            except StopIteration as stop:
                results[i] = stop.value
                active.remove(i)
                continue
            if not r:
                raise RuntimeError("a sub-protocol yielded an empty round")
            reqs[i] = r
        if not reqs:
            return results
        answers = yield [q for i in reqs for q in reqs[i]]
        pos = 0
        for i, r in reqs.items():
            sends[i] = answers[pos:pos + len(r)]
            pos += len(r)


def mul(op, x, y):
    """Sub-protocol: shares of ``op(x, y)`` (one round)."""
    (z,) = yield [("mul", op, x, y)]
    return z


class Rounds:
    """The fused-round engine of one party (CrypTen must be initialised in this process)."""

    def __init__(self):
        import crypten
        import crypten.communicator as comm
        import torch.distributed as dist

        self.comm = comm.get()
        self.rank = self.comm.get_rank()
        self.n = self.comm.get_world_size()
        self.provider = crypten.mpc.get_default_provider()
        self.group = self.comm.main_group
        self.dist = dist
        self.verbose = bool(crypten.cfg.communicator.verbose)
        self.rounds = 0
        # Two parties with the trusted-first-party provider: triples dealt from the pairwise
        # seed instead of the provider's PRZS sharings (same trust model, half the randomness)
        self.fast_tfp = self.n == 2 and type(self.provider).__name__ == "TrustedFirstParty"
        if self.fast_tfp:
            pause_prefill()
            self._shared, self._local = party_streams(self.comm, self.group, dist, self.rank)

    # ------------------------------------------------------------------ correlated randomness
    def _rand(self, size, gen, bits: int = 64):
        """Uniform ring elements (or bits) of ``size`` from the AES-CTR stream ``gen``."""
        size = torch.Size(size)
        x = gen.take(max(1, size.numel()))[:size.numel()].view(size)
        return x & 1 if bits == 1 else x

    def triple(self, op, size0, size1):
        """This party's shares ``(a, b, c)`` of an arithmetic triple ``c = op(a, b)``.

        TFP, 2 parties: party 1's shares ``a1, b1, c1`` are drawn from the seed it shares with
        party 0; party 0 draws ``a0, b0`` from its local seed, and sets ``c0 = op(a0+a1, b0+b1)
        - c1``. Party 0 knows the triple, as with CrypTen's TFP; party 1 sees only seed output.
        Otherwise the provider's triple."""
        if not self.fast_tfp:
            return tuple(t.share for t in self.provider.generate_additive_triple(size0, size1, op))
        f = getattr(torch, op)
        a1, b1 = self._rand(size0, self._shared), self._rand(size1, self._shared)
        if op == "matmul":   # (..., n, k) @ (..., k, p) -> (..., n, p), at least 2-d here
            cshape = torch.broadcast_shapes(size0[:-2], size1[:-2]) + (size0[-2], size1[-1])
        else:
            cshape = torch.broadcast_shapes(size0, size1)
        c1 = self._rand(cshape, self._shared)
        if self.rank == 1:
            return a1, b1, c1
        a0, b0 = self._rand(size0, self._local), self._rand(size1, self._local)
        return a0, b0, f(a0 + a1, b0 + b1) - c1

    def binary_triple(self, size):
        """This party's XOR shares ``(a, b, c)`` with ``c = a & b`` (same dealing as :meth:`triple`)."""
        if not self.fast_tfp:
            return tuple(t.share for t in self.provider.generate_binary_triple(size, size))
        a1, b1, c1 = (self._rand(size, self._shared) for _ in range(3))
        if self.rank == 1:
            return a1, b1, c1
        a0, b0 = self._rand(size, self._local), self._rand(size, self._local)
        return a0, b0, ((a0 ^ a1) & (b0 ^ b1)) ^ c1

    def b2a_pair(self, size):
        """Shares of one random bit ``r``: arithmetic ``rA`` and XOR ``rB``."""
        if not self.fast_tfp:
            rA, rB = self.provider.B2A_rng(size)
            return rA.share, rB.share
        a1, x1 = self._rand(size, self._shared), self._rand(size, self._shared)
        if self.rank == 1:
            return a1, x1
        r = self._rand(size, self._local, bits=1)
        return r - a1, r ^ x1

    # ------------------------------------------------------------------ one round
    def _exchange(self, arith: list, xor: list):
        """Open every tensor at once (all collectives in flight together: one round).

        Tensors are fresh temporaries owned by :meth:`round` and are reduced in place; small
        ones are concatenated into one collective per operation, large ones (>= BIG
        elements) go alone, so no second copy of a large tensor is made."""
        dist = self.dist
        reqs, out, nel = [], [], 0
        for tensors, op in ((arith, dist.ReduceOp.SUM), (xor, dist.ReduceOp.BXOR)):
            got = list(tensors)
            small = [i for i, t in enumerate(tensors) if t.numel() < BIG]
            for i, t in enumerate(tensors):
                if t.numel() >= BIG:
                    t = t.contiguous()
                    got[i] = t
                    reqs.append(dist.all_reduce(t, op=op, group=self.group, async_op=True))
            if small:
                f = torch.cat([tensors[i].reshape(-1) for i in small])
                reqs.append(dist.all_reduce(f, op=op, group=self.group, async_op=True))
                pos = 0
                for i in small:
                    n = tensors[i].numel()
                    got[i] = f[pos:pos + n].view(tensors[i].shape)
                    pos += n
            nel += sum(t.numel() for t in tensors)
            out.append(got)
        for r in reqs:
            r.wait()
        self.rounds += 1
        if self.verbose:
            self.comm._log_communication(2 * nel)
        return out

    def round(self, reqs: list) -> list:
        """Execute one round of requests (see the module docstring); returns their results."""
        first = self.rank == 0
        arith, xor, todo = [], [], []
        for q in reqs:
            kind = q[0]
            if kind == "mul":
                _, op, x, y = q
                a, b, c = self.triple(op, x.size(), y.size())
                todo.append(("mul", op, len(arith), a, b, c))
                arith += [x - a, y - b]
            elif kind == "and":
                _, x, y = q
                a, b, c = self.binary_triple(torch.broadcast_shapes(x.size(), y.size()))
                todo.append(("and", len(xor), a, b, c))
                xor += [x ^ a, y ^ b]
            elif kind == "b2a":
                _, bit, ys = q
                bit = bit & 1
                rA, rB = self.b2a_pair(bit.size())
                prods = []
                for y, nd in ys:
                    ra = rA.reshape(rA.shape + (1,) * nd)
                    a, b, c = self.triple("mul", ra.size(), y.size())
                    prods.append((len(arith), a, b, c, y, nd))
                    arith += [ra - a, y - b]
                todo.append(("b2a", len(xor), rA, prods))
                xor.append(bit ^ rB)
            elif kind == "open":
                todo.append(("open", len(arith)))
                arith.append(q[1].clone())   # reduced in place: never the caller's tensor
            else:  # pragma: no cover - programming error
                raise ValueError(f"unknown request {kind!r}")
        oa, ox = self._exchange(arith, xor)
        out = []
        for t in todo:
            if t[0] == "mul":
                _, op, i, a, b, c = t
                f = getattr(torch, op)
                eps, delta = oa[i], oa[i + 1]
                z = c + f(eps, b) + f(a, delta)
                if first:
                    z = z + f(eps, delta)
                out.append(z)
            elif t[0] == "and":
                _, i, a, b, c = t
                eps, delta = ox[i], ox[i + 1]
                z = c ^ (eps & b) ^ (a & delta)
                if first:
                    z = z ^ (eps & delta)
                out.append(z)
            elif t[0] == "b2a":
                _, i, rA, prods = t
                zb = ox[i]                      # public bit z = bit ^ r
                sgn = 1 - 2 * zb                # bit = z + (1 - 2z) r
                res = [sgn * rA + (zb if first else 0)]
                for j, a, b, c, y, nd in prods:
                    eps, delta = oa[j], oa[j + 1]
                    ry = c + eps * b + a * delta
                    if first:
                        ry = ry + eps * delta
                    zz = zb.reshape(zb.shape + (1,) * nd)
                    res.append((1 - 2 * zz) * ry + zz * y)
                out.append(res)
            else:
                out.append(oa[t[1]])
        return out

    def drive(self, gen):
        """Run a sub-protocol generator to completion; returns its value."""
        send = None
        while True:
            try:
                reqs = gen.send(send)
            except StopIteration as stop:
                return stop.value
            send = self.round(reqs)

    # ------------------------------------------------------------------ sub-protocols
    def ltz(self, x, L: int = L_FULL, ys=()):
        """Sub-protocol: ``[bit, bit*y ...]`` with ``bit = [x < 0]`` (arithmetic shares, scale 1).

        ``x``: arithmetic shares of ring elements known (publicly) to lie in
        ``(-2^L, 2^L)``; ``ys``: ``(y, nd)`` pairs multiplied by the bit in the last round.
        """
        if not 1 <= L <= L_FULL:
            raise ValueError(f"L must be in [1, {L_FULL}]. Found {L!r}.")
        zero = torch.zeros_like(x)
        ins = [x if i == self.rank else zero for i in range(self.n)]
        if self.n == 2:
            u, v = ins
        else:   # carry-save: a + b + c = (a ^ b ^ c) + 2 maj(a, b, c)
            while len(ins) > 2:
                a, b, c = ins[:3]
                t = a ^ b
                ab, ct = yield [("and", a, b), ("and", c, t)]
                ins = [t ^ c, (ab ^ ct) << 1] + ins[3:]
            u, v = ins
        (G,) = yield [("and", u, v)]
        P0 = u ^ v
        P, s = P0, 1
        while s < L:   # Kogge-Stone: G bit j = generate of bits (j-2s, j]
            if 2 * s < L:
                Gs, P = yield [("and", P, G << s), ("and", P, P << s)]
            else:
                (Gs,) = yield [("and", P, G << s)]
            G = G ^ Gs    # generate and propagate of one segment exclude each other: OR = XOR
            s *= 2
        sign = (P0 >> L) ^ (G >> (L - 1))   # bit L of the sum = P_L ^ carry into L
        (res,) = yield [("b2a", sign, list(ys))]
        return res


def ltz_rounds(n_parties: int, L: int = L_FULL) -> int:
    """Rounds of :meth:`Rounds.ltz` (public)."""
    csa = max(0, n_parties - 2)
    return csa + 1 + max(0, math.ceil(math.log2(L))) + 1
