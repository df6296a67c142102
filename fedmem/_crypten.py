"""The one place fedmem imports CrypTen.

CrypTen 0.4.1 (Dec 2022) was written against torch 1.x. At import time,
``crypten.nn.onnx_converter`` tries ``import torch.onnx.symbolic_registry`` (removed in
torch 1.13) and falls back to ``torch.onnx._internal.registration`` (removed in torch
2.x). Neither exists in torch 2.13, so a plain ``import crypten`` dies with
``ModuleNotFoundError`` although fedmem never uses the ONNX converter (it is only used
by ``crypten.nn.from_pytorch``/``from_onnx`` to translate PyTorch models).

The shim: before importing CrypTen, register an empty stand-in module
``torch.onnx.symbolic_registry`` whose ``_registry`` is an empty dict. CrypTen's
import-time ``try`` then succeeds, and the stand-in is only read inside
``_update_onnx_symbolic_registry`` (model conversion), which fedmem does not call; if a
user does call it, the loop over the empty registry is a no-op and torch's own export
path raises its own error. Nothing in the arithmetic-sharing / communicator code, which
fedmem uses, touches the stand-in.

The deferral: ``crypten.nn`` imports that converter eagerly, and the converter imports
``onnx``, which imports ``ml_dtypes``, whose C extension alone takes ~1.3 s of CPU to load
(ml_dtypes 0.7.0 on this machine; 1.36 of the 4.1 s ``import crypten`` takes). Every
CrypTen party is a fresh process that pays it, for a converter it never calls. So before
importing CrypTen, ``crypten.nn.onnx_converter`` is registered as a small stand-in module
whose ``from_onnx`` / ``from_pytorch`` / ``from_tensorflow`` import the real converter on
their first call (dropping the stand-in from ``sys.modules``; the real module, ``onnx``
with it, is then imported exactly as CrypTen would have) and delegate to it;
``TF_AND_TF2ONNX`` is True when both ``tensorflow`` and ``tf2onnx`` can be found
(``importlib.util.find_spec``; the converter itself imports them, which finding does not). So nothing changes for a user of the converter but the time
of the ``onnx`` import. Tested in tests/test_crypten.py (no ``onnx`` after import; a model
converted through the stand-in); measured side by side by ``scripts/bench_crypten_import.py``.

CrypTen is installed with ``pip install --no-deps crypten==0.4.1`` by
``scripts/install.sh`` because its metadata requires the dead ``sklearn`` package and
torchvision (which would replace the pinned CPU torch).
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types

import torch
import torch.onnx

if "torch.onnx.symbolic_registry" not in sys.modules:
    _stub = types.ModuleType("torch.onnx.symbolic_registry")
    _stub.__doc__ = "fedmem stand-in for the torch<1.13 module CrypTen imports (see fedmem._crypten)."
    _stub._registry = {}  # type: ignore[attr-defined]
    sys.modules["torch.onnx.symbolic_registry"] = _stub
    torch.onnx.symbolic_registry = _stub  # type: ignore[attr-defined]

_CONVERTER = "crypten.nn.onnx_converter"


def _real_converter() -> types.ModuleType:
    """CrypTen's own ONNX converter, imported (with ``onnx``) on the first call that needs it."""
    mod = sys.modules.get(_CONVERTER)
    if mod is None or getattr(mod, "_fedmem_deferred", False):
        sys.modules.pop(_CONVERTER, None)
        mod = importlib.import_module(_CONVERTER)
    return mod


def _deferred(name: str):
    def call(*args, **kwargs):
        return getattr(_real_converter(), name)(*args, **kwargs)

    call.__name__ = call.__qualname__ = name
    call.__doc__ = f"CrypTen's ``crypten.nn.{name}``; its module (and ``onnx``) is imported on the first call."
    return call


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


if _CONVERTER not in sys.modules:
    _stand_in = types.ModuleType(_CONVERTER)
    _stand_in.__doc__ = "fedmem stand-in: CrypTen's ONNX converter, imported on first use (see fedmem._crypten)."
    _stand_in._fedmem_deferred = True  # type: ignore[attr-defined]
    for _name in ("from_onnx", "from_pytorch", "from_tensorflow"):
        setattr(_stand_in, _name, _deferred(_name))
    _stand_in.TF_AND_TF2ONNX = _importable("tensorflow") and _importable("tf2onnx")  # type: ignore[attr-defined]
    sys.modules[_CONVERTER] = _stand_in

import crypten  # noqa: E402  (must follow the shims)
import crypten.communicator as comm  # noqa: E402
from crypten.mpc import MPCTensor  # noqa: E402

__all__ = ["crypten", "comm", "MPCTensor"]
