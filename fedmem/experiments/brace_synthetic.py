"""``brace.synthetic`` (papers/001 Sec. 6.1): its scenario keys, its cross-field checks, the run
(noiseless DAM vs Naive DAM vs BRACE vs global-noise DAM on shared innovations, a query sweep)
and its trajectory plot. The kind is registered in :mod:`fedmem.experiments.brace`."""

from __future__ import annotations

import numpy as np

from fedmem import figures as F
from fedmem.agent.brace.baselines import iterative_baseline
from fedmem.agent.brace.instances import basin_boundary_start, make_mixture, unstable_start
from fedmem.agent.brace.lsr import clean_trajectory, sq_dists
from fedmem.agent.brace.mechanism import NoiseSource, brace_run
from fedmem.agent.brace.params import GAMMA_MODES, NOT_DP_LABEL, PAPER_GAMMA_MODE, BraceParams
from fedmem.dp import samplers
from fedmem.experiments.brace_common import bank_chunks, brace_params, gamma_problems, scipy_boot
from fedmem.params import schema_of
from fedmem.report import Result, Table
from fedmem.scenario import Param, at_least, each, nonnegative, open_unit, positive

SYN_SCHEMA = {
    "data": {
        "n": Param(int, 256, "memories in the bank", check=at_least(2)),
        "mode_std": Param(float, 0.1, "std of the two dominant modes at (+-1, 0) (tight modes: the gate boundary "
                          "of a cue near the bridge crosses a dense mode, as in Sec. 6.1)", check=positive),
        "bridge_std": Param(list, [0.5, 0.4], "std (x, y) of the broader central component connecting the modes",
                            item_type=float, check=each(positive)),
        "bridge_weight": Param(float, 0.1, "weight of the central component", check=open_unit),
    },
    "query": {
        "q": Param(list, [-0.25, 0.25], "initial query for placement = 'fixed' (with 'basin_boundary' only q[1] "
                   "is used; ignored by 'unstable')", item_type=float),
        "placement": Param(str, "unstable", "'unstable' (paper setup): the cue of a public grid (search_box x "
                           "search_points^2, gates of >= min_gate memories) where Naive DAM's mean final error vs "
                           "noiseless DAM is largest over calibration_draws innovations drawn independently of the "
                           "reported ones; 'fixed': start at q; 'basin_boundary': start at the point (x, q[1]), "
                           "x in [-0.9, 0.9], where the noiseless endpoint's x-coordinate changes sign",
                           choices=("unstable", "fixed", "basin_boundary")),
        "search_box": Param(list, [-0.9, 0.9], "placement = 'unstable': candidate cues on [lo, hi]^2",
                            item_type=float),
        "search_points": Param(int, 37, "placement = 'unstable': grid points per axis", check=at_least(2)),
        "min_gate": Param(int, 15, "placement = 'unstable': a candidate cue's gate |I(D, q)| must hold at least "
                          "this many memories (a cue inside the data, not an empty-gate start)", check=positive),
        "calibration_draws": Param(int, 48, "placement = 'unstable': innovations per candidate cue (their own "
                                   "RNG stream, never reused for the reported draws)", check=positive),
        "sweep_x": Param(list, [-0.6, 0.6], "x-range of the query sweep (y = the start's y) for the averaged errors",
                         item_type=float),
        "sweep_points": Param(int, 25, "queries in the sweep", check=positive),
    },
    "mechanism": {
        # r, T, epsilon, delta, kappa: BraceParams' own knobs (one source of truth)
        **schema_of(BraceParams, drop=("d", "gamma_mode"), required=("epsilon", "delta"),
                    defaults={"r": 0.8, "T": 5, "kappa": 0.003}),
        "gamma": Param(float, help="required: smoothing parameter; 0 = largest value allowed by Eq. (8)",
                       check=nonnegative),
        "gamma_mode": Param(str, "eq8", "'eq8' (default): only the DP setting; 'paper_0.25': also run BRACE "
                            "with the paper's gamma = 0.25, reported as 'violates Eq. (8): not a DP guarantee'",
                            choices=GAMMA_MODES),
        "certificate_bound": Param(str, "all", "activated-branch bound of the certificate: 'all' (default: the "
                                   "box CorrectedCountSearch, the clean-trajectory propagation and the annulus bound, "
                                   "combined by min), 'both' (before the search: propagation and annulus), 'box', "
                                   "'propagation', 'annulus'",
                                   choices=("all", "both", "box", "propagation", "annulus")),
    },
    "repetitions": Param(int, 400, "paired noise draws at the start point (plotted: the switching draw with the "
                         "median final Naive error, else draw 0)", check=positive),
    "sweep_repetitions": Param(int, 100, "paired noise draws per sweep query", check=positive),
    "bootstrap": Param(int, 1000, "bootstrap resamples over draws for the 95% CIs", check=at_least(10)),
    "switch_threshold": Param(float, 0.25, "a draw 'switched modes' when its final per-coordinate squared "
                              "error vs noiseless DAM exceeds this (0.25: ||Y_T - z_T|| > 0.71)", check=positive),
}


def syn_cross_checks(cfg):
    m = cfg.mechanism
    out = gamma_problems([m.epsilon], m.delta, [m.T], 2, m.gamma, "mechanism.gamma")
    if len(cfg.query.sweep_x) != 2:
        out.append(("query.sweep_x", f"must be [low, high], found {cfg.query.sweep_x!r}"))
    if len(cfg.query.q) != 2:
        out.append(("query.q", f"must have 2 coordinates, found {len(cfg.query.q)}"))
    if len(cfg.query.search_box) != 2 or not cfg.query.search_box[0] < cfg.query.search_box[1]:
        out.append(("query.search_box", f"must be [low, high] with low < high, found {cfg.query.search_box!r}"))
    if m.gamma_mode not in GAMMA_MODES:
        out.append(("mechanism.gamma_mode", f"must be one of {list(GAMMA_MODES)}, found {m.gamma_mode!r}"))
    if len(cfg.data.bridge_std) != 2:
        out.append(("data.bridge_std", f"must have 2 entries, found {len(cfg.data.bridge_std)}"))
    return out


def _mean_ci(v: np.ndarray, boot: tuple[int, int]) -> tuple[float, float, float]:
    """Mean over draws and the 95% percentile-bootstrap interval (scipy.stats.bootstrap, ``boot = (resamples, seed)``)."""
    return scipy_boot(v, boot)


def _fmt(ci) -> str:
    return f"{ci[0]:.3g} [{ci[1]:.3g}, {ci[2]:.3g}]"


def run_synthetic(cfg, ctx) -> Result:
    m = cfg.mechanism
    X = make_mixture(cfg.data.n, cfg.data.mode_std, cfg.data.bridge_std, cfg.data.bridge_weight, ctx.rng("data"))
    params = brace_params(m.r, m.T, m.epsilon, m.delta, 2, m.kappa, m.gamma)
    paper = (BraceParams(r=m.r, T=m.T, epsilon=m.epsilon, delta=m.delta, d=2, kappa=m.kappa,
                         gamma_mode=PAPER_GAMMA_MODE) if m.gamma_mode == PAPER_GAMMA_MODE else None)
    R = cfg.repetitions
    calib = {}
    if cfg.query.placement == "unstable":
        q0, calib = unstable_start(X, params, cfg.query.search_box, cfg.query.search_points, cfg.query.min_gate,
                                   cfg.query.calibration_draws, ctx.rng("calibration"))
    elif cfg.query.placement == "basin_boundary":
        q0 = basin_boundary_start(X, cfg.query.q[1], m.r, m.T)
    else:
        q0 = np.asarray(cfg.query.q, dtype=np.float64)
    q = np.repeat(q0[None, :], R, axis=0)
    normals = samplers.gaussian(1.0, (R, m.T, 2), ctx.rng("innovations"))  # shared by the noisy methods
    boot = (cfg.bootstrap, int(ctx.rng("bootstrap").integers(2**62)))   # scipy.stats.bootstrap, paired by seed
    z = clean_trajectory(X, q[:1], m.r, m.T)[:, 0]                            # (T+1, 2)
    err = lambda Y, zz: np.sum((Y - zz) ** 2, axis=2) / 2  # noqa: E731  (rows, T) per-coordinate
    bound = m.certificate_bound
    runs = {"BRACE": brace_run(X, q, params, NoiseSource(normals=normals), bound=bound)}
    if paper is not None:
        runs["BRACE paper-gamma"] = brace_run(X, q, paper, NoiseSource(normals=normals), bound=bound)
    traj = {"Naive DAM": iterative_baseline(X, q, params, normals, "count"),
            "global-noise DAM": iterative_baseline(X, q, params, normals, "global"),
            **{k: v.Y for k, v in runs.items()}}
    errs = {k: err(Y, z[None, 1:]) for k, Y in traj.items()}
    names = list(errs)
    rows = []
    for t in range(m.T):
        row = [t + 1] + [_fmt(_mean_ci(errs[k][:, t], boot)) for k in names]
        row += [f"{np.median(run.delta_bar[:, t]):.3g}" for run in runs.values()]
        row += [f"{runs['BRACE'].activated[:, t].mean():.2f}", f"{runs['BRACE'].uncertain[:, t].mean():.2f}"]
        rows.append(row)
    thr = cfg.switch_threshold
    switch = {k: _mean_ci((e[:, -1] > thr).astype(np.float64), boot) for k, e in errs.items()}
    # query sweep: every query of the line gets the same Rs innovations
    Rs = cfg.sweep_repetitions
    xs = np.linspace(cfg.query.sweep_x[0], cfg.query.sweep_x[1], cfg.query.sweep_points)
    qs = np.stack([xs, np.full_like(xs, q0[1])], axis=1)
    Qs = np.repeat(qs, Rs, axis=0)
    ns = np.tile(normals[:Rs], (len(xs), 1, 1))
    zs = clean_trajectory(X, qs, m.r, m.T)                                   # (T+1, S, 2)
    zs_rep = np.repeat(zs, Rs, axis=1)
    zt = np.transpose(zs_rep[1:], (1, 0, 2))
    Yb, db, act, unc = bank_chunks(X, Qs, params, ns, clean=zs_rep, bound=bound)
    s_b, s_n = err(Yb, zt), err(iterative_baseline(X, Qs, params, ns, "count"), zt)
    s_g = err(iterative_baseline(X, Qs, params, ns, "global"), zt)
    y1 = traj["Naive DAM"][0, 0]
    gz = sq_dists(X, z[1][None])[0] <= m.r ** 2
    gy = sq_dists(X, y1[None])[0] <= m.r ** 2
    switched = errs["Naive DAM"][:, -1] > thr
    if switched.sum() >= 2:
        sw_idx = (cfg.bootstrap, int(ctx.rng("bootstrap-switched").integers(2**62)))
        cond = {k: [list(_mean_ci(e[switched, t], sw_idx)) for t in range(m.T)] for k, e in errs.items()}
    else:
        cond = {}
    metrics = {
        "gamma": params.gamma, "threshold_tau": params.threshold, "noise_multiplier": params.noise_multiplier,
        "placement": cfg.query.placement, "certificate_bound": bound, **calib,
        "per_step_error_given_naive_switch": cond, "naive_switched_draws": int(switched.sum()),
        # switching draws whose Naive endpoint lies on the other side, beyond |x| > 0.5 (the opposite mode)
        "naive_switched_to_opposite_side": int(np.sum(switched & (np.abs(traj["Naive DAM"][:, -1, 0]) > 0.5)
                                                      & (np.sign(traj["Naive DAM"][:, -1, 0]) != np.sign(z[-1, 0])))),
        "start": q0.tolist(), "noiseless_endpoint": z[-1].tolist(), "draws": R,
        "first_perturbation_norm_naive_draw0": float(np.linalg.norm(y1 - z[1])),
        "step2_left_clean_gate": int(np.sum(gz & ~gy)), "step2_entered_released_gate": int(np.sum(gy & ~gz)),
        "step2_gate_sizes": [int(gz.sum()), int(gy.sum())],
        "per_step_error": {k: [list(_mean_ci(e[:, t], boot)) for t in range(m.T)] for k, e in errs.items()},
        "median_delta_bar": {k: np.median(v.delta_bar, axis=0).tolist() for k, v in runs.items()},
        "switch_share": {k: list(v) for k, v in switch.items()},
        "final_error_naive_mean": float(errs["Naive DAM"][:, -1].mean()),
        "final_error_brace_mean": float(errs["BRACE"][:, -1].mean()),
        "final_error_global_mean": float(errs["global-noise DAM"][:, -1].mean()),
        "naive_error_grows": bool(errs["Naive DAM"][:, -1].mean() > errs["Naive DAM"][:, 0].mean()),
        "sweep_final_error": {"naive": float(s_n[:, -1].mean()), "brace": float(s_b[:, -1].mean()),
                              "global": float(s_g[:, -1].mean())},
        "sweep_naive_share_final_error_above_0.1": float(np.mean(s_n[:, -1] > 0.1)),
        "sweep_brace_share_final_error_above_0.1": float(np.mean(s_b[:, -1] > 0.1)),
        "sweep_activation_rate": float(act.mean()), "sweep_uncertain_rate": float(unc.mean()),
        "sweep_median_delta_bar": np.median(db, axis=0).tolist(),
    }
    if paper is not None:
        metrics["paper_gamma_label"] = NOT_DP_LABEL
        metrics["paper_gamma"] = paper.gamma
    label = {"BRACE": f"BRACE (gamma {params.gamma:.3g}, Eq. (8))",
             "BRACE paper-gamma": f"BRACE gamma 0.25 ({NOT_DP_LABEL})"}
    cols = ["step"] + [label.get(k, k) + " mean [95% CI]" for k in names]
    cols += [f"median Delta_bar {label[k]}" for k in runs] + ["BRACE H_t rate", "BRACE activation not excluded"]
    sw_draws = np.flatnonzero(errs["Naive DAM"][:, -1] > cfg.switch_threshold)
    # Fig. 1 shows a switching draw: plot the one with the median final Naive error among them
    plot_draw = (int(sw_draws[np.argsort(errs["Naive DAM"][sw_draws, -1])[sw_draws.size // 2]]) if sw_draws.size
                 else 0)
    metrics["plotted_draw"] = plot_draw
    _plot_synthetic(ctx, X, z, traj, q0, errs, boot, m.r, label, plot_draw)
    note = (f"Per-coordinate squared error ||Y_t - z_t||^2 / 2 vs noiseless DAM at the start "
            f"{np.round(q0, 5).tolist()} "
            f"({cfg.query.placement}); n = {R} paired draws (same innovations for every noisy method), 95% "
            f"percentile-bootstrap CIs over draws ({cfg.bootstrap} resamples). Mode switch (final error > {thr}): "
            + "; ".join(f"{label.get(k, k)} {_fmt(v)}" for k, v in switch.items())
            + f". tau = sqrt(kappa T) r = {params.threshold:.4g}. Paper (one draw): Naive 0.08445 -> 0.42699 -> "
            "1.00503 at steps 3-5, BRACE final 0.01222 (paper gamma 0.25). Certificate bound: "
            f"{bound}." + (f" Cue chosen among {calib['candidates']} candidates on {calib['calibration_draws']} "
                           "calibration innovations (own RNG stream)." if calib else ""))
    sweep_rows = [[t + 1, float(s_n[:, t].mean()), float(s_b[:, t].mean()), float(s_g[:, t].mean()),
                   float(act[:, t].mean()), float(unc[:, t].mean()), float(np.median(db[:, t]))] for t in range(m.T)]
    tables = [Table("Per-step error relative to noiseless DAM at the start point", cols, rows, note=note)]
    if cond:
        paper_naive = {3: 0.08445, 4: 0.42699, 5: 1.00503}
        crow = [[t + 1] + [_fmt(cond[k][t]) for k in names] + [paper_naive.get(t + 1, "-")] for t in range(m.T)]
        tables.append(Table("Per-step error on the draws where Naive DAM switched modes (final error > "
                            f"{thr}; {int(switched.sum())} of {R})", ["step"] + [label.get(k, k) for k in names]
                            + ["paper Naive DAM (one switching draw)"], crow,
                            note="The paper's Fig. 1 shows one draw in which Naive DAM switches; these rows average "
                                 "the draws that switched (same innovations for every method), 95% bootstrap CIs."))
    return Result(metrics=metrics, tables=tables + [
        Table("Query sweep (Eq. (8) gamma)", ["step", "Naive sweep", "BRACE sweep", "global sweep", "BRACE H_t rate",
                                              "activation not excluded", "median Delta_bar"], sweep_rows,
              note=f"mean over {len(xs)} queries on x in {list(cfg.query.sweep_x)} (y = {q0[1]:.3g}) x {Rs} draws")])


def _plot_synthetic(ctx, X, z, traj, q, errs, boot, r, label, draw=0):
    plt = F.pyplot()
    colors = {"Naive DAM": F.colour(3), "global-noise DAM": F.colour(2), "BRACE": F.colour(0),
              "BRACE paper-gamma": F.colour(4)}
    fig, ax = plt.subplots(1, 2, figsize=(12, 4.8))
    ax[0].scatter(X[:, 0], X[:, 1], s=6, c="0.75", label="memories")
    ax[0].plot(z[:, 0], z[:, 1], "k-o", ms=4, lw=1.5, label="noiseless DAM")
    for k in ("Naive DAM", "BRACE"):
        path = np.vstack([q, traj[k][draw]])
        ax[0].plot(path[:, 0], path[:, 1], "-s", color=colors[k], ms=3, lw=1.1,
                   label=f"{label.get(k, k)} (draw {draw})")
    ax[0].add_patch(plt.Circle(q, r, fill=False, ls=":", color="0.4", label=f"query radius r={r:g}"))
    ax[0].set_aspect("equal")
    ax[0].set_xlabel("x1")
    ax[0].set_ylabel("x2")
    ax[0].legend(fontsize=7)
    ax[0].set_title(f"Trajectories (draw {draw}: median final Naive error among switching draws)", fontsize=9)
    steps = np.arange(1, next(iter(errs.values())).shape[1] + 1)
    for k, e in errs.items():
        ci = np.array([_mean_ci(e[:, t], boot) for t in range(e.shape[1])])
        ax[1].plot(steps, ci[:, 0], "-o", color=colors[k], label=f"{label.get(k, k)} (mean, 95% CI)")
        ax[1].fill_between(steps, ci[:, 1], ci[:, 2], color=colors[k], alpha=0.2)
    ax[1].plot([3, 4, 5], [0.08445, 0.42699, 1.00503], "x--", color=colors["Naive DAM"],
               label="paper Naive DAM (one draw)")
    ax[1].plot([5], [0.01222], "x", color=colors["BRACE"], label="paper BRACE final (one draw, gamma 0.25)")
    ax[1].set_yscale("log")
    ax[1].set_xlabel("update step t")
    F.integer_ticks(ax[1], "x")
    ax[1].set_ylabel("per-coordinate squared error vs noiseless")
    ax[1].set_title("Error along the trajectory", fontsize=9)
    ax[1].legend(fontsize=6)
    F.save(ctx, fig, "synthetic_trajectory", "BRACE vs Naive DAM: one trajectory and the error per update step")
