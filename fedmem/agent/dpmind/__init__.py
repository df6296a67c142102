"""DP-MIND client side (``papers/002_*``): metric-DP token perturbation of long contexts
(Algorithm 3; L2 noise as in the paper, or a labelled per-coordinate L1 mode), the
memory-guided chunk loop (Algorithm 1) through a pluggable responder, and local span
denoising (Algorithm 2). The clean text and the alignment stay inside :class:`DPMindClient`.
"""

from fedmem.agent.dpmind.denoise import Alignment, denoise_ids
from fedmem.agent.dpmind.embeddings import TokenTable, WordPieceCodec, load_minilm
from fedmem.agent.dpmind.loop import (
    FINAL_ANSWER_PROMPT,
    MEMORY_UPDATE_PROMPT,
    Answer,
    DPMindClient,
    ExtractiveMemoryAgent,
    extract_answer,
)
from fedmem.agent.dpmind.mechanism import MECHANISMS, CoordinateLaplace, make_mechanism
from fedmem.agent.dpmind.metrics import exact_match, f1_score, normalize_answer, score, sub_exact_match
from fedmem.agent.dpmind.perturb import ExactProjector, IVFProjector, TokenPerturber, naive_project, rechunk

__all__ = [
    "Alignment", "Answer", "CoordinateLaplace", "DPMindClient", "ExactProjector", "ExtractiveMemoryAgent",
    "FINAL_ANSWER_PROMPT", "IVFProjector", "MECHANISMS", "MEMORY_UPDATE_PROMPT", "TokenPerturber", "TokenTable",
    "WordPieceCodec", "denoise_ids", "exact_match", "extract_answer", "f1_score", "load_minilm", "make_mechanism",
    "naive_project", "normalize_answer", "rechunk", "score", "sub_exact_match",
]
