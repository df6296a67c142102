"""``dpmind.niah``: DP-MIND utility against epsilon and context length, on NIAH or two-hop QA.

``task.benchmark`` picks the task:

* ``"niah"`` (default): RULER-style NIAH (:mod:`fedmem.bench.niah`): for every NIAH
  variant (repetitive/essay haystack, numeric/UUID needle), task (single, multi-key,
  multi-query), length and sample;
* ``"multihop"``: offline two-hop QA (:mod:`fedmem.bench.multihop`, a RULER-HQA
  stand-in): for every chain type, length and sample; the extractive agent follows
  ``loop.hops`` hops (2 by default for this benchmark).

For every epsilon and haystack the client perturbs the context once (Algorithm 3, with
the noise law ``privacy.mechanism``: ``"l2"`` or the labelled per-coordinate ``"l1"``),
then answers every question four ways over the *same* perturbed context (the external
view is a post-processing, so extra questions cost no privacy): memory loop with and
without local denoising (DP-MIND vs. memory-augmented baseline), and chunk-only with
and without denoising (the Table 3 ablation). Answers are scored by EM, F1 and SubEM
(Appendix B.2). The same haystacks are used at every epsilon (paired comparison); noise
streams are independent per (epsilon, haystack).

Uncertainty: the unit of resampling is the haystack (one perturbation). SubEM gets an
exact Clopper-Pearson interval when every haystack of a row has one question (all tasks
but NIAH multi-query); otherwise, and for F1 and for the paired memory - chunk-only
differences, a percentile bootstrap over haystacks (``stats.bootstrap`` resamples,
seeded from the scenario seed). The "CI" column names the method.
"""

from __future__ import annotations

import time
from collections import defaultdict

import numpy as np

from fedmem.agent.dpmind.embeddings import load_minilm
from fedmem.agent.dpmind.loop import DPMindClient, ExtractiveMemoryAgent
from fedmem.agent.dpmind.mechanism import MECHANISMS, make_mechanism
from fedmem.agent.dpmind.metrics import score
from fedmem.agent.dpmind.perturb import TokenPerturber, cached_projector
from fedmem.agent.llm import OpenAICompatibleResponder
from fedmem.attacks.audit import clopper_pearson
from fedmem.bench.multihop import TYPES as HOP_TYPES
from fedmem.bench.multihop import make_multihop_sample
from fedmem.bench.niah import VARIANTS, make_sample, sentence_stream
from fedmem.report import Result, Table
from fedmem.scenario import Experiment, Param, at_least, nonempty_each, open_unit, positive
from fedmem import figures as F

CONFIGS = ("memory+denoise", "memory", "chunk_only+denoise", "chunk_only")
TASKS = ("single", "multi_key", "multi_query")


def _subset(allowed):
    def check(values):
        bad = [v for v in values if v not in allowed]
        if not values:
            return "must not be empty"
        return f"items must be in {list(allowed)}, found {bad[0]!r}" if bad else None
    return check


SCHEMA = {
    "task": {
        "benchmark": Param(str, "niah", "which task: RULER-style NIAH or offline two-hop QA (RULER-HQA stand-in)",
                           choices=("niah", "multihop")),
    },
    "niah": {
        "variants": Param(list, list(VARIANTS), "NIAH variants (haystack_needle)", item_type=str,
                          check=_subset(tuple(VARIANTS))),
        "tasks": Param(list, list(TASKS), "NIAH tasks", item_type=str, check=_subset(TASKS)),
        "lengths": Param(list, [32768, 131072, 524288, 1048576], "context lengths in MiniLM tokens",
                         item_type=int, check=nonempty_each(at_least(64))),
        "samples": Param(int, 2, "haystacks per (variant, task, length); a table row pools variants x tasks x "
                         "samples haystacks", check=positive),
        "n_keys": Param(int, 4, "needles in multi-key / multi-query samples", check=at_least(2)),
    },
    "multihop": {
        "types": Param(list, list(HOP_TYPES), "two-hop chain types", item_type=str, check=_subset(tuple(HOP_TYPES))),
        "lengths": Param(list, [8192], "context lengths in MiniLM tokens", item_type=int,
                         check=nonempty_each(at_least(64))),
        "samples": Param(int, 10, "haystacks per (type, length); a table row pools types x samples haystacks",
                         check=positive),
        "n_chains": Param(int, 6, "chains per haystack (one asked, the rest distractors of the same type)",
                          check=positive),
    },
    "privacy": {
        "mechanism": Param(str, help="required: noise law: l2 = density exp(-eps ||z||_2) (guarantee eps ||a-b||_2); "
                           "l1 = per-coordinate Laplace(1/eps) (guarantee eps ||a-b||_1)", choices=MECHANISMS),
        "epsilons": Param(list, help="required: metric-DP epsilon per token (d_chi on the MiniLM table, in the "
                          "metric of privacy.mechanism)", item_type=(int, float), check=nonempty_each(positive)),
    },
    "perturb": {
        "projection": Param(str, "cascade", "nearest-token search: cascade (bf16 candidates + exact re-rank), "
                            "exact, or ivf", choices=("cascade", "exact", "ivf")),
        "n_clusters": Param(int, 256, "IVF cells", check=positive),
        "n_probe": Param(int, 24, "IVF cells searched per token", check=positive),
        "block": Param(int, 8192, "tokens perturbed per block (bounds memory)", check=positive),
        "threads": Param(int, 1, "torch threads for the projection (1 is fastest on a shared machine)",
                         check=positive),
    },
    "loop": {
        "chunk_tokens": Param(int, 5000, "tokens per perturbed chunk (App. A.2 uses 5,000)", check=positive),
        "restore_k": Param(int, 32, "maximum restoration span K of Algorithm 2", check=positive),
        "memory_sentences": Param(int, 8, "extractive agent: sentences kept in memory", check=positive),
        "min_cues": Param(int, 2, "extractive agent: question cue words a kept sentence must contain",
                          check=positive),
        "hops": Param(int, 0, "extractive agent: hops to follow (0 = 1 for niah, 2 for multihop)",
                      check=lambda v: None if v >= 0 else f"must be >= 0, found {v!r}"),
    },
    "stats": {
        "confidence": Param(float, 0.95, "confidence level of the intervals", check=open_unit),
        "bootstrap": Param(int, 2000, "bootstrap resamples (F1, multi-question SubEM, paired differences)",
                           check=at_least(100)),
    },
    "responder": {
        "kind": Param(str, "extractive", "who answers: the built-in extractive agent or an OpenAI-compatible "
                      "endpoint", choices=("extractive", "openai")),
        "base_url": Param(str, "", "OpenAI-compatible base URL (kind = 'openai')"),
        "model": Param(str, "", "model name (kind = 'openai')"),
    },
}


def cross_checks(cfg) -> list[tuple[str, str]]:
    problems = []
    if cfg.perturb.n_probe > cfg.perturb.n_clusters:
        problems.append(("perturb.n_probe", f"must be <= perturb.n_clusters ({cfg.perturb.n_clusters}), "
                                            f"found {cfg.perturb.n_probe}"))
    if cfg.responder.kind == "openai" and not (cfg.responder.base_url and cfg.responder.model):
        problems.append(("responder", "kind = 'openai' needs base_url and model"))
    return problems


def _hops(cfg) -> int:
    return cfg.loop.hops or (2 if cfg.task.benchmark == "multihop" else 1)


def _responder(cfg):
    if cfg.responder.kind == "openai":
        return OpenAICompatibleResponder(cfg.responder.base_url, cfg.responder.model)
    return ExtractiveMemoryAgent(memory_sentences=cfg.loop.memory_sentences, min_cues=cfg.loop.min_cues,
                                 hops=_hops(cfg))


def _jobs(cfg, count):
    """(group, length, job key, sample factory) for every haystack of one epsilon."""
    if cfg.task.benchmark == "multihop":
        m = cfg.multihop
        return m.types, m.lengths, [
            (t, L, ("multihop", t, L, s),
             (lambda t=t, L=L, s=s, rng=None: make_multihop_sample(L, chain_type=t, rng=rng, count_tokens=count,
                                                                   n_chains=m.n_chains)))
            for t in m.types for L in m.lengths for s in range(m.samples)]
    n = cfg.niah
    jobs = []
    for v in n.variants:
        hay, needle = VARIANTS[v]
        for t in n.tasks:
            for L in n.lengths:
                for s in range(n.samples):
                    jobs.append((t, L, ("niah", v, t, L, s),
                                 (lambda hay=hay, needle=needle, t=t, L=L, rng=None:
                                  make_sample(L, haystack=hay, needle=needle, task=t, n_keys=n.n_keys, rng=rng,
                                              count_tokens=count))))
    return n.tasks, n.lengths, jobs


# --------------------------------------------------------------------- statistics
def _mean_units(units) -> float:
    """Mean over all questions of a list of per-haystack score lists."""
    vals = [v for u in units for v in u]
    return float(np.mean(vals)) if vals else float("nan")


def _boot(units, rng, reps: int, conf: float, stat=_mean_units) -> tuple[float, float]:
    """Percentile bootstrap interval of ``stat`` over haystacks (the resampling unit), by
    ``scipy.stats.bootstrap`` resampling haystack indices with the injected generator ``rng``."""
    from scipy import stats

    n = len(units)
    if n == 0:
        return float("nan"), float("nan")
    if n == 1:
        v = stat(units)
        return float(v), float(v)

    def on_indices(idx):
        return stat([units[int(i)] for i in idx])

    res = stats.bootstrap((np.arange(n),), on_indices, vectorized=False, n_resamples=reps, confidence_level=conf,
                          method="percentile", rng=rng)
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


def _subem_ci(units, rng, reps, conf) -> tuple[float, float, str]:
    if units and all(len(u) == 1 for u in units):
        k = int(sum(u[0] for u in units))
        lo, hi = clopper_pearson(k, len(units), alpha=1.0 - conf)
        return lo, hi, "CP"
    lo, hi = _boot(units, rng, reps, conf)
    return lo, hi, "boot"


def _pct(x: float) -> float:
    return 100.0 * x


def run(cfg, ctx) -> Result:
    table, codec = load_minilm()
    t0 = time.perf_counter()
    kw = {"n_clusters": cfg.perturb.n_clusters, "n_probe": cfg.perturb.n_probe} \
        if cfg.perturb.projection == "ivf" else {}
    kw["threads"] = cfg.perturb.threads
    projector = cached_projector(table, cfg.perturb.projection, **kw)
    ctx.log(f"projector {cfg.perturb.projection} ready in {time.perf_counter() - t0:.1f} s")
    responder = _responder(cfg)
    count = lambda s: int(codec.encode(s).size)  # noqa: E731
    groups, lengths, jobs = _jobs(cfg, count)
    bench = cfg.task.benchmark
    mech_kind = cfg.privacy.mechanism
    epsilons = [float(e) for e in cfg.privacy.epsilons]
    # per[(eps, length, config)][job key] -> list of metric dicts (one per question); group by job key
    per: dict[tuple, dict] = defaultdict(dict)
    group_of = {key: g for g, _, key, _ in jobs}
    keep: dict[float, list[float]] = defaultdict(list)
    restored: dict[float, list[int]] = defaultdict(list)
    tok_time = [0, 0.0]
    samples = {}
    for eps, (g, L, key, factory) in ctx.progress([(e, j) for e in epsilons for j in jobs],
                                                  total=len(epsilons) * len(jobs), description=f"{bench} runs"):
        if key not in samples:
            if sum(x.tokens for x in samples.values()) > (4 << 20):
                samples.clear()  # bound memory; a sample is regenerated identically from its seed
            samples[key] = factory(rng=ctx.rng(*key))  # niah: the stream ("niah", v, task, L, s) as before
        sample = samples[key]
        perturber = TokenPerturber(make_mechanism(mech_kind, eps, table.dim), table, projector,
                                   block=cfg.perturb.block)
        client = DPMindClient(perturber, codec, chunk_tokens=cfg.loop.chunk_tokens, restore_k=cfg.loop.restore_k)
        t1 = time.perf_counter()
        noise_key = ("perturb", eps, *key[1:]) if bench == "niah" else ("perturb", eps, *key)
        tokens = client.ingest(sentence_stream(sample), ctx.rng(*noise_key))
        tok_time[0] += tokens
        tok_time[1] += time.perf_counter() - t1
        keep[eps].append(client.local_stats()["unchanged_fraction"])
        for q in sample.questions:
            for mode in ("memory", "chunk_only"):
                ans = client.ask(q.question, responder, mode=mode)
                restored[eps].append(ans.restored_tokens)
                per[(eps, L, mode)].setdefault(key, []).append(score(ans.dp_answer, q.answers))
                per[(eps, L, mode + "+denoise")].setdefault(key, []).append(score(ans.final_answer, q.answers))

    def units(eps, L, conf, metric, group=None):
        return [[d[metric] for d in qs] for k, qs in per[(eps, L, conf)].items()
                if group is None or group_of[k] == group]

    def mean(eps, L, group, conf, metric):
        return _pct(_mean_units(units(eps, L, conf, metric, group)))

    conf_level, reps = cfg.stats.confidence, cfg.stats.bootstrap
    boot_rng = ctx.rng("bootstrap")
    rows, ci_rows, diff_rows = [], [], []
    metrics_ci: dict[str, dict] = {}
    n_hay = {}
    for eps in epsilons:
        for L in lengths:
            rows.append([eps, L] + [mean(eps, L, None, c, "subem") for c in CONFIGS]
                        + [mean(eps, L, None, "memory+denoise", "em"), mean(eps, L, None, "memory+denoise", "f1")])
            n_hay[(eps, L)] = len(units(eps, L, "memory+denoise", "subem"))
            for c in CONFIGS:
                su, fu = units(eps, L, c, "subem"), units(eps, L, c, "f1")
                lo, hi, how = _subem_ci(su, boot_rng, reps, conf_level)
                flo, fhi = _boot(fu, boot_rng, reps, conf_level)
                ci_rows.append([eps, L, c, len(su), _pct(_mean_units(su)), f"[{_pct(lo):.1f}, {_pct(hi):.1f}] {how}",
                                _pct(_mean_units(fu)), f"[{_pct(flo):.1f}, {_pct(fhi):.1f}]"])
                metrics_ci[f"{c}@eps={eps}@L={L}"] = {
                    "n_haystacks": len(su), "subem": _pct(_mean_units(su)), "subem_ci": [_pct(lo), _pct(hi)],
                    "subem_ci_method": how, "f1": _pct(_mean_units(fu)), "f1_ci": [_pct(flo), _pct(fhi)]}
            for a, b in (("memory+denoise", "chunk_only+denoise"), ("memory", "chunk_only")):
                ua, ub = per[(eps, L, a)], per[(eps, L, b)]
                paired = [[da["subem"] - db["subem"] for da, db in zip(ua[k], ub[k])] for k in ua]
                lo, hi = _boot(paired, boot_rng, reps, conf_level)
                diff_rows.append([eps, L, f"{a} - {b}", len(paired), _pct(_mean_units(paired)),
                                  f"[{_pct(lo):.1f}, {_pct(hi):.1f}]"])
                metrics_ci[f"diff:{a}-{b}@eps={eps}@L={L}"] = {"subem": _pct(_mean_units(paired)),
                                                               "ci": [_pct(lo), _pct(hi)]}
    task_rows = []
    for eps in epsilons:
        for L in lengths:
            task_rows.append([eps, L] + [mean(eps, L, g, "memory+denoise", "subem") for g in groups])
    keep_rows = [[eps, float(np.mean(keep[eps])), float(np.mean(restored[eps]))] for eps in epsilons]
    metrics = {
        "benchmark": bench,
        "mechanism": mech_kind,
        "subem": {f"{c}@eps={e}@L={L}": mean(e, L, None, c, "subem") for c in CONFIGS for e in epsilons
                  for L in lengths},
        "f1": {f"{c}@eps={e}@L={L}": mean(e, L, None, c, "f1") for c in CONFIGS for e in epsilons
               for L in lengths},
        "intervals": metrics_ci,
        "confidence": conf_level,
        "haystacks_per_setting": min(n_hay.values()) if n_hay else 0,
        "subem_by_config": {c: float(np.nanmean([mean(e, L, None, c, "subem") for e in epsilons for L in lengths]))
                            for c in CONFIGS},
        "denoise_gain_subem": float(np.nanmean([mean(e, L, None, "memory+denoise", "subem")
                                                - mean(e, L, None, "memory", "subem")
                                                for e in epsilons for L in lengths])),
        "unchanged_token_fraction": {str(e): float(np.mean(keep[e])) for e in epsilons},
        "perturb_tokens_per_s": tok_time[0] / tok_time[1] if tok_time[1] > 0 else float("nan"),
        "tokens_perturbed": tok_time[0],
    }
    _plot(ctx, epsilons, lengths, mean, bench, mech_kind)
    name = "NIAH" if bench == "niah" else "Two-hop QA"
    pct = f"{100 * conf_level:g}%"
    return Result(
        metrics=metrics,
        tables=[
            Table(f"{name} utility (SubEM %, mean over questions of all haystacks of the row)",
                  ["epsilon", "tokens", *[f"SubEM {c}" for c in CONFIGS], "EM DP-MIND", "F1 DP-MIND"], rows,
                  note="memory+denoise = DP-MIND (memory loop + local span restoration); memory = same loop "
                       "without denoising; chunk_only = Table 3 ablation (no memory propagation). "
                       f"Responder: {cfg.responder.kind} (hops {_hops(cfg)}); projection: {cfg.perturb.projection}; "
                       f"noise: {mech_kind}."),
            Table(f"{name}: {pct} intervals (unit: haystack)",
                  ["epsilon", "tokens", "config", "haystacks", "SubEM %", "SubEM CI", "F1 %", "F1 CI"], ci_rows,
                  note="CP = exact Clopper-Pearson (one question per haystack); boot = percentile bootstrap over "
                       f"haystacks ({reps} resamples). F1 intervals are bootstrap."),
            Table(f"{name}: memory minus chunk-only, paired on the same perturbed haystacks (SubEM points)",
                  ["epsilon", "tokens", "difference", "haystacks", "mean", f"{pct} CI (bootstrap)"], diff_rows),
            Table(f"DP-MIND SubEM % by {'task' if bench == 'niah' else 'chain type'}",
                  ["epsilon", "tokens", *groups], task_rows),
            Table("Perturbation strength", ["epsilon", "tokens unchanged (fraction)", "tokens restored per answer"],
                  keep_rows,
                  note=f"perturbation throughput {metrics['perturb_tokens_per_s']:.0f} tokens/s over "
                       f"{tok_time[0]} tokens (includes tokenization and chunk decoding)"),
        ],
        sections=[("Reading the epsilon axis", EPSILON_NOTE)],
    )


EPSILON_NOTE = (
    "With privacy.mechanism = 'l2' the noise Z has density proportional to exp(-epsilon ||z||_2) in d = 384 "
    "dimensions, so ||Z|| ~ Gamma(d, 1/epsilon) has mean d/epsilon and each coordinate has standard deviation "
    "about sqrt(d)/epsilon (about 20/epsilon here). A token survives projection when the noise is small against "
    "half the distance to its nearest neighbours (MiniLM: median nearest-neighbour distance about 0.9, norms "
    "about 1.1), so the useful range is epsilon of about 50-200. A larger table dimension makes this worse, not "
    "better: at a fixed table scale a 3584-d table (the paper's Qwen2.5) gets a mean noise norm of 3584/epsilon "
    "(512 at epsilon 7, against 55 for MiniLM) and would need a larger epsilon. The paper's epsilon = 6-8 is "
    "only meaningful under a per-coordinate reading: with privacy.mechanism = 'l1' (independent "
    "Laplace(1/epsilon) per coordinate, density exp(-epsilon ||z||_1), guarantee epsilon * ||phi(a) - phi(b)||_1) "
    "epsilon 6/7/8 leaves about 0.67/0.85/0.94 of MiniLM tokens unchanged, like 'l2' at about 83/97/111. Epsilon "
    "values are comparable only within one mechanism and one table; the L1 distance between two rows is up to "
    "sqrt(d) times their L2 distance, so 'l1' at epsilon 7 is not a stronger guarantee than 'l2' at 97.")


def _plot(ctx, epsilons, lengths, mean, bench, mech_kind):
    plt = F.pyplot()
    fig, axes = plt.subplots(1, len(lengths), figsize=(4 * len(lengths), 3.4), sharey=True, squeeze=False)
    for ax, L in zip(axes[0], lengths):
        for c, style in zip(CONFIGS, ("-o", "--o", "-s", "--s")):
            ax.plot(epsilons, [mean(e, L, None, c, "subem") for e in epsilons], style, label=c)
        ax.set_title(f"{L:,} tokens")
        ax.set_xlabel(f"epsilon (per token, d_chi, {mech_kind})")
        ax.set_xscale("log")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("SubEM (%)")
    axes[0][-1].legend(fontsize=7)
    F.save(ctx, fig, "niah_subem_vs_epsilon" if bench == "niah" else "multihop_subem_vs_epsilon",
           "SubEM against per-token epsilon, one panel per context length")


EXPERIMENTS = {
    "dpmind.niah": Experiment("dpmind.niah", "DP-MIND on RULER-style NIAH or offline two-hop QA: SubEM/EM/F1 "
                              "(with confidence intervals) against epsilon and length, with/without denoising, "
                              "memory vs chunk-only, L2 or per-coordinate L1 noise.", SCHEMA, run, cross_checks),
}
