"""What both agent-session modes share (:class:`fedmem.agent.session.ActorSession` and
:class:`fedmem.agent.isolated.IsolatedSession`): reopening a user's ledger on the session's
files, and closing the federation service and the actors. Its own module so that neither
session module imports the other (no cycle)."""

from __future__ import annotations

from fedmem._ray import kill_actor


def reopen_agent_ledger(session, user: str):
    """A fresh :class:`AgentLedger` on ``user``'s files in ``session`` (either session mode:
    both keep ``worlds``, ``ledger_paths``, ``config``, ``fed_path``, ``fed_info`` and
    ``principals``); what survives the agent's process or the driver."""
    from fedmem.agent.client import AgentLedger  # lazy: loads dp_accounting, numpy (~500 ms)
    from fedmem.dp import DurableStore  # lazy: loads dp_accounting, numpy (~450 ms)

    w = next(w for w in session.worlds if w.user == user)
    return AgentLedger(user, DurableStore(session.ledger_paths[user]), session.config, w.pair.policy.attributes,
                       federation_store=DurableStore(session.fed_path),
                       federation_accountant=session.fed_info["accountant"],
                       principal=session.principals[user], federation_delta=session.fed_info["delta"])


def close_actors(fed, handles) -> None:
    """Close the FederationService ``fed`` (if any), then kill every actor in ``handles``;
    best effort: a session's close never raises (both session modes end this way)."""
    import ray

    if fed is not None:
        try:
            ray.get(fed.close.remote(), timeout=30)
        except Exception:  # noqa: BLE001
            pass
    for h in handles:
        kill_actor(h)
