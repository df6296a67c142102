"""BRACE experiments (papers/001 Sec. 6): ``brace.synthetic`` and ``brace.digits``.

``brace.synthetic`` (Sec. 6.1): boundary-induced mode switching on a three-component
Gaussian mixture in R^2; noiseless DAM vs Naive DAM vs BRACE (and global-noise DAM) on
shared innovations; per-step per-coordinate squared error relative to noiseless DAM,
over many paired noise draws (and over the draws where Naive DAM switched modes) plus one
illustrative trajectory plot. The paper setup (default) uses tight modes and the cue
where Naive DAM is least stable, chosen on calibration draws of its own
(:func:`fedmem.agent.brace.instances.unstable_start`).

``brace.digits`` (Sec. 6.2): retrieval under strong query corruption ``q = x + 3u`` on
2 PCA coordinates of scikit-learn's digits (stand-in for the MNIST-VAE features), over
a beta x T x epsilon grid with paired repetitions; prediction MSE (vs ``x``) and
fidelity MSE (vs the noiseless endpoint ``z_T``) with query-cluster bootstrap CIs,
figures like Figures 2-3 and a minima table beside the paper's numbers.

The code: :mod:`fedmem.experiments.brace_common` (parameters from scenario keys, the Eq. (8)
check, chunked BRACE runs, bootstrap CIs), :mod:`fedmem.experiments.brace_synthetic` (Sec. 6.1)
and :mod:`fedmem.experiments.brace_digits` (Sec. 6.2); this module registers both kinds.
"""

from __future__ import annotations

from fedmem.experiments.brace_digits import (DIG_SCHEMA, METHODS, PAPER_BETAS, PAPER_MINIMA, dig_cross_checks,
                                             run_digits)
from fedmem.experiments.brace_synthetic import SYN_SCHEMA, run_synthetic, syn_cross_checks
from fedmem.scenario import Experiment

__all__ = ["DIG_SCHEMA", "EXPERIMENTS", "METHODS", "PAPER_BETAS", "PAPER_MINIMA", "SYN_SCHEMA", "run_digits",
           "run_synthetic"]

EXPERIMENTS = {
    "brace.synthetic": Experiment("brace.synthetic", "BRACE vs Naive DAM: boundary-induced mode switching "
                                  "(papers/001 Sec. 6.1).", SYN_SCHEMA, run_synthetic, cross_checks=syn_cross_checks),
    "brace.digits": Experiment("brace.digits", "BRACE under strong query corruption on digits PCA features "
                               "(papers/001 Sec. 6.2).", DIG_SCHEMA, run_digits, cross_checks=dig_cross_checks),
}
