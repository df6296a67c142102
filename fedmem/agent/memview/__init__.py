"""DP-MemView (papers/000): private memory views with attribute-level transcript privacy.

- :mod:`.policy`: public layout, protected groups ``I_a``, vocabularies, router, reads,
  charge set Gamma* (Eq. 4); loaders that reject malformed policy/store files.
- :mod:`.scorer`: scorers with a declared sensitivity (Eq. 5-6); the paper's
  0.4r + 0.4c + 0.2s scorer with Delta_u = 0.6.
- :mod:`.interface`: Algorithm 1 with the contract C1-C6, online/preallocated modes,
  durable per-attribute ledgers, explicit ``unsafe_ablation=`` for Table 4.
- :mod:`.baselines`: the compared interfaces of Table 1 and the ablations.
- :mod:`.experiment`: ``memview.table2`` / ``memview.table3`` / ``memview.table4``.
"""

from fedmem.agent.memview.interface import MemViewInterface, Release, SlotRelease, plan_charges
from fedmem.agent.memview.policy import (Intent, Layout, MemoryStore, MemViewPolicy, Query, View, Vocabulary,
                                         policy_from_dict, store_from_dict)
from fedmem.agent.memview.scorer import PaperScorer, PhraseLexicon, Scorer

__all__ = ["Intent", "Layout", "MemoryStore", "MemViewInterface", "MemViewPolicy", "PaperScorer", "PhraseLexicon",
           "Query", "Release", "Scorer", "SlotRelease", "View", "Vocabulary", "plan_charges", "policy_from_dict",
           "store_from_dict"]
