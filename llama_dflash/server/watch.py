"""The request extensions `token_origins` and `speculative: false`, on a single-sequence model.

`token_origins: true` adds a `token_origins` list to the answer, and to every stream chunk the
tokens generated since the previous chunk: ``{"id", "text", "origin", "depth" | "drafted"}``
(`origins.TokenOrigin`), where `origin` is "target" or the speculator that drafted the accepted
token.  `speculative: false` decodes the request without drafting, on the same model (the chat
page's comparison run).  Requests without either field take none of this path.

Everything here runs on the model thread, inside the request that owns the model (`runner`): the
tracker is attached to the speculator's proposer when the completion starts and detached when
its answer or its stream ends, and the model's token generator is wrapped for that time only.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator, Optional

from ..origins import OriginTracker, TextPieces, TokenOrigin
from ..proposers.factory import draft_type_name

__all__ = ["Watch", "drafter_name"]


def drafter_name(llm: Any) -> str:
    """The name of what drafts for `llm` when it is one drafter (chains and `auto` name their members)."""
    spec = getattr(llm, "speculator", None)
    draft = getattr(spec, "draft", None)
    info = getattr(draft, "info", None)
    if info is not None and getattr(spec, "proposer", None) is draft:
        return draft_type_name(info.algorithm)
    return str(getattr(getattr(spec, "proposer", None), "label", None) or "draft")


class Watch:
    """One request's origins and drafting switch on `llm` (a `llama_dflash.highlevel.Llama`)."""

    def __init__(self, llm: Any, *, record: bool, drafting: bool):
        self.llm = llm
        self.record = record
        spec = getattr(llm, "speculator", None)
        proposer = getattr(spec, "proposer", None)
        self.tracker: Optional[OriginTracker] = None
        if proposer is not None:
            self.tracker = OriginTracker(proposer, drafter_name(llm), drafting=drafting)
        self.text = TextPieces(lambda t: llm.detokenize([t]))
        self.pending: list[dict[str, Any]] = []
        self._generate: Optional[Callable[..., Iterator[int]]] = None
        self._active = False

    # ---- for the time of one completion -------------------------------------------------------
    def begin(self) -> None:
        if self._active:
            return
        self._active = True
        if self.tracker is not None:
            self.tracker.reset()
            self.tracker.attach()
        inner = self.llm.generate  # the runner's wrapper (an instance attribute)
        self._generate = inner

        def generate(*args: Any, **kwargs: Any) -> Iterator[int]:
            return self._observe(inner(*args, **kwargs))

        self.llm.generate = generate

    def end(self) -> None:
        if not self._active:
            return
        self._active = False
        if self.tracker is not None:
            self.tracker.detach()
        if self._generate is not None:
            self.llm.generate, self._generate = self._generate, None

    def _observe(self, tokens: Iterator[int]) -> Iterator[int]:
        try:
            for tok in tokens:
                if self.record:
                    origin = self.tracker.mark(tok) if self.tracker is not None else TokenOrigin(int(tok), "target")
                    self.pending.append(origin.to_dict(self.text.piece(tok)))
                yield tok
        finally:
            close = getattr(tokens, "close", None)
            if close is not None:
                close()

    def take(self) -> list[dict[str, Any]]:
        out, self.pending = self.pending, []
        return out

    # ---- around the completion call -----------------------------------------------------------
    def wrap(self, fn: Callable[..., Any], post: Optional[Callable[[Any], Any]]) -> tuple[Callable[..., Any],
                                                                                         Callable[[Any], Any]]:
        """`fn` and `post` for the runner: the completion runs watched; its answer (or each chunk)
        gets `token_origins` when asked."""
        def call(**kwargs: Any) -> Any:
            self.begin()
            try:
                result = fn(**kwargs)
            except BaseException:
                self.end()
                raise
            if isinstance(result, dict):  # answered already
                self.end()
            return result

        def after(result: Any) -> Any:
            result = post(result) if post is not None else result
            if isinstance(result, dict):
                if self.record:
                    result["token_origins"] = self.take()
                return result
            return self._chunks(result)

        return call, after

    def _chunks(self, chunks: Iterator[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        try:
            for chunk in chunks:
                if self.record and isinstance(chunk, dict) and chunk.get("choices"):
                    chunk["token_origins"] = self.take()
                yield chunk
        finally:
            try:
                close = getattr(chunks, "close", None)
                if close is not None:
                    close()
            finally:
                self.end()
