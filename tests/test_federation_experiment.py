"""The federation.support_leak experiment: validation, the attack pipeline, an end-to-end CLI run."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from fedmem import cli
from fedmem.dp import GaussianMechanism
from fedmem.errors import SupportPrivacyViolation

ROOT = Path(__file__).resolve().parent.parent
SCEN = ROOT / "scenarios"


# ------------------------------------------------------------------ a small fake engine
@dataclass(frozen=True)
class _Resp:
    query_id: int
    value: np.ndarray
    count: float | None
    receipts: np.ndarray | None
    channels: tuple
    epsilon_spent: float


@dataclass(frozen=True)
class _Truth:
    sum: np.ndarray
    count: int
    tallies: np.ndarray
    contributing: np.ndarray


class FakeFederation:
    """Numpy stand-in with the engine's API: threshold selection, Gaussian noise, receipts policy.

    Enough to exercise the experiment's bookkeeping without Ray; the real engine is used
    in the end-to-end test below.
    """

    def __init__(self, config, data, *, accountant, rng, ray_address=None, parties=None):
        self.c, self.data, self.acc, self.rng, self.i = config, data, accountant, rng, 0

    def ground_truth(self, q):
        q = q / np.linalg.norm(q)
        tallies, sums = [], np.zeros(self.data.value_dim)
        for k, v in zip(self.data.keys, self.data.values):
            s = k @ q
            top = np.argsort(-s)[: self.c.k_local]
            sel = top[s[top] >= self.c.threshold] if self.c.selection == "threshold" else top
            tallies.append(len(sel))
            sums += v[sel].sum(0)
        t = np.array(tallies)
        return _Truth(sums, int(t.sum()), t, t > 0)

    def retrieve(self, q, family=None, retry_of=None):
        tr = self.ground_truth(q)
        if tr.count == 0:
            raise SupportPrivacyViolation("no memory available", reasons=("empty",))
        n = self.c.n_bound if self.c.calibration == "global" else tr.count
        mech = GaussianMechanism.from_noise_multiplier(self.c.sigma, self.c.clip / n)
        self.acc.book(mech.event(), "value")
        channels = ["value"]
        if self.c.receipts == "expose":
            channels += ["receipts", "count"]
        if self.c.gateway and self.c.receipts == "expose":
            raise SupportPrivacyViolation("no memory available", reasons=("support leak",), booked=("value",))
        self.i += 1
        return _Resp(self.i, mech.release(tr.sum / tr.count, self.rng),
                     float(tr.count) if self.c.receipts == "expose" else None,
                     tr.tallies.copy() if self.c.receipts == "expose" else None,
                     tuple(channels), self.acc.spent(self.c.delta))

    def close(self):
        pass


@dataclass(frozen=True)
class _Cfg:
    shards: int
    records_per_shard: int
    key_dim: int
    value_dim: int
    clip: float
    k_local: int
    selection: str
    k: int
    threshold: float
    sigma: float
    delta: float
    calibration: str
    n_bound: int
    receipts: str
    gateway: bool


@pytest.fixture
def fake_engine(monkeypatch):
    from fedmem.federation import experiment as E

    names = set(_Cfg.__dataclass_fields__)
    monkeypatch.setattr(E, "federation_config", lambda cfg: _Cfg(**{k: v for k, v in cfg.federation.to_dict().items()
                                                                     if k in names}))
    monkeypatch.setattr(E, "make_federation", lambda config, data, **kw: FakeFederation(config, data, **kw))

    class NoServices:                     # no Ray, no parties: the fake computes in numpy
        parties = None

        def __init__(self, cfg, ray_address):
            pass

        def close(self):
            pass

    monkeypatch.setattr(E, "Services", NoServices)


SMALL = ["federation.shards=8", "federation.records_per_shard=12", "federation.key_dim=16",
         "federation.value_dim=8", "federation.n_bound=8", "federation.hosts=1", "federation.mpc=\"plaintext\"",
         "data.clusters=4", "attack.queries=30", "attack.targets=3", "attack.repeats=6",
         "attack.retry_counts=[1, 4]"]


def _run(tmp_path, overrides, name="run"):
    payload, result, _ = cli.run_scenario(SCEN / "support_leak_40.toml", overrides, tmp_path / name,
                                          as_json=True, show_progress=False)
    return payload, result


def test_pipeline_on_fake_engine_undefended(tmp_path, fake_engine):
    payload, result = _run(tmp_path, SMALL)
    m = payload["metrics"]
    assert m["reconstruction"]["rate"] == 1.0          # exposed exact receipts
    assert m["forwarded_leaky"] > 0
    assert m["differencing"]["auc"] > 0.5
    assert m["retries_booked"] is True
    eps = [r["eps_r"] for r in m["retries"] if r["mode"] == "declared"]
    assert eps == sorted(eps) and eps[-1] > eps[0]
    for fig in ("reconstruction.png", "membership_roc.png", "epsilon.png"):
        assert (tmp_path / "run" / fig).exists()
    assert (tmp_path / "run" / "report.md").read_text().count("Attack metrics") == 1


def test_pipeline_on_fake_engine_gateway_rejects_everything_leaky(tmp_path, fake_engine):
    payload, _ = _run(tmp_path, SMALL + ["federation.gateway=true"], "gw")
    m = payload["metrics"]
    assert m["forwarded_leaky"] == 0 and m["rejected"] == m["queries"]
    assert m["bookings_of_rejected"] == m["queries"]    # the fake emits (and books) the value before refusing
    assert m["differencing"]["auc"] == 0.5


# ------------------------------------------------------------------ validation
def test_invalid_scenario_reports_every_problem_with_exit_code_2(tmp_path, capsys):
    bad = tmp_path / "bad.toml"
    bad.write_text('kind = "federation.support_leak"\n[federation]\nshards = 4\nk_local = 5\nselection = "topk"\n'
                   'k = 500\nsigma = -1.0\ndelta = 1.5\nbogus = 3\nreceipts = "sometimes"\n'
                   '[attack]\nqueries = "many"\n')
    assert cli.main(["run", str(bad)]) == 2
    err = capsys.readouterr().err
    for needle in ("federation.sigma", "federation.delta", "federation.bogus", "federation.receipts",
                   "attack.queries"):
        assert needle in err, needle
    assert "Traceback" not in err
    bad2 = tmp_path / "bad2.toml"
    bad2.write_text('kind = "federation.support_leak"\n[federation]\nshards = 4\nk_local = 5\nselection = "topk"\n'
                    'k = 500\nrecords_per_shard = 3\nhosts = 9\n')
    assert cli.main(["run", str(bad2)]) == 2
    err = capsys.readouterr().err
    for needle in ("federation.k:", "federation.k_local", "federation.hosts", "federation.n_bound"):
        assert needle in err, needle


def test_shipped_scenarios_validate():
    from fedmem.scenario import load_scenario

    files = sorted(SCEN.glob("support_leak_40*.toml"))
    assert len(files) == 5
    for p in files:
        sc = load_scenario(p)
        assert sc.config.federation.shards == 40 and sc.config.attack.queries == 300
        assert sc.config.federation.sigma == 1.2 and sc.config.federation.delta == 1e-6


def test_demo_runs_support_leak_undefended_and_gateway(monkeypatch, capsys):
    names = [f for _, f, _ in cli.DEMO_RUNS]
    assert "support_leak_40.toml" in names and "support_leak_40_gateway.toml" in names
    from fedmem.report import Result

    metrics = {"support_leak_40.toml": {"forwarded": 300, "rejected": 0, "reconstruction": {"rate": 1.0},
                                        "differencing": {"auc": 1.0, "eps_lower": 4.7},
                                        "booked_epsilon_per_query": 4.25, "forwarded_leaky": 300},
               "support_leak_40_gateway.toml": {"forwarded": 0, "rejected": 300, "reconstruction": {"rate": 0.0},
                                                "differencing": {"auc": 0.5}, "forwarded_leaky": 0,
                                                "utility_mse": None}}
    monkeypatch.setattr(cli, "run_scenario", lambda path, *a, **k: (
        {"metrics": metrics[Path(path).name]}, Result(metrics={}), Path("runs") / Path(path).stem))
    assert cli.main(["demo"]) == 0
    out = capsys.readouterr().out
    assert "What the adversary got" in out and "Undefended" in out and "Gateway" in out
    assert "300 / 0" in out and "0 / 300" in out


# ------------------------------------------------------------------ end to end (real engine)
E2E = ["federation.shards=10", "federation.records_per_shard=20", "federation.key_dim=32",
       "federation.value_dim=16", "federation.n_bound=10", "federation.hosts=1", "federation.mpc=\"plaintext\"",
       "data.clusters=4", "attack.queries=24", "attack.targets=2", "attack.repeats=8",
       "attack.retry_counts=[1, 3]"]


def test_end_to_end_through_cli_undefended_then_gateway(tmp_path, ray_local):
    """The real engine (Ray shard hosts, plaintext parties) through ``fedmem run --json``."""
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = cli.main(["run", str(SCEN / "support_leak_40.toml"), "--json", "--out", str(tmp_path / "u"),
                       *[x for s in E2E for x in ("--set", s)]])
    assert rc == 0
    m = json.loads(out.getvalue())["metrics"]
    assert m["reconstruction"]["rate"] >= 0.9                # exact receipts: reconstruction is exact
    assert m["forwarded_leaky"] == m["forwarded"] > 0         # every undefended answer leaks support
    assert m["differencing"]["auc"] > 0.9                     # the candidate's receipt gives it away
    assert m["retries_booked"] is True

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = cli.main(["run", str(SCEN / "support_leak_40_gateway.toml"), "--json", "--out", str(tmp_path / "g"),
                       *[x for s in E2E for x in ("--set", s)]])
    assert rc == 0
    g = json.loads(out.getvalue())["metrics"]
    assert g["forwarded_leaky"] == 0 and g["forwarded_unbooked"] == 0
    assert g["rejected"] > 0 and "support_leak" in g["rejections_by_reason"]
    assert g["differencing"]["auc"] == pytest.approx(0.5)
    assert ray_local.is_initialized()                         # the run attached; it did not stop the session's Ray
