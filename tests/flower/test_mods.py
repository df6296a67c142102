"""fedmem.flower.mods.fixedclipping_mod: train replies clipped on the client; the wrapper's client-side
clipping (clipping='client') admits a clipped client and refuses one without the mod (the same check)."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("flwr")

from flwr.app import ArrayRecord, Message, MetricRecord, RecordDict  # noqa: E402

from fedmem.flower.core import GatewayCore  # noqa: E402
from fedmem.flower.harness import _identity  # noqa: E402
from fedmem.flower.mods import clip_record, fixedclipping_mod  # noqa: E402
from fedmem.dp import Accountant  # noqa: E402


def _train_reply(vec, mods=()):
    _identity()
    msg = Message(RecordDict({"arrays": ArrayRecord([np.zeros(2)])}), dst_node_id=1, message_type="train")

    def app(m, ctx):
        return Message(RecordDict({"arrays": ArrayRecord([np.asarray(vec, dtype=np.float64)]),
                                   "metrics": MetricRecord({"num-examples": 5})}), reply_to=m)

    call = app
    for mod in reversed(list(mods)):
        call = (lambda mod_, nxt: (lambda m, c: mod_(m, c, nxt)))(mod, call)
    return call(msg, None)


def test_the_mod_clips_train_replies_and_the_wrapper_client_check_catches_a_client_without_it():
    core = GatewayCore(Accountant("rdp"), num_sampled_clients=2, noise_multiplier=2.0, sensitivity=1.0,
                       public_num_examples=5, rng=np.random.default_rng(0), clipping="client")
    with_mod = _train_reply([30.0, 40.0], mods=[fixedclipping_mod(1.0)])
    without = _train_reply([30.0, 40.0])
    a = with_mod.content["arrays"].to_numpy_ndarrays()
    assert np.linalg.norm(a[0]) == pytest.approx(1.0)
    zero = [np.zeros(2)]
    assert core.prepare([a, zero])[0] == []
    assert core.prepare([without.content["arrays"].to_numpy_ndarrays(), zero])[0] == ["norm"]   # caught


def test_clip_record_leaves_small_and_non_float_replies_alone_and_names_a_bad_norm():
    small = ArrayRecord([np.array([0.3, 0.4])])
    assert clip_record(small, 1.0) is small
    ints = ArrayRecord([np.array([3, 4])])
    assert clip_record(ints, 1.0) is ints
    with pytest.raises(ValueError, match="clip_norm"):
        fixedclipping_mod(0.0)
