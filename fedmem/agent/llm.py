"""Responders: the (untrusted) model that turns what an interface released into text.

Shared by DP-MemView and DP-MIND. A responder sees only what it is handed (the query,
the released views or perturbed chunks, and public history), so its text is a
post-processing of released data and costs no privacy.

- :class:`Responder` is the interface: ``respond(messages) -> str`` over chat messages
  ``[{"role": "system"|"user"|"assistant", "content": str}, ...]``.
- :class:`OpenAICompatibleResponder` calls any OpenAI-compatible ``/chat/completions``
  endpoint (URL and model from the scenario) with the standard library only. No test
  needs it; it is for users who have a model.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from typing import Protocol, Sequence, runtime_checkable


@runtime_checkable
class Responder(Protocol):
    def respond(self, messages: Sequence[dict]) -> str:  # pragma: no cover - protocol
        ...


class ResponderError(RuntimeError):
    """The external model could not be reached or answered badly."""


class OpenAICompatibleResponder:
    """POST ``{base_url}/chat/completions`` with ``model`` and ``messages``; return the text.

    ``api_key_env`` names the environment variable holding the key (never stored in a
    scenario file). Deterministic decoding (``temperature=0``) by default.
    """

    def __init__(self, base_url: str, model: str, *, api_key_env: str = "OPENAI_API_KEY",
                 timeout_s: float = 60.0, temperature: float = 0.0, max_tokens: int = 512):
        if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must be an http(s) URL. Found {base_url!r}.")
        if not isinstance(model, str) or not model:
            raise ValueError(f"model must be a non-empty string. Found {model!r}.")
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive. Found {timeout_s!r}.")
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1. Found {max_tokens!r}.")
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.api_key_env = api_key_env
        self.timeout_s = float(timeout_s)
        self.temperature = float(temperature)
        self.max_tokens = int(max_tokens)

    def respond(self, messages: Sequence[dict]) -> str:
        body = json.dumps({"model": self.model, "messages": list(messages),
                           "temperature": self.temperature, "max_tokens": self.max_tokens}).encode()
        headers = {"Content-Type": "application/json"}
        key = os.environ.get(self.api_key_env)
        if key:
            headers["Authorization"] = f"Bearer {key}"
        req = urllib.request.Request(self.base_url + "/chat/completions", data=body, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                payload = json.loads(resp.read().decode("utf-8"))
        except (urllib.error.URLError, TimeoutError, json.JSONDecodeError) as exc:
            raise ResponderError(f"chat endpoint {self.base_url} failed: {exc}") from exc
        try:
            return str(payload["choices"][0]["message"]["content"])
        except (KeyError, IndexError, TypeError) as exc:
            raise ResponderError(f"chat endpoint {self.base_url} returned no message: {payload!r:.200}") from exc


# ---------------------------------------------------------------------------------------
# Deterministic template responder (default responder of DP-MemView experiments).
#
# The response is a deterministic function of the message text alone, so when the
# messages hold only (q_t, v_t, tau_<t) it is a fixed store-independent channel
# K_LLM(y | q, v, tau_<t) (DP-MemView Eq. 2). Handed raw memory lines instead (the
# memory-text baselines), it "reads" them with a public phrase lexicon and personalises
# from what it finds, echoing the phrase it keyed on, as instruction-tuned models do.
# ---------------------------------------------------------------------------------------
import hashlib as _hashlib
from dataclasses import dataclass as _dataclass
from typing import Mapping as _Mapping

VIEW_TAG = "View"
MEMORY_TAG = "Memory"
ECHO_MARK = "Since you mentioned"


@_dataclass(frozen=True)
class ModeTemplate:
    """One response mode (= a public view): its slot, the evidence tags it personalises
    for, and advice sentence variants."""

    name: str
    slot: str
    tags: frozenset
    advice: tuple[str, ...]


@_dataclass(frozen=True)
class TemplateBook:
    """Public templates of a :class:`TemplateResponder`."""

    slots: tuple[str, ...]
    modes: _Mapping[str, ModeTemplate]
    generic: _Mapping[str, tuple[str, ...]]
    lexicon: _Mapping[str, tuple[str, ...]]
    openings: tuple[str, ...]
    closings: tuple[str, ...]

    def __post_init__(self):
        for name, m in self.modes.items():
            if m.slot not in self.slots or not m.advice:
                raise ValueError(f"mode {name!r} must name a known slot and at least one advice sentence. "
                                 f"Found slot {m.slot!r}.")
        missing = [s for s in self.slots if not self.generic.get(s)]
        if missing:
            raise ValueError(f"generic advice must be given for every slot. Found none for {missing!r}.")
        if not self.openings or not self.closings:
            raise ValueError("openings and closings must not be empty.")

    def exhibited_modes(self, text: str) -> frozenset:
        """Modes whose advice appears in ``text`` (used for programmatic gold checks)."""
        return frozenset(n for n, m in self.modes.items() if any(a in text for a in m.advice))


def _pick(options: tuple[str, ...], *key) -> str:
    h = int.from_bytes(_hashlib.sha256("|".join(map(str, key)).encode()).digest()[:4], "little")
    return options[h % len(options)]


def memview_messages(query_text: str, slots: tuple[str, ...], views: tuple[tuple[str, str, str], ...] = (),
                     memory: tuple[tuple[str, str], ...] = (), history: tuple[tuple[str, str], ...] = ()) -> list[dict]:
    """Chat messages carrying only what an interface released.

    ``views``: (slot, view name, description); ``memory``: (slot, text) lines, used only
    by the memory-text baselines; ``history``: public (query, response) pairs.
    """
    lines = [f"Slots: {', '.join(slots)}", f"Query: {query_text}"]
    lines += [f"{VIEW_TAG}[{s}]: {name} | {desc}" for s, name, desc in views]
    lines += [f"{MEMORY_TAG}[{s}]: {text}" for s, text in memory]
    msgs = [{"role": "system", "content": "You are a helpful personal assistant. Follow the conditioning views; "
                                          "never state facts about the user that you were not given."}]
    for q, y in history:
        msgs += [{"role": "user", "content": f"Query: {q}"}, {"role": "assistant", "content": y}]
    msgs.append({"role": "user", "content": "\n".join(lines)})
    return msgs


class TemplateResponder:
    """Deterministic responder: text depends only on the last user message.

    Opening (by query), one advice sentence per conditioning mode (variant chosen by a
    hash of query and mode), generic advice when no mode applies, closing. Raw memory
    lines are read with the book's lexicon; a found phrase adds the modes of the active
    slot that it supports and an echo sentence ("Since you mentioned ...").
    """

    def __init__(self, book: TemplateBook, slot_topics: _Mapping[str, str] | None = None):
        if not isinstance(book, TemplateBook):
            raise TypeError(f"book must be a TemplateBook. Found {type(book).__name__}.")
        self.book = book
        self.slot_topics = dict(slot_topics or {})
        self._lex = {t: tuple(p.lower() for p in ps) for t, ps in book.lexicon.items()}

    def respond(self, messages: Sequence[dict]) -> str:
        if not messages or messages[-1].get("role") != "user":
            raise ValueError("messages must end with a user message.")
        slots, query, modes, echoes = (), "", set(), []
        for line in str(messages[-1]["content"]).splitlines():
            head, _, rest = line.partition(": ")
            if head == "Slots":
                slots = tuple(s.strip() for s in rest.split(",") if s.strip())
            elif head == "Query":
                query = rest
            elif head.startswith(VIEW_TAG + "["):
                name = rest.split(" | ", 1)[0].strip()
                if name in self.book.modes:
                    modes.add(name)
            elif head.startswith(MEMORY_TAG + "["):
                low = rest.lower()
                for tag, phrases in self._lex.items():
                    hit = next((p for p in phrases if p in low), None)
                    if hit is None:
                        continue
                    found = [n for n, m in self.book.modes.items() if tag in m.tags and m.slot in slots]
                    if found:
                        modes.update(found)
                        echoes.append(f"{ECHO_MARK} {hit}, I took that into account.")
        topic = ", ".join(self.slot_topics.get(s, s) for s in slots) or "question"
        out = [_pick(self.book.openings, query).format(topic=topic)]
        for name in sorted(modes):
            out.append(_pick(self.book.modes[name].advice, query, name))
        for s in slots:
            if not any(self.book.modes[n].slot == s for n in modes):
                out.append(_pick(self.book.generic[s], query, s))
        out += sorted(dict.fromkeys(echoes))
        out.append(_pick(self.book.closings, query))
        return " ".join(out)
