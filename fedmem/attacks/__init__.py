"""Adversaries and auditors: adaptive querying, support-channel attacks, audit statistics.

* :mod:`fedmem.attacks.audit`: AUC, TPR at low FPR, Clopper-Pearson epsilon lower bounds.
* :mod:`fedmem.attacks.support`: cardinality reconstruction, cardinality differencing,
  noise-scale exploitation, retry averaging (papers/003).
* :mod:`fedmem.attacks.observable`: attacks on everything else a querying agent observes
  (refusal content, admission oracle with offline boundary search, timing, retry and
  near-duplicate averaging, principal spreading) and the per-attack verdict.
* :mod:`fedmem.attacks.adaptive`: :class:`AdaptiveAdversary`, the query-choosing agent.

Submodules are imported on use, so importing the package stays cheap.
"""
