"""Isolated agents: each agent in its own OS process, outside the Ray cluster.

Ray confines nothing between the processes of one cluster: any code in it can list every
actor, rebuild a handle from the GCS and run code inside it (``__ray_call__``). So in
this mode an agent's code never runs in the cluster. :class:`IsolatedSession` keeps the
federation (shard hosts, parties, aggregator, gateway in
:class:`~fedmem.agent.federation_service.FederationService`), the projector services
and the two boundary observers in Ray, and runs every agent's
:class:`~fedmem.agent.client.AgentClient` in a process of its own:

* **spawned outside Ray**: a *zygote* (``python -c ...`` with a scrubbed environment: no
  ``RAY_*`` variable, no address) imports the agent code and the MiniLM table once, then
  ``fork``s one child per agent. Neither ever calls into Ray or receives a Ray address,
  handle or object reference.
* **under its own uid** when the session runs as root (as CI does): the child drops to
  ``uid_base + i`` / gid ``gid`` (no supplementary groups) before any agent code runs,
  so agents cannot read each other's memory (``/proc/<pid>/mem``), signal each other,
  read the federation's ledger (mode 0600, root) or the raylet's file descriptors
  (``/proc/<raylet>/fd``, the plasma file). Not root: the child keeps the session's
  uid and this is reported (``IsolatedSession.enforced``).
* **in its own network namespace** (root only: ``unshare(CLONE_NEWNET)``): no TCP to
  the GCS, raylet, object manager or anything else on the host; only the RPC below, one end of a
  socketpair (no socket in the file system).
* **one narrow RPC** (:class:`AgentConnection`, length-prefixed frames on that socketpair, bounded in
  size, arrival time and total buffered bytes; the child first sends a fixed 16-byte secret): the agent may
  ``connect`` (once: its capability), ``retrieve`` under a capability, read the
  ``spent`` and ``bookings`` of a capability, ``project`` noisy embeddings (DP-MIND's
  shared nearest-token search) and ``respond`` (send messages to the third-party app or
  the external model, as its own user only). Nothing else is served: no ``audit``, no
  ground truth, no other principal's spend, no file path. What the agent sends is
  decoded by an allow-list unpickler (numpy arrays, plain containers, ``StepResult``),
  never by ``pickle.loads``, so an agent cannot run code in the session's process.

The driver talks to each agent over the same connection (commands ``init``, ``step``,
``spend``, ``composed``, ``check``, ``exposures``, ``pid``), and the agent's own RPC
calls are served while a command is outstanding. Each agent keeps its own ledger file
(``ledgers/<user>.sqlite``, created for its uid, mode 0600, in a sticky 1733 directory);
it reads its federation bookings through the RPC, never from ``federation.sqlite``.

What stays simulated (docs/agents.md, "What is enforced where"): everything *inside* the
Ray cluster (hosts, parties, services share Ray's trust domain), and the in-cluster mode
(:class:`~fedmem.agent.session.ActorSession`).

Modules of this package:

* :mod:`~fedmem.agent.isolated.wire`: the frames, the allow-list unpickler, the protocol's errors.
* :mod:`~fedmem.agent.isolated.connection`: the session's end of one agent's connection (its RPC served).
* :mod:`~fedmem.agent.isolated.session`: :class:`IsolatedSession`, the session side.
* :mod:`~fedmem.agent.isolated.zygote`: the zygote, the fork, the privilege drop and the import fallback.
* :mod:`~fedmem.agent.isolated.sandbox`: fresh uids, cgroups and their kill, limits, the uid sweep (issue 38).
* :mod:`~fedmem.agent.isolated.agent_process`: the agent process's RPC client and command loop.
"""

from __future__ import annotations

from fedmem.agent.isolated.agent_process import AgentProcess, RpcMemoryClient
from fedmem.agent.isolated.connection import AgentConnection
from fedmem.agent.isolated.sandbox import Limits
from fedmem.agent.isolated.session import (DEFAULT_GID, DEFAULT_UID_BASE, FederationDied, IsolatedSession,
                                           os_isolation_available, pss_mib)
from fedmem.agent.isolated.wire import (CALLS, MAX_FRAME, AgentDied, AgentTaskError, dumps, loads_untrusted, recv_bytes,
                                        send)
from fedmem.agent.isolated.zygote import CLONE_NEWNET, PR_SET_PDEATHSIG, PRELOAD, zygote_main

# the old private names (tests/test_boundaries.py decodes frames with them)
_dumps, _loads_untrusted = dumps, loads_untrusted

__all__ = ["AgentConnection", "AgentDied", "AgentProcess", "AgentTaskError", "CALLS", "CLONE_NEWNET",
           "DEFAULT_GID", "DEFAULT_UID_BASE", "IsolatedSession", "MAX_FRAME", "PRELOAD", "PR_SET_PDEATHSIG",
           "RpcMemoryClient", "dumps", "loads_untrusted", "os_isolation_available", "pss_mib", "recv_bytes", "send",
           "zygote_main"]
