"""Engine glue of the federation experiments: Ray and compute parties started once per run and
the scenario's ``[federation]`` section turned into a :class:`FederationConfig`. The clustered
shard data (benchmark content) is built by the experiment (``make_data`` in
:mod:`fedmem.experiments.support_leak`) and injected: this module never imports ``fedmem.bench``.

Used by the ``federation.support_leak`` experiment (:mod:`fedmem.experiments.support_leak`)
and its attack games (:mod:`fedmem.experiments.support_leak_games`). ``make_federation`` is an
indirection so tests can substitute a deliberately broken federation with the same API.
"""

from __future__ import annotations

from fedmem._ray import ensure_ray


def federation_config(cfg):
    """``FederationConfig`` from the ``[federation]`` section, which is derived from its knobs
    (``fedmem.params.schema_of``): every key is a field."""
    from fedmem.federation.config import FederationConfig  # lazy: ~63 ms, no heavy package

    return FederationConfig(**cfg.federation.to_dict())


def make_federation(config, data, *, accountant, rng, ray_address, parties=None):
    """Indirection so tests can substitute a small fake with the same API."""
    from fedmem.federation.engine import Federation  # lazy: loads dp_accounting, numpy (~750 ms)

    return Federation(config, data, accountant=accountant, rng=rng, ray_address=ray_address, parties=parties)


class Services:
    """Ray and the compute parties, started once per run and shared by every world's Federation.

    A run that finds Ray already initialised (or is given ``--ray-address``) attaches and
    leaves the cluster running; otherwise it starts a private local Ray (``fedmem._ray``, sized
    by the scenario's ``[ray]`` table) and stops it at the end. One set of compute parties
    (CrypTen actors or the plaintext reference) serves all Federations of the run, so the
    membership games do not restart CrypTen.
    """

    def __init__(self, cfg, ray_address):
        self.owns_ray, self.parties = False, None

        opts = cfg.get("ray", {}) if hasattr(cfg, "get") else {}
        self.owns_ray = ensure_ray(ray_address, num_cpus=opts.get("num_cpus") or None,
                                   object_store_mb=opts.get("object_store_mb") or None)
        from fedmem.federation import mpc  # lazy: loads numpy (~390 ms)

        f = cfg.federation
        try:
            self.parties = (mpc.PlaintextParties(f.parties) if f.mpc == "plaintext"
                            else mpc.CryptenParties(f.parties, timeout_s=max(60.0, f.timeout_s),
                                                    placement="pack" if self.owns_ray else "auto"))
        except BaseException:
            self.close()
            raise

    def close(self):
        if self.parties is not None:
            try:
                self.parties.close()
            finally:
                self.parties = None
        if self.owns_ray:
            import ray

            if ray.is_initialized():
                ray.shutdown()
            self.owns_ray = False
