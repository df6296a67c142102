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
