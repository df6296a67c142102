"""The secure selection programs: rank, grouped and merge top-k, threshold and broadcast as
generators over :mod:`fedmem.federation.mpc.rounds`, their comparison networks and plans,
and the naive CrypTen argmax baseline.

A package (it was one module); every name stays importable from here:

* :mod:`~fedmem.federation.mpc.networks.program`: the program one party runs on its shares
  (:func:`secure_program`), ``PROVIDERS``, ``IMPLS`` and ``FILL``;
* :mod:`~fedmem.federation.mpc.networks.selection`: the rank, grouped and merge top-k generators;
* :mod:`~fedmem.federation.mpc.networks.comparators`: the public comparator schedules
  (:func:`merge_network`);
* :mod:`~fedmem.federation.mpc.networks.cost_model`: comparisons and rounds per method, the
  fitted cost model and :func:`choose_impl`;
* :mod:`~fedmem.federation.mpc.networks.outputs`: the secure sum, count and tallies, opened;
* :mod:`~fedmem.federation.mpc.networks.naive`: the naive ``k``-argmax CrypTen baseline.
"""

from fedmem.federation.mpc.networks.comparators import merge_network, oddeven_layers, prune
from fedmem.federation.mpc.networks.cost_model import (
    COMPARISON_S, CONSTANT_ROUNDS_MAX, FIT_POINTS, ROUND_S, choose_impl, fit_cost_model, grouped_plan, impl_costs,
    predicted_seconds, switch_batch)
from fedmem.federation.mpc.networks.naive import naive_program, naive_topk
from fedmem.federation.mpc.networks.outputs import SUM_BLOCK, decode_opened, open_outputs, support_outputs
from fedmem.federation.mpc.networks.program import FILL, IMPLS, PROVIDERS, secure_program
from fedmem.federation.mpc.networks.selection import (
    ce_gen, composite_keys, grouped_gen, merge_gen, rank_gen, ranks)

__all__ = ["COMPARISON_S", "CONSTANT_ROUNDS_MAX", "FILL", "FIT_POINTS", "IMPLS", "PROVIDERS", "ROUND_S", "SUM_BLOCK",
           "ce_gen", "choose_impl", "composite_keys", "decode_opened", "fit_cost_model", "grouped_gen",
           "grouped_plan", "impl_costs", "merge_gen", "merge_network", "naive_program", "naive_topk",
           "oddeven_layers", "open_outputs", "predicted_seconds", "prune", "rank_gen", "ranks", "secure_program",
           "support_outputs", "switch_batch"]
