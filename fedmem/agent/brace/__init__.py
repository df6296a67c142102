"""BRACE: private LSR dense-associative-memory retrieval (papers/001).

- :mod:`.params`: :class:`BraceParams` (frozen public parameters, Eq. (8) check, booked event)
- :mod:`.lsr`: gates, the LSR update ``Phi_D`` (Sec. 3.1), projections
- :mod:`.certificate`: the smooth sensitivity certificate (Step 5, Eq. (7))
- :mod:`.mechanism`: Algorithm 1 (Steps 1-6), batched
- :mod:`.baselines`: noiseless / Naive / global-noise DAM, clean endpoint + noise (Sec. 6.2)
- :mod:`.memory`: :class:`BraceMemory`, the agent-side ``recall(q)``
"""

from fedmem.agent.brace.baselines import clean_endpoint_noise, iterative_baseline
from fedmem.agent.brace.certificate import Certifier, brute_force_local_sensitivity
from fedmem.agent.brace.lsr import clean_trajectory, phi, project_ball
from fedmem.agent.brace.mechanism import BraceRun, NoiseSource, brace_run
from fedmem.agent.brace.memory import BraceMemory
from fedmem.agent.brace.params import BraceParams, gamma_max, rho_eps_delta

__all__ = [
    "BraceMemory", "BraceParams", "BraceRun", "Certifier", "NoiseSource", "brace_run",
    "brute_force_local_sensitivity", "clean_endpoint_noise", "clean_trajectory", "gamma_max",
    "iterative_baseline", "phi", "project_ball", "rho_eps_delta",
]
