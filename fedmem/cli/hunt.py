"""``fedmem hunt``: the automated adversary's command (docs/hunt.md). Filled in below."""

from __future__ import annotations


def add_parser(sub) -> None:
    h = sub.add_parser("hunt", help="search a scenario's system for a distinguishing attack (docs/hunt.md)")
    h.set_defaults(func=lambda args: 2)
