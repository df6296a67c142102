"""Public parameters of one agent (:class:`AgentConfig`) and the names of its four boundaries."""

from __future__ import annotations

import math
from dataclasses import dataclass

from fedmem import _validate as V

BOUNDARIES = ("federation", "memview", "brace", "dpmind")
DPMIND_ATTR = "per_token"
NO_CAP = 1e300


@dataclass(frozen=True)
class AgentConfig:
    """Public parameters of one agent (validated at construction; ``ValueError`` names the field)."""

    memview_cap: float = 2.0          # B_a per protected attribute (pure epsilon)
    memview_K: int = 3                # online mode: eps = B_a / K per charged selection
    brace_beta: float = 0.5           # r = sqrt(2 / beta)
    brace_T: int = 3
    brace_epsilon: float = 2.0
    brace_delta: float = 1e-6
    brace_budget_epsilon: float = 20.0   # user's BRACE budget (epsilon at brace_budget_delta)
    brace_budget_delta: float = 1e-5
    dpmind_epsilon: float = 100.0     # metric-DP epsilon per token (L2 on MiniLM rows)
    dpmind_chunk_tokens: int = 256
    dpmind_restore_k: int = 32
    dpmind_token_cap: float = math.inf   # cap on the summed per-token epsilon over contexts (inf: record only)

    def __post_init__(self):
        for name in ("memview_cap", "brace_beta", "brace_epsilon", "brace_budget_epsilon", "dpmind_epsilon"):
            V.positive(name, getattr(self, name))
        for name in ("memview_K", "brace_T", "dpmind_chunk_tokens", "dpmind_restore_k"):
            V.positive_int(name, getattr(self, name))
        for name in ("brace_delta", "brace_budget_delta"):
            V.open_unit(name, getattr(self, name))
        cap = self.dpmind_token_cap
        if isinstance(cap, bool) or not isinstance(cap, (int, float)) or math.isnan(cap) or cap <= 0:
            raise ValueError(f"dpmind_token_cap must be positive (math.inf records only). Found {cap!r}.")
