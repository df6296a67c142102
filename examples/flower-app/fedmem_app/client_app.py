"""A memory shard as a ClientApp: one round = one query, answered by local top-k' + threshold selection.

Reply (the fedmem client contract): ``ArrayRecord([clipped local value sum, match count])`` and
``MetricRecord({"num-examples": k'})``: the weight is the public constant k', never the match count,
and no other metric leaves the shard.
"""

from __future__ import annotations

import numpy as np
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from fedmem.flower.apps import local_selection

from .task import query, shard

app = ClientApp()


@app.train()
def train(msg: Message, context: Context) -> Message:
    cfg = context.run_config
    keys, vals = shard(cfg, int(context.node_config["partition-id"]))
    rnd = int(msg.content["config"]["server-round"])
    total, count = local_selection(keys, vals, query(cfg, rnd), int(cfg["k-local"]), float(cfg["threshold"]))
    content = RecordDict({"arrays": ArrayRecord([np.r_[total, float(count)]]),
                          "metrics": MetricRecord({"num-examples": int(cfg["k-local"])})})
    return Message(content=content, reply_to=msg)
