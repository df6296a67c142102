"""Client-side mods of the fedmem client contract (Flower 1.42 ``ClientApp(mods=[...])``).

:func:`fixedclipping_mod` is the fedmem counterpart of Flower's ``fixedclipping_mod``: after the
ClientApp computed its train reply, every ``ArrayRecord`` of the reply (all its arrays flattened
into one vector) is scaled to L2 norm ``<= clip_norm``. Flower's mod clips the *update* (reply
minus the parameters received) and reads the norm from the server's config; this one clips the
reply vector itself, the quantity fedmem's wrappers sum, with a norm fixed in the client's code
(the contract is the client's, not something the server can change per round).

Pair it with the wrapper's ``clipping="client"`` (a round with any reply above ``clip_norm`` is
refused, so a client that does not clip is caught, not booked) or keep the default
``clipping="server"`` (the wrapper clips again: clipping twice at the same norm is clipping
once). Under SecAgg+ the server never sees a reply, only the sum, so per-reply clipping can
only happen on the client: put this mod **after** ``secaggplus_mod`` in ``mods`` (mods wrap the
app from the outside in, so the later one is the inner one and sees the reply first):
``ClientApp(mods=[secaggplus_mod, fixedclipping_mod(clip_norm)])``.
"""

from __future__ import annotations

import numpy as np
from flwr.app import Array, ArrayRecord, Context, Message
from flwr.app.message_type import MessageType

from fedmem import _validate as V

__all__ = ["fixedclipping_mod", "clip_record"]


def clip_record(record: ArrayRecord, clip_norm: float) -> ArrayRecord:
    """``record`` with its arrays (flattened together) scaled to L2 norm ``<= clip_norm``; non-float
    arrays are left as they are (the wrapper refuses them)."""
    clip_norm = V.positive("clip_norm", clip_norm)
    keys = list(record.keys())
    arrays = record.to_numpy_ndarrays()
    if not arrays or any(np.asarray(a).dtype.kind != "f" for a in arrays):
        return record
    with np.errstate(all="ignore"):
        norm = float(np.sqrt(sum(float(np.sum(np.asarray(a, dtype=np.float64) ** 2)) for a in arrays)))
    if not np.isfinite(norm) or norm <= clip_norm:
        return record
    scale = clip_norm / norm
    return ArrayRecord({k: Array((np.asarray(a, dtype=np.float64) * scale).astype(np.asarray(a).dtype))
                        for k, a in zip(keys, arrays)})


def fixedclipping_mod(clip_norm: float):
    """A ClientApp mod clipping every train reply's array records to L2 ``<= clip_norm`` (module doc)."""
    clip_norm = V.positive("clip_norm", clip_norm)

    def mod(msg: Message, context: Context, call_next) -> Message:
        out = call_next(msg, context)
        if msg.metadata.message_type != MessageType.TRAIN or out.has_error():
            return out
        content = out.content
        for name in list(content.array_records.keys()):
            content[name] = clip_record(content.array_records[name], clip_norm)
        return out

    mod.__name__ = f"fixedclipping_mod({clip_norm:g})"
    return mod
