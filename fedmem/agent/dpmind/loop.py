"""DP-MIND Algorithm 1: the memory-guided chunk loop, run by a client that keeps Pi local.

:class:`DPMindClient` is the trusted local side. ``ingest`` runs Algorithm 3 (through
:class:`~fedmem.agent.dpmind.perturb.TokenPerturber`) and records the alignment Pi
(Algorithm 1, lines 1-2); ``ask`` runs lines 3-9 against any
:class:`~fedmem.agent.llm.Responder`::

    M_0 = "No previous memory"
    M_i = LLM(M_{i-1}, C'_i, Q)          i = 1..N-1   (memory-update prompt, App. A.3)
    A_DP = LLM(M_{N-1}, C'_N, Q)                      (final step; see below)
    A_final = Denoise(A_DP, Pi, K)                    (Algorithm 2, local)

The paper's final step reads both the last memory and the last chunk; Appendix A.3's
final-answer prompt carries only a memory, so fedmem folds C'_N into the memory with one
more update and then asks the final-answer prompt: the external model sees the same
inputs. ``mode="chunk_only"`` is the ablation of Table 3: every chunk is answered on its
own (final-answer prompt with the chunk as the only memory, no propagation) and the
final answer is the most frequent non-empty chunk answer (ties: earliest).

Everything the responder receives or returns is appended to ``Answer.transcript``: that
is the complete external view (perturbed chunks, memories, prompts, the DP answer), a
post-processing of the perturbed context (Theorem 4.1). The clean text and Pi are kept
in private attributes and never put in a message.

:class:`ExtractiveMemoryAgent` is the default responder, deterministic and LLM-free: it
parses the paper's prompts, keeps the sentences of each perturbed chunk that best match
the question's cue words in a bounded memory, and answers with the text that follows
the cue in the best-matching sentence. It is a stand-in for the paper's RL-trained
memory policy (out of scope here), so results measure the pipeline, not an LLM.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Iterable, Sequence

import numpy as np

from fedmem import _validate as V
from fedmem.agent.dpmind.denoise import Alignment, denoise_ids
from fedmem.agent.dpmind.embeddings import WordPieceCodec
from fedmem.agent.dpmind.perturb import TokenPerturber, rechunk
from fedmem.agent.llm import Responder

# ----------------------------------------------------------------- prompts (App. A.3)
NO_MEMORY = "No previous memory"

MEMORY_UPDATE_PROMPT = (
    "You are given a problem, a section of an article that may contain information relevant to the "
    "problem, and a previous memory. Read the section carefully and update the memory with any new "
    "information that helps answer the problem. Preserve all relevant details from the previous memory "
    "while adding useful information from the current section.\n"
    "<problem>\n{question}\n</problem>\n"
    "<memory>\n{memory}\n</memory>\n"
    "<section>\n{chunk}\n</section>\n"
    "Updated memory:"
)

FINAL_ANSWER_PROMPT = (
    "You are given a problem and a differentially private memory. The memory may contain noise or omit "
    "some details due to privacy-preserving perturbation. Answer the problem using only the memory, "
    "without attempting to reconstruct any original sensitive context. Output format: "
    "\"Therefore, the answer is (insert answer here)\".\n"
    "<problem>\n{question}\n</problem>\n"
    "<memory>\n{memory}\n</memory>\n"
    "Your answer:"
)

_ANSWER_RE = re.compile(r"therefore,?\s+the\s+answer\s+is\s*:?\s*(.*)", re.IGNORECASE | re.DOTALL)


def extract_answer(text: str) -> str:
    """The text after "Therefore, the answer is" (last occurrence), else the whole reply; trimmed."""
    matches = list(_ANSWER_RE.finditer(text))
    ans = matches[-1].group(1) if matches else text
    ans = ans.strip().strip("()").strip()
    return ans.rstrip(".").strip()


def _between(text: str, open_tag: str, close_tag: str, last_close: bool = False) -> str:
    i = text.find(open_tag)
    if i < 0:
        return ""
    i += len(open_tag)
    j = text.rfind(close_tag) if last_close else text.find(close_tag, i)
    return text[i:j if j >= i else len(text)].strip()


# ------------------------------------------------------- default extractive responder
_STOP = frozenset(
    "a an the of for in on at to is are was were be what which who whom whose how when where why "
    "mentioned provided text given this that these those and or with by from as it its any all some "
    "one do does did me tell please answer question".split())
_WORD = re.compile(r"[a-z0-9]+")
# Function words skipped between a cue (or bridge) word and the value that follows it.
_LEAD = frozenset("is are was were be been a an the of in at to by for from on as located based named".split())
_SENT = re.compile(r"(?<=[.!?])\s+")


def cue_words(question: str) -> frozenset[str]:
    """Content words of the question (lowercased, stop words removed)."""
    return frozenset(w for w in _WORD.findall(question.lower()) if w not in _STOP)


def _tidy(text: str) -> str:
    """Undo the tokenizer's spacing around joiners ("3f2a - 11" -> "3f2a-11")."""
    text = re.sub(r"\s*-\s*", "-", text)
    return re.sub(r"\s+([.,:;!?])", r"\1", text).strip()


class ExtractiveMemoryAgent:
    """Deterministic memory agent behind the :class:`Responder` interface (no LLM).

    Memory update: split the previous memory and the section into sentences, score each
    by the number of distinct question cue words it contains (at least ``min_cues``),
    keep the ``memory_sentences`` best (ties: earlier first), each cut to
    ``sentence_words`` words. Final answer: in the best memory sentence, the words after
    the last cue word (skipping "is", ":" and the like), up to ``answer_words`` words.

    ``hops >= 2`` (multi-hop questions, ``fedmem.bench.multihop``): the words after the
    last cue word of the best sentence are a *bridge*, not the answer. Memory update
    also keeps sentences that mention the current bridge (bonus +2 to their score), and
    the final answer follows the chain: the sentence that shares most words with the
    bridge (then most cue words, then earliest) gives the next bridge, ``hops - 1``
    times; the last one's tail is the answer. If the chain breaks (no other sentence
    shares a word with the bridge), the agent answers "unknown". ``hops = 1`` is exactly the single-hop agent above.
    """

    def __init__(self, *, memory_sentences: int = 8, sentence_words: int = 48, answer_words: int = 12,
                 min_cues: int = 2, hops: int = 1):
        self.memory_sentences = V.positive_int("memory_sentences", memory_sentences)
        self.sentence_words = V.positive_int("sentence_words", sentence_words)
        self.answer_words = V.positive_int("answer_words", answer_words)
        self.min_cues = V.positive_int("min_cues", min_cues)
        self.hops = V.positive_int("hops", hops)

    def _score(self, sentence: str, cues: frozenset[str]) -> int:
        return len(cues.intersection(_WORD.findall(sentence.lower())))

    def _select(self, text: str, cues: frozenset[str]) -> list[tuple[int, str]]:
        out = []
        for s in _SENT.split(text):
            s = " ".join(s.split()[: self.sentence_words])
            sc = self._score(s, cues)
            if s and sc >= self.min_cues:
                out.append((sc, s))
        return out

    def update(self, question: str, memory: str, chunk: str) -> str:
        if self.hops > 1:
            return self._update_hops(question, memory, chunk)
        cues = cue_words(question)
        old = [] if memory.strip() in ("", NO_MEMORY) else self._select(memory, cues)
        new = self._select(chunk, cues)
        ranked = sorted(enumerate(old + new), key=lambda t: (-t[1][0], t[0]))
        kept = [s for _, (_, s) in ranked[: self.memory_sentences]]
        return "\n".join(kept) if kept else NO_MEMORY

    # ---- multi-hop (hops >= 2)
    def _sentences(self, text: str) -> list[str]:
        if text.strip() in ("", NO_MEMORY):
            return []
        out = []
        for line in text.splitlines():  # a memory line is one kept sentence, even if a chunk cut its period
            for s in _SENT.split(line):
                s = " ".join(s.split()[: self.sentence_words])
                if s:
                    out.append(s)
        return out

    def _tail(self, sentence: str, marks: frozenset[str]) -> str:
        """The words after the last word of ``sentence`` that contains a mark, leading function words skipped."""
        words = sentence.split()
        hit = [i for i, w in enumerate(words) if marks.intersection(_WORD.findall(w.lower()))]
        if not hit:
            return ""
        tail = words[max(hit) + 1:]
        while tail and (not _WORD.findall(tail[0].lower())
                        or all(t in _LEAD for t in _WORD.findall(tail[0].lower()))):
            tail = tail[1:]
        text = _tidy(" ".join(tail[: self.answer_words]))
        return re.split(r"(?<=\w)[.!?](\s|$)", text)[0].strip()

    def _best(self, sents: list[str], cues: frozenset[str]) -> int | None:
        best = None
        for i, s in enumerate(sents):
            sc = self._score(s, cues)
            if sc >= self.min_cues and (best is None or sc > best[0]):
                best = (sc, i)
        return None if best is None else best[1]

    def _bridge(self, sents: list[str], cues: frozenset[str]) -> tuple[int | None, frozenset[str]]:
        i = self._best(sents, cues)
        if i is None:
            return None, frozenset()
        return i, frozenset(w for w in _WORD.findall(self._tail(sents[i], cues).lower()) if w not in _STOP)

    def _update_hops(self, question: str, memory: str, chunk: str) -> str:
        cues = cue_words(question)
        sents = self._sentences(memory) + self._sentences(chunk)
        src, bridge = self._bridge(sents, cues)
        ranked = []
        for i, s in enumerate(sents):
            sc = self._score(s, cues)
            linked = i != src and bool(bridge.intersection(_WORD.findall(s.lower())))
            if sc >= self.min_cues or linked:
                ranked.append((-(sc + 2 * linked), i, s))
        kept = [s for _, _, s in sorted(ranked)[: self.memory_sentences]]
        return "\n".join(kept) if kept else NO_MEMORY

    def _answer_hops(self, question: str, memory: str) -> str:
        cues = cue_words(question)
        sents = self._sentences(memory)
        src, bridge = self._bridge(sents, cues)
        if src is None:
            return ""
        used, answer = {src}, self._tail(sents[src], cues)
        for _ in range(self.hops - 1):
            best = None
            for i, s in enumerate(sents):
                if i in used:
                    continue
                shared = len(bridge.intersection(_WORD.findall(s.lower())))
                key = (shared, self._score(s, cues), -i)
                if shared and (best is None or key > best[0]):
                    best = (key, i)
            if best is None:
                return ""  # chain broken: no answer ("unknown")
            i = best[1]
            used.add(i)
            nxt = self._tail(sents[i], cues | bridge)
            if not nxt:
                return ""
            answer = nxt
            bridge = frozenset(w for w in _WORD.findall(nxt.lower()) if w not in _STOP)
        return answer

    def answer(self, question: str, memory: str) -> str:
        if self.hops > 1:
            return self._answer_hops(question, memory)
        cues = cue_words(question)
        best = None
        for sc, s in (self._select(memory, cues) if memory.strip() != NO_MEMORY else []):
            if best is None or sc > best[0]:
                best = (sc, s)
        if best is None:
            return ""
        words = best[1].split()
        last = max(i for i, w in enumerate(words) if cues.intersection(_WORD.findall(w.lower())))
        tail = words[last + 1:]
        while tail and tail[0].lower().strip(":-=,;") in ("is", "are", "was", ""):
            tail = tail[1:]
        text = _tidy(" ".join(tail[: self.answer_words]))
        return re.split(r"(?<=\w)[.!?](\s|$)", text)[0].strip()

    def respond(self, messages: Sequence[dict]) -> str:
        prompt = messages[-1]["content"]
        question = _between(prompt, "<problem>", "</problem>")
        if "<section>" in prompt:
            memory = _between(prompt, "<memory>", "</memory>")
            chunk = _between(prompt, "<section>", "</section>", last_close=True)
            return self.update(question, memory, chunk)
        memory = _between(prompt, "<memory>", "</memory>", last_close=True)
        ans = self.answer(question, memory)
        return f"Therefore, the answer is {ans}" if ans else "Therefore, the answer is unknown"


# ------------------------------------------------------------------- the client
@dataclass
class Answer:
    """What ``ask`` returns. ``transcript`` is the complete external view."""

    question: str
    dp_answer: str
    final_answer: str
    restored_tokens: int
    transcript: list[dict] = field(default_factory=list)


class DPMindClient:
    """Trusted local side of DP-MIND: perturbs, keeps Pi private, runs the chunk loop, denoises.

    ``ingest`` accepts text (``str``), UTF-8 ``bytes`` or an iterable of text pieces
    (streamed: each piece is tokenized and perturbed in turn; pieces should break at
    whitespace). Empty or whitespace-only contexts raise ``ValueError``; so do bytes that
    are not UTF-8. A context of only special tokens is perturbed like any other: special
    tokens are inputs, never outputs, of the projection.
    """

    def __init__(self, perturber: TokenPerturber, codec: WordPieceCodec, *, chunk_tokens: int = 5000,
                 restore_k: int = 32, mode: str = "memory"):
        if not isinstance(perturber, TokenPerturber):
            raise TypeError(f"perturber must be a TokenPerturber. Found {type(perturber).__name__}.")
        self.perturber = perturber
        self.codec = codec
        self.chunk_tokens = V.positive_int("chunk_tokens", chunk_tokens)
        self.restore_k = V.positive_int("restore_k", restore_k)
        if mode not in ("memory", "chunk_only"):
            raise ValueError(f"mode must be 'memory' or 'chunk_only'. Found {mode!r}.")
        self.mode = mode
        self.__alignment: Alignment | None = None  # Pi: local only (name-mangled)
        self._chunks: list[str] = []               # C'_1..C'_N as text: external-safe

    # ---- Algorithm 1, lines 1-2
    def ingest(self, context, rng) -> int:
        """Perturb ``context`` (Algorithm 3), record Pi, build the perturbed chunks. Returns L."""
        V.rng_check("rng", rng)
        pieces = self._pieces(context)
        align = Alignment()

        def gen():
            for clean, pert in self.perturber.stream(self.codec.encode_stream(pieces), rng):
                align.extend(clean, pert)
                yield pert

        chunks = [self.codec.decode(c) for c in rechunk(gen(), self.chunk_tokens)]
        if len(align) == 0:
            raise ValueError("context must contain at least one token. Found an empty or whitespace-only context.")
        self.__alignment = align
        self._chunks = chunks
        return len(align)

    @staticmethod
    def _pieces(context) -> Iterable[str]:
        if isinstance(context, (bytes, bytearray)):
            try:
                return [bytes(context).decode("utf-8")]
            except UnicodeDecodeError as exc:
                raise ValueError(f"context must be UTF-8 text. Found invalid byte "
                                 f"{bytes(context)[exc.start:exc.start + 1]!r} at offset {exc.start}.") from None
        if isinstance(context, str):
            return [context]
        if isinstance(context, Iterable):
            def check(it):
                for i, p in enumerate(it):
                    if not isinstance(p, str):
                        raise TypeError(f"context pieces must be str. Found {type(p).__name__} at index {i}.")
                    yield p
            return check(context)
        raise TypeError(f"context must be str, bytes or an iterable of str. Found {type(context).__name__}.")

    @property
    def chunks(self) -> tuple[str, ...]:
        """The perturbed chunks C'_i (text): safe to share."""
        return tuple(self._chunks)

    @property
    def context_tokens(self) -> int:
        return 0 if self.__alignment is None else len(self.__alignment)

    def local_stats(self) -> dict:
        """Local diagnostics of the perturbation (never sent out): length and unchanged fraction."""
        if self.__alignment is None:
            raise RuntimeError("ingest a context before asking for statistics")
        a = self.__alignment
        a._freeze()
        return {"tokens": int(a.clean.size), "unchanged_fraction": float(np.mean(a.clean == a.perturbed))}

    # ---- Algorithm 1, lines 3-9
    def ask(self, question: str, responder: Responder, *, mode: str | None = None) -> Answer:
        """Run the chunk loop for ``question``; ``mode`` overrides the client's mode for this call."""
        mode = self.mode if mode is None else mode
        if mode not in ("memory", "chunk_only"):
            raise ValueError(f"mode must be 'memory' or 'chunk_only'. Found {mode!r}.")
        if self.__alignment is None:
            raise RuntimeError("ingest a context before asking")
        if not isinstance(question, str) or not question.strip():
            raise ValueError(f"question must be a non-empty string. Found {question!r}.")
        transcript: list[dict] = []

        def call(prompt: str) -> str:
            msgs = [{"role": "user", "content": prompt}]
            reply = responder.respond(msgs)
            transcript.append({"role": "user", "content": prompt})
            transcript.append({"role": "assistant", "content": reply})
            return reply

        if mode == "memory":
            memory = NO_MEMORY
            for chunk in self._chunks:
                memory = call(MEMORY_UPDATE_PROMPT.format(question=question, memory=memory, chunk=chunk)).strip() \
                    or NO_MEMORY
            dp_answer = extract_answer(call(FINAL_ANSWER_PROMPT.format(question=question, memory=memory)))
        else:
            answers = []
            for chunk in self._chunks:
                a = extract_answer(call(FINAL_ANSWER_PROMPT.format(question=question, memory=chunk)))
                if a and a.lower() != "unknown":
                    answers.append(a)
            counts = Counter(answers)
            dp_answer = max(answers, key=lambda a: (counts[a], -answers.index(a))) if answers else ""
        final, changed = self.denoise(dp_answer)
        return Answer(question, dp_answer, final, changed, transcript)

    def denoise(self, dp_answer: str) -> tuple[str, int]:
        """Algorithm 2, locally: restore perturbed spans of ``dp_answer`` through Pi."""
        if not dp_answer:
            return dp_answer, 0
        ids = self.codec.encode(dp_answer)
        restored, changed = denoise_ids(ids, self.__alignment, self.restore_k)
        if changed == 0:
            return dp_answer, 0
        return _tidy(self.codec.decode(restored)), changed
