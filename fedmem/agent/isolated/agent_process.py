"""The agent's side of an isolated agent process: its RPC client (``MemoryClient``, projector
and responders over the connection) and the loop that serves the session's commands."""

from __future__ import annotations

import os
import pickle

import numpy as np

from fedmem.agent.isolated.wire import recv_bytes, send


class _Rpc:
    """The agent's end: ``call(name, *args)`` while a command is outstanding."""

    def __init__(self, sock):
        self.sock = sock

    def call(self, name: str, *args):
        send(self.sock, ("call", name, args))
        msg = pickle.loads(recv_bytes(self.sock))          # from the session (trusted by the agent)
        if msg[0] == "reply":
            return msg[1]
        if msg[0] == "refused":
            from fedmem.federation.gateway import refusal  # lazy: loads dp_accounting (~300 ms)

            raise refusal(msg[1])
        raise RuntimeError(f"{name}: {msg[1]}")


class RpcMemoryClient:
    """The ``MemoryClient`` API over the isolated RPC, with the agent's own capability."""

    def __init__(self, rpc: _Rpc, principal):
        self._rpc = rpc
        self.principal = principal
        self.family = None
        self.responses: list = []
        self.refusals: list = []

    def _cap(self) -> str:
        return getattr(self.principal, "capability", self.principal)

    def retrieve(self, q, *, family: str | None = None, retry_of: int | None = None):
        from fedmem.errors import SupportPrivacyViolation  # lazy: ~1 ms, no heavy package

        try:
            r = self._rpc.call("retrieve", self._cap(), np.asarray(q, dtype=np.float64), family or self.family,
                               retry_of)
        except SupportPrivacyViolation as exc:
            self.refusals.append(exc)
            raise
        self.responses.append(r)
        return r

    @property
    def epsilon_spent(self) -> float:
        return float(self._rpc.call("spent", self._cap()))

    def bookings(self) -> list:
        return self._rpc.call("bookings", self._cap())


class _RpcProjector:
    name = "remote"

    def __init__(self, rpc: _Rpc, table):
        self._rpc, self.table = rpc, table

    def project(self, points) -> np.ndarray:
        pts = np.asarray(points, dtype=np.float64)
        if pts.ndim != 2 or pts.shape[1] != self.table.dim:
            raise ValueError(f"points must have shape (n, {self.table.dim}). Found shape {pts.shape}.")
        return np.asarray(self._rpc.call("project", pts))


class _RpcResponder:
    def __init__(self, rpc: _Rpc, kind: str):
        self._rpc, self.kind = rpc, kind

    def respond(self, messages) -> str:
        return self._rpc.call("respond", self.kind, [{str(k): str(v) for k, v in dict(m).items()} for m in messages])


class AgentProcess:  # pragma: no cover - runs in the agent process
    def __init__(self, sock, table, codec):
        self.sock, self.table, self.codec = sock, table, codec
        self.rpc = _Rpc(sock)
        self.host = None

    def serve(self) -> None:
        while True:
            try:
                msg = pickle.loads(recv_bytes(self.sock))
            except EOFError:
                return
            _, name, args = msg
            try:
                if name == "init":
                    value = self._init(*args)
                elif name == "pid":
                    value = os.getpid()
                elif name in ("step", "spend", "composed", "check", "exposures", "ping"):
                    value = getattr(self.host, name)(*args)
                else:
                    raise ValueError(f"unknown command {name!r}")
            except Exception as exc:  # noqa: BLE001
                send(self.sock, ("error", f"{type(exc).__name__}: {str(exc)[:300]}"))
                continue
            send(self.sock, ("done", value))

    def _init(self, p: dict) -> str:
        from fedmem.agent.actors import AgentHost  # lazy: ~15 ms, no heavy package
        from fedmem.agent.client import AgentClient  # lazy: loads dp_accounting (~400 ms)
        from fedmem.agent.dpmind import TokenPerturber  # lazy: loads dp_accounting (~470 ms)
        from fedmem.dp import DurableStore, MetricLaplace  # lazy: loads dp_accounting (~280 ms)
        from fedmem.federation.gateway import Principal  # lazy: loads dp_accounting (~300 ms)

        world, config = p["world"], p["config"]
        label, token = self.rpc.call("connect")
        client = RpcMemoryClient(self.rpc, Principal(label, token))
        perturber = TokenPerturber(MetricLaplace(float(config.dpmind_epsilon), self.table.dim), self.table,
                                   _RpcProjector(self.rpc, self.table))
        cls = p["agent_cls"] or AgentClient
        store = DurableStore(p["ledger_path"])
        agent = cls(world.user, policy=world.pair.policy, memory=world.pair.stores["M"], federation=client,
                    bank=world.bank, config=config, store=store, rng=np.random.default_rng(int(p["seed"])),
                    federation_store=None, federation_accountant=p["fed_info"]["accountant"],
                    federation_delta=p["fed_info"]["delta"], perturber=perturber, codec=self.codec,
                    lexicon=world.lexicon, template_book=world.template_book,
                    app_responder=_RpcResponder(self.rpc, "app"),
                    external_responder=_RpcResponder(self.rpc, "external"))
        host = AgentHost.__new__(AgentHost)
        host.user, host.ledger_path, host.agent = world.user, p["ledger_path"], agent
        host.tasks = {t.index: t for t in world.tasks}
        host.step_delay_s = float(p["step_delay_s"])
        self.host = host
        return label
