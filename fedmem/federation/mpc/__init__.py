"""Compute parties: secure global selection, sum, count and per-shard tallies.

DESIGN.md, "One federated query, end to end", steps 3-4. Every shard host sends each
compute party one :class:`~fedmem.federation.sharing.SharePacket` (additive shares of
its padded local top-k' candidates). The parties jointly compute, without any of them
seeing a plaintext score, value or flag:

1. a secret-shared 0/1 selection mask over all ``N = S * m`` candidates (global top-k,
   threshold, or broadcast; semantics and tie-break in ``fedmem.federation.sharing``);
2. the secure sum of the selected value vectors, the secure count and the per-shard
   tallies (the "receipts" whose leakage papers/003 is about);

and open only the outputs that :class:`SelectionSpec.reveal` names.

Two implementations with identical semantics:

* :class:`PlaintextParties`: the reference/baseline. It reconstructs the shares and
  computes in numpy (no secrecy); used to test the MPC and as the fast engine option.
* :class:`CryptenParties`: ``n`` Ray actors (2 by default, 3 allowed), each one CrypTen
  party over torch.distributed/gloo, on distinct nodes when the cluster has enough
  (rendezvous at rank 0's node IP; docs/cluster.md). Each actor fetches and receives
  only its own shares and wraps them with ``MPCTensor.from_shares``.

Secure top-k. With effective scores ``e_j = score_j + FILL * valid_j`` (linear in the
shares; every valid row above every invalid one, see :data:`FILL`), candidate ``u``
beats ``t`` iff ``e_u > e_t`` or (``e_u = e_t`` and ``u < t``). Three methods, same
output (``impl=``; ``"auto"`` picks by :func:`choose_impl` from public shapes only); all
run on the raw shares through :mod:`fedmem.federation.mpc.rounds` (CrypTen's
communicator and triple provider, independent steps fused into shared rounds):

* ``rank`` (:func:`~fedmem.federation.mpc.networks.selection.rank_gen`, constant rounds): for all ``N(N-1)/2`` pairs ``i < j`` at
  once, one vectorised secure comparison gives ``l_ij = [e_i < e_j]``. The rank of ``t``
  (number of candidates that beat it) is *linear* in the ``l``'s,
  ``rank_t = t + sum_{j > t} l_tj - sum_{i < t} l_it``, so each party computes its share
  locally; ``mask_t = [rank_t < k] * valid_t`` is one small-range comparison with the
  product fused into its last round: 15 rounds (2 parties) whatever ``k`` and ``N``.
* ``grouped`` (:func:`~fedmem.federation.mpc.networks.selection.grouped_gen`, constant rounds): the same rank inside groups of
  shards, a secret one-hot compaction of each group's top-k, and a second rank over the
  survivors: 4 comparison layers (28 rounds), ~4x fewer comparisons than ``rank`` for 40 x 5.
* ``merge`` (:func:`~fedmem.federation.mpc.networks.selection.merge_gen`): sorted shard lists merged pairwise in a tree of
  bitonic top-K merges: O(N log^2 k) comparisons, O(log S log k) rounds; best for large
  batches and many shards.

The naive approach (``k`` sequential log-depth CrypTen argmaxes) is kept as
``impl="argmax"`` for the benchmark (on CrypTen's ``MPCTensor``). Every selection mask is an integer (scale-1)
sharing and ``valid`` is shared at scale 1, so ``mask * values`` needs no fixed-point
truncation: the revealed sum is the exact ring sum of the encoded selected values,
bit-identical to :class:`PlaintextParties`.

CrypTen's trust model (stated plainly): semi-honest (honest-but-curious) parties, no
MACs, so a party that deviates from the protocol can silently corrupt results; the
default provider ``TFP`` ("trusted first party") has party 0 generate the Beaver
triples and binary triples for everyone, so party 0 must be trusted not to collude;
``TTP`` moves that role to a separate trusted-third-party process (an extra actor).
Revealed outputs are opened to every party (and returned to the aggregator).
"""

from fedmem.federation.mpc.layout import assemble
from fedmem.federation.mpc.networks import CONSTANT_ROUNDS_MAX, IMPLS, PROVIDERS, choose_impl, grouped_plan, merge_network
from fedmem.federation.mpc.reference import PlaintextParties, plaintext_mask
from fedmem.federation.mpc.runtime import PLACEMENTS, CryptenParties, SharedNodeWarning

__all__ = ["CONSTANT_ROUNDS_MAX", "IMPLS", "PLACEMENTS", "PROVIDERS", "CryptenParties", "PlaintextParties",
           "SharedNodeWarning", "assemble", "choose_impl", "grouped_plan", "merge_network", "plaintext_mask"]
