"""The compute-party contract: what the engine calls on its parties, whichever backend.

:class:`~fedmem.federation.mpc.PlaintextParties` (the reference: reconstructs and selects in
numpy) and :class:`~fedmem.federation.mpc.CryptenParties` (CrypTen parties as Ray actors)
implement it, as a test double must (subclass :class:`Parties`). One class, not a
``getattr`` probe: the engine checks ``isinstance(parties, Parties)`` at construction and
then calls only what is declared here. Light on purpose (no torch, no Ray), so that
``fedmem.federation.engine`` can import it at module top.
"""

from __future__ import annotations

import abc


class Parties(abc.ABC):
    """``n_parties`` compute parties that run one secure selection per call.

    * :attr:`n_parties`: how many parties (the engine requires its config's ``parties``);
    * :attr:`public_keys`: each party's raw X25519 public key, rank order. When non-empty
      the engine seals every share packet to its party (``sharing.seal_packet``) and passes a
      fresh ``run_id``; an empty list (the default) means the backend opens plain packets;
    * :meth:`run`: ``packets[p]`` lists party ``p``'s packets (one per shard host, a
      ``SharePacket`` or a Ray ``ObjectRef`` to one), ``spec`` the public
      :class:`~fedmem.federation.sharing.SelectionSpec`; returns the
      :class:`~fedmem.federation.sharing.Revealed` outputs the spec names. Every failure
      (a dead, hung or deviating party, an inconsistent packet) raises
      :class:`~fedmem.errors.MpcFailure` and reveals nothing: the engine then fails the whole
      batch closed. ``impl`` names the top-k protocol (``"auto"`` or one of
      ``fedmem.federation.mpc.IMPLS``; the engine passes ``FederationConfig.mpc_impl``): a
      backend whose selection does not depend on it (the plaintext reference) checks it and
      computes the same selection;
    * :meth:`close`: stop what the backend started (idempotent). Also a context manager.
    """

    n_parties: int

    @property
    def public_keys(self) -> list[bytes]:
        return []

    @abc.abstractmethod
    def run(self, packets, spec, *, run_id: bytes | None = None, impl: str = "auto"):
        """Secure selection on ``packets`` under ``spec``; see the class docstring."""

    def close(self) -> None:
        return None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
