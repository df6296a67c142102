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

CrypTen is installed with ``pip install --no-deps crypten==0.4.1`` by
``scripts/install.sh`` because its metadata requires the dead ``sklearn`` package and
torchvision (which would replace the pinned CPU torch).
"""

from __future__ import annotations

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

import crypten  # noqa: E402  (must follow the shim)
import crypten.communicator as comm  # noqa: E402
from crypten.mpc import MPCTensor  # noqa: E402

__all__ = ["crypten", "comm", "MPCTensor"]
