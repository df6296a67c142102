"""A memory shard as a ClientApp: one round = one query, answered by local top-k' + threshold selection.

Reply (the fedmem client contract, docs/flower.md): ``[clipped local value sum, match count]``
with weight ``num-examples = k'`` (the public constant, never the match count: a reply with
another weight is refused, and the ServerApp says what it expected and what came back), no
other metric, float arrays of one fixed shape, L2 norm at most ``task.reply_bound`` (clipped
here by ``fedmem.flower.mods.fixedclipping_mod``, innermost mod, and enforced again by the
gateway on the server). With
SecAgg+ (run config ``secagg = true``, the default) the round arrives through Flower's
``SecAggPlusWorkflow`` in its legacy record format and ``secaggplus_mod`` masks the reply; the
values are put on SecAgg+'s quantization grid first (``fedmem.flower.SecAggGrid``), so the
unmasked sum is exact. Without SecAgg+ the round is a plain Message-API train message.
"""

from __future__ import annotations

import numpy as np
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.app.message_type import MessageType
from flwr.client.mod import secaggplus_mod
from flwr.clientapp import ClientApp
from flwr.common import Code, FitRes, Status, ndarrays_to_parameters
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS
from flwr.compat.common import recorddict_compat as compat

from fedmem.flower import SecAggGrid
from fedmem.flower.apps import local_selection
from fedmem.flower.mods import clip_record

from .task import query, reply_bound, shard


def secagg_if_requested(msg: Message, context: Context, call_next):
    """``secaggplus_mod`` for the SecAgg+ workflow's messages; other messages pass through."""
    if msg.metadata.message_type == MessageType.TRAIN and RECORD_KEY_CONFIGS in msg.content.config_records:
        return secaggplus_mod(msg, context, call_next)
    return call_next(msg, context)


def clip_to_contract(msg: Message, context: Context, call_next):
    """fedmem's fixedclipping_mod at the run's public reply bound (innermost: it sees the reply before
    secaggplus_mod masks it)."""
    out = call_next(msg, context)
    if msg.metadata.message_type == MessageType.TRAIN and not out.has_error():
        for name in list(out.content.array_records.keys()):
            out.content[name] = clip_record(out.content.array_records[name], reply_bound(context.run_config))
    return out


app = ClientApp(mods=[secagg_if_requested, clip_to_contract])


@app.train()
def train(msg: Message, context: Context) -> Message:
    cfg = context.run_config
    keys, vals = shard(cfg, int(context.node_config["partition-id"]))
    legacy = "fitins.parameters" in msg.content.array_records          # SecAgg+ (legacy workflow)
    config = compat.recorddict_to_fitins(msg.content, keep_input=True).config if legacy else msg.content["config"]
    total, count = local_selection(keys, vals, query(cfg, int(config["server-round"])), int(cfg["k-local"]),
                                   float(cfg["threshold"]))
    reply = np.r_[total, float(count)]
    k = int(cfg["k-local"])
    if legacy:
        x = SecAggGrid(float(cfg["secagg-clipping-range"])).on_grid(reply)
        fitres = FitRes(Status(Code.OK, ""), ndarrays_to_parameters([x]), k, {})
        return Message(compat.fitres_to_recorddict(fitres, keep_input=True), reply_to=msg)
    content = RecordDict({"arrays": ArrayRecord([reply]), "metrics": MetricRecord({"num-examples": k})})
    return Message(content=content, reply_to=msg)
