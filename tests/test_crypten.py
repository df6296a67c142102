"""CrypTen through fedmem's compat shim: import, and a real 2-party computation over gloo.

Two spawned processes form a torch.distributed gloo group on loopback
(``RENDEZVOUS=tcp://127.0.0.1:<free port>``, ``WORLD_SIZE=2``, ``RANK=i``); party 0
secret-shares x, party 1 secret-shares y, and both reveal a secret-shared dot product
and an elementwise comparison. Neither party ever holds the other's plaintext input.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import socket

import pytest

TIMEOUT_S = 180
X = [1.0, 5.0, 3.0, -2.5]
Y = [2.0, 4.0, 3.0, -4.0]


def test_import_crypten_through_compat_module():
    from fedmem._crypten import MPCTensor, comm, crypten

    assert crypten.__version__ == "0.4.1"
    assert callable(crypten.cryptensor) and hasattr(comm, "get") and MPCTensor is crypten.mpc.MPCTensor
    import sys

    assert "torch.onnx.symbolic_registry" in sys.modules  # the shim is in place


def test_onnx_converter_is_imported_on_first_use_and_converts():
    """The deferred converter (fedmem._crypten): a Gemm model converts through the stand-in.

    That ``import crypten`` no longer imports ``onnx`` is checked in the fresh party processes of
    the gloo test below (this worker may have imported onnx already)."""
    import io
    import sys

    import numpy as np
    import torch

    from fedmem._crypten import crypten

    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.array([[1, 2], [3, 4], [5, 6]], dtype=np.float32), "W")
    b = numpy_helper.from_array(np.array([0.5, -1.0], dtype=np.float32), "B")
    graph = helper.make_graph([helper.make_node("Gemm", ["x", "W", "B"], ["y"], alpha=1.0, beta=1.0)], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2])], [w, b])
    net = crypten.nn.from_onnx(io.BytesIO(helper.make_model(graph).SerializeToString()))
    assert isinstance(net, crypten.nn.Graph)
    assert torch.allclose(net(torch.ones(1, 3)), torch.tensor([[9.5, 11.0]]))
    real = sys.modules["crypten.nn.onnx_converter"]
    assert not getattr(real, "_fedmem_deferred", False) and real.onnx is onnx   # the real converter now


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _party(rank: int, port: int, results) -> None:
    try:
        os.environ.update(DISTRIBUTED_BACKEND="gloo", RENDEZVOUS=f"tcp://127.0.0.1:{port}",
                          WORLD_SIZE="2", RANK=str(rank), OMP_NUM_THREADS="1")
        import torch

        from fedmem._crypten import comm, crypten

        crypten.init()
        torch.manual_seed(rank)
        mine = torch.tensor(X if rank == 0 else Y)
        zeros = torch.zeros(len(X))
        # Each party passes its own tensor only when it is the source; the other passes zeros.
        x = crypten.cryptensor(mine if rank == 0 else zeros, src=0)
        y = crypten.cryptensor(mine if rank == 1 else zeros, src=1)
        share = x.share.clone()
        dot = (x * y).sum().get_plain_text().item()
        gt = (x > y).get_plain_text().tolist()
        import sys

        deferred = "onnx" not in sys.modules and "ml_dtypes" not in sys.modules   # fedmem._crypten's deferral
        results.put((rank, dot, gt, comm.get().get_world_size(), share.tolist(), deferred))
        crypten.uninit()
    except BaseException as exc:  # report instead of hanging the parent
        results.put((rank, "error", repr(exc), None, None, None))


@pytest.mark.slow   # two spawned interpreters importing torch and CrypTen
def test_two_party_dot_product_and_comparison_over_gloo():
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_party, args=(r, port, results), daemon=True) for r in range(2)]
    for p in procs:
        p.start()
    got = {}
    try:
        for _ in range(2):
            rank, dot, gt, ws, share, deferred = results.get(timeout=TIMEOUT_S)
            assert dot != "error", gt
            got[rank] = (dot, gt, ws, share)
            assert deferred, "a CrypTen party imported onnx (the converter deferral in fedmem._crypten is gone)"
    except queue.Empty:
        pytest.fail(f"CrypTen parties did not answer within {TIMEOUT_S} s")
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
                p.join()
    expected_dot = sum(a * b for a, b in zip(X, Y))
    for rank in (0, 1):
        dot, gt, ws, _ = got[rank]
        assert ws == 2
        assert dot == pytest.approx(expected_dot, abs=1e-3)   # fixed-point, 16 fractional bits
        assert gt == [float(a > b) for a, b in zip(X, Y)]
    # The shares are not the plaintext: party 0's share of x is not x itself.
    assert got[0][3] != [round(v * 2 ** 16) for v in X]
