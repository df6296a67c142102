"""``fedmem hunt``: an automated adversary that searches everything a querying agent or a
hostile contributor observes for a distinguishing attack (docs/hunt.md).

Modules: :mod:`.observe` (generic featurisation of any observation), :mod:`.worlds`
(neighbouring-world search), :mod:`.grammar` (query-sequence strategies), :mod:`.bandit`
(where the time budget goes), :mod:`.distinguish` (learned classifier judged by the shared
verdict rule with multiple-comparison correction), :mod:`.targets` (systems built from a
scenario, in process), :mod:`.recipe` (replayable attacks) and :mod:`.runner` (the hunt).
"""
