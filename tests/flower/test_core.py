"""GatewayCore (fedmem.flower.core): server-side checks and clipping, the fixed-point sum, the range check
at construction, fail-closed-without-values, booking before anyone sees a release, pending charges
shared by every wrapper on one store. Each defence has a companion broken variant the same test catches."""

from __future__ import annotations

import logging
import math

import numpy as np
import pytest

pytest.importorskip("flwr")

from flwr.server.strategy import FedAvg as LegacyFedAvg  # noqa: E402
from flwr.serverapp.strategy import FedAvg  # noqa: E402

from fedmem.dp import Accountant, DurableStore  # noqa: E402
from fedmem.flower import GatewayCore, GatewayStrategy, SupportGatewayStrategy  # noqa: E402
from fedmem.flower.core import RANGE_LIMIT, epsilon_of  # noqa: E402
from fedmem.flower.harness import Spy, legacy_round, message_round  # noqa: E402

M = 3


def _core(**kw):
    args = dict(num_sampled_clients=M, noise_multiplier=4.0, sensitivity=1.0, public_num_examples=5,
                rng=np.random.default_rng(0))
    args.update(kw)
    return GatewayCore(Accountant("rdp"), **args)


def _legacy(acc=None, *, total=math.inf, seed=0, inner=None, **kw):
    inner = inner or LegacyFedAvg(min_fit_clients=M, min_available_clients=M)
    return SupportGatewayStrategy(inner, acc or Accountant("rdp"), num_sampled_clients=M, dp="fedmem",
                                  noise_multiplier=kw.pop("noise_multiplier", 4.0), sensitivity=1.0,
                                  public_num_examples=5, epsilon_budget=math.inf, total_epsilon_budget=total,
                                  rng=np.random.default_rng(seed), **kw)


def _message(acc=None, *, total=math.inf, seed=0, inner=None, **kw):
    inner = inner or FedAvg(min_train_nodes=M, min_available_nodes=M)
    return GatewayStrategy(inner, kw.pop("noise_multiplier", 4.0), 1.0, M, public_num_examples=5,
                           ledger=acc or Accountant("rdp"), epsilon_budget=math.inf, total_epsilon_budget=total,
                           rng=np.random.default_rng(seed), **kw)


# ------------------------------------------------------------------ construction
def test_range_check_at_construction_names_the_arguments():
    with pytest.raises(ValueError, match=r"num_sampled_clients x sensitivity.*num_sampled_clients=3, "
                                         r"sensitivity=1.0, clip_norm=1.0, noise_multiplier=1e-10"):
        _core(noise_multiplier=1e-10)
    with pytest.raises(ValueError, match=r"clip_norm=1e\+30"):
        _core(clip_norm=1e30)
    core = _core()
    assert core.grid == 2.0 ** -18           # issue 37's configuration: C = 1, sigma 4 -> g = 2^-18
    assert M * (core.sensitivity / core.grid + 1) < RANGE_LIMIT
    with pytest.raises(ValueError, match="clipping must be one of"):
        _core(clipping="maybe")


# ------------------------------------------------------------------ checks and clipping
@pytest.mark.parametrize("bad, reason", [
    ([np.array([1, 0, 0, 0])], "dtype"),                       # int64
    ([np.array([2 ** 62, 0, 0, 0], dtype=np.int64)], "dtype"),
    ([np.array([np.nan, 0, 0, 0])], "non_finite"),
    ([np.array([np.inf, 0, 0, 0])], "non_finite"),
    ([np.full(4, np.finfo(float).max / 2)], "too_large"),
    ([np.zeros(5)], "shapes"),
])
def test_a_bad_reply_is_refused_before_any_sum(bad, reason):
    core = _core()
    reasons, mat, _ = core.prepare([bad, [np.zeros(4)], [np.zeros(4)]])
    assert reasons == [reason] and mat is None


def test_server_clipping_bounds_every_reply_and_client_clipping_refuses():
    reps = [[np.array([300.0, 400.0])], [np.array([0.3, 0.4])], [np.zeros(2)]]
    _, mat, _ = _core().prepare(reps)
    assert np.linalg.norm(mat, axis=1) == pytest.approx([1.0, 0.5, 0.0])
    assert _core(clipping="client").prepare(reps)[0] == ["norm"]
    assert _core(clipping="client").prepare([[np.array([0.6, 0.8])], [np.zeros(2)], [np.zeros(2)]])[0] == []
    # record-level adjacency: the enforced per-reply bound is clip_norm, the booking stays sensitivity
    _, mat, _ = _core(clip_norm=10.0).prepare(reps)
    assert np.linalg.norm(mat, axis=1) == pytest.approx([10.0, 0.5, 0.0])
    # float32 / float16 replies are floats: accepted (as float64)
    assert _core().prepare([[np.ones(2, np.float32) * .1], [np.zeros(2, np.float16)], [np.zeros(2)]])[0] == []


def test_an_out_of_contract_training_reply_is_clipped_not_booked_at_a_false_sensitivity():
    """Norm-500 replies against sensitivity 1: the release moves by at most C / m between worlds (clipped);
    without clipping (broken variant: the same replies summed as they come) it moves by 500 / m."""
    gw = _message()
    big = [[np.full(4, 250.0)], [np.zeros(4)], [np.zeros(4)]]
    zero = [[np.zeros(4)]] * 3
    a, _ = message_round(gw, 1, big)
    b, _ = message_round(gw, 2, zero)
    assert a is not None and b is not None
    # the noise of the two releases is the same draw sequence only up to the pool; compare to the clip bound
    core = gw.core
    _, mat, _ = core.prepare(big)
    assert np.linalg.norm(core.fixed_point_sum(mat) * core.grid) <= 1.0 + core.grid * 2
    raw = np.stack([x[0] for x in big])          # broken variant: summed as it came
    assert not np.linalg.norm(core.fixed_point_sum(raw) * core.grid) <= 1.0 + core.grid * 2


def test_fixed_point_sum_is_the_sum_on_the_grid():
    core = _core()
    rng = np.random.default_rng(1)
    rows = rng.standard_normal((M, 64))
    rows /= np.linalg.norm(rows, axis=1, keepdims=True)
    s = core.fixed_point_sum(rows)
    assert s.dtype == np.int64
    assert np.max(np.abs(s * core.grid - rows.sum(axis=0))) <= M * core.grid / 2


# ------------------------------------------------------------------ fail closed without values
class _Boom(Exception):
    pass


SECRET = "17179869184.5"


def _boom(*a, **k):
    raise _Boom(f"value too large. Found {SECRET}.")


def _observed(gw, run, caplog) -> list[str]:
    """Everything the caller and the server log see of one round, and the operator's audit."""
    caplog.clear()
    seen = []
    try:
        out, _ = run(gw, 1, [[np.ones(4) * .1]] * 3)
        seen.append(repr(out))
    except Exception as exc:       # noqa: BLE001 - the observation
        seen.append(f"{exc!r} {exc.__cause__!r} {exc.__context__!r}")
    return seen + [r.getMessage() for r in caplog.records] + [repr(r) for r in gw.audit]


@pytest.mark.parametrize("api", ["legacy", "message"])
@pytest.mark.parametrize("stage", ["release", "book"])
def test_any_exception_is_the_uniform_refusal_without_values(api, stage, monkeypatch, caplog):
    """An exception whose text carries the exact sum, raised inside the release or the booking: the caller
    gets the uniform refusal, no log line, audit reason or return value carries the text, nothing is booked.
    Broken variant (the pre-issue wrapper, exceptions let out: PreIssueGateway(fail_open=True)): the same
    observation finds the text."""
    from fedmem.attacks.malicious_client import make_gateway

    caplog.set_level(logging.DEBUG)
    gw = _legacy() if api == "legacy" else _message()
    monkeypatch.setattr(gw.core, "noised_sum" if stage == "release" else "book", _boom)
    seen = _observed(gw, legacy_round if api == "legacy" else message_round, caplog)
    assert not any(SECRET in s for s in seen)
    assert seen[0] == "None"
    assert gw.audit[-1].reasons == (f"{stage}_error:_Boom",) and gw.audit[-1].epsilon_booked == 0.0
    assert gw.core.spent() == 0.0
    broken = make_gateway("legacy", broken={"fail_open": True})
    monkeypatch.setattr(broken.core, "fixed_point_sum" if stage == "release" else "book", _boom)
    assert any(SECRET in s for s in _observed(broken, legacy_round, caplog))     # caught


def test_decide_error_is_a_refusal_without_values(monkeypatch):
    gw = _legacy()

    def boom(*a, **k):
        raise RuntimeError("disk says 12345")

    monkeypatch.setattr(gw.core.gateway, "decide", boom)
    out, ins = legacy_round(gw, 1, [[np.zeros(2)]] * 3)
    assert out is None and ins == []
    assert gw.audit[-1].reasons == ("decide_error:RuntimeError",)


# ------------------------------------------------------------------ book before anyone sees it
@pytest.mark.parametrize("api", ["legacy", "message"])
def test_two_wrappers_on_one_store_see_each_others_pending_round(api):
    """Issue 37, measurement 3: two wrappers on one store, total budget of 1.01 rounds, both configure before
    either aggregates. Only one is admitted; the wrapped strategy of the other never sees anything, and every
    release the wrapped strategies saw was booked. Broken variant (each wrapper on its own pending charges: a
    second store object per wrapper, the pre-issue behaviour) admits both."""
    from flwr.app import ArrayRecord, ConfigRecord
    from flwr.common import ndarrays_to_parameters
    from flwr.serverapp.exception import PrivacyBudgetExhausted

    from fedmem.flower.harness import FakeClientManager, FakeGrid, _identity

    one = epsilon_of(0.5, 1e-6)

    def admitted(shared: bool) -> int:
        store = DurableStore(None)
        accs = [Accountant("rdp", store=store, name="shared")] * 2 if shared else [
            Accountant("rdp", store=DurableStore(None), name="shared") for _ in range(2)]
        make = _legacy if api == "legacy" else _message
        ws = [make(accs[k], total=1.01 * one, seed=k, noise_multiplier=0.5) for k in range(2)]
        n = 0
        for w in ws:
            if api == "legacy":
                n += bool(w.configure_fit(1, ndarrays_to_parameters([np.zeros(2)]), FakeClientManager(M)))
            else:
                _identity()
                try:
                    n += bool(list(w.configure_train(1, ArrayRecord([np.zeros(2)]), ConfigRecord(), FakeGrid(M))))
                except PrivacyBudgetExhausted:
                    pass
        return n

    assert admitted(shared=True) == 1
    assert admitted(shared=False) == 2          # caught: private pending charges admit both


@pytest.mark.parametrize("api", ["legacy", "message"])
def test_a_booking_that_fails_releases_nothing_to_anyone(api, monkeypatch):
    """The wrapped strategy and the caller see a release only after booking committed. Broken variant
    (the wrapped strategy called before booking, as before issue 37): its spy sees the release."""
    from fedmem.errors import BudgetExceeded

    inner = LegacyFedAvg(min_fit_clients=M, min_available_clients=M) if api == "legacy" else \
        FedAvg(min_train_nodes=M, min_available_nodes=M)
    spy = Spy(inner)
    gw = _legacy(inner=inner) if api == "legacy" else _message(inner=inner)

    def refuse(*a, **k):
        raise BudgetExceeded("spent elsewhere")

    monkeypatch.setattr(gw.core, "book", refuse)
    run = legacy_round if api == "legacy" else message_round
    out, _ = run(gw, 1, [[np.ones(2) * .1]] * 3)
    assert out is None and 1 not in spy.views and gw.audit[-1].reasons == ("epsilon_budget",)
    # the same spy catches a wrapper that hands the release out first
    gw2 = _legacy(inner=inner) if api == "legacy" else _message(inner=inner)
    monkeypatch.setattr(gw2.core, "book", refuse)
    if api == "legacy":
        orig = gw2._release
        monkeypatch.setattr(gw2, "_release", lambda r, res, f: gw2._inner_aggregate(r, res, orig(r, res, f)) and orig(r, res, f))
    else:
        orig = gw2._release
        monkeypatch.setattr(gw2, "_release", lambda r, reps, arrays: (lambda v: (gw2._hand_out(r, v), v)[1])(
            orig(r, reps, arrays)))
    run(gw2, 2, [[np.ones(2) * .1]] * 3)
    assert 2 in spy.views


def test_num_examples_mismatch_keeps_what_came_back_for_the_operator():
    gw = _message()
    out, _ = message_round(gw, 1, [[np.zeros(2)]] * 3, num_examples=[600, 600, 5])
    assert out is None
    rec = gw.audit[-1]
    assert rec.reasons == ("num_examples",) and rec.detail["num_examples"] == [5, 600]
