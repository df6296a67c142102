"""Network endpoints of the CrypTen parties: this node's address, a free port on it, the
interface that carries it (gloo binds there) and the URL form of an address."""

from __future__ import annotations

import socket


def node_ip() -> str:
    import ray

    return ray.util.get_node_ip_address()


def url_host(ip: str) -> str:
    return f"[{ip}]" if ":" in ip else ip


def free_port(ip: str = "127.0.0.1") -> int:
    """A TCP port that is free on ``ip`` right now (this node's address)."""
    fam = socket.AF_INET6 if ":" in ip else socket.AF_INET
    with socket.socket(fam, socket.SOCK_STREAM) as s:
        s.bind((ip, 0))
        return s.getsockname()[1]


def ifname_for(ip: str) -> str | None:
    """The network interface that carries ``ip`` (gloo must bind there), or None if unknown."""
    try:
        import psutil
    except ImportError:  # psutil is optional (not every Ray install has it): gloo then picks its default
        return None      # interface; FEDMEM_GLOO_IFNAME overrides
    for name, addrs in psutil.net_if_addrs().items():
        if any(a.address.split("%")[0] == ip for a in addrs):
            return name
    return None
