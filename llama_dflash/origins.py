"""Who produced each generated token: an accepted draft token (and which speculator drafted it), or
the target's own token.

The speculative loops yield plain token ids, and that is all an OpenAI client should see.  To show
speculation at work (the server's chat page, `generate --show-drafts`) this module watches a loop
from outside, without changing it:

* it wraps the `propose` method of the proposer the loop calls (an instance attribute, removed
  again by `detach`), so it sees every proposal; shadow probes (drafted but never verified) are
  not proposals and are ignored;
* it is told every token the loop yields (`mark`).

That is enough because every verification step, in our engine and in llama-cpp-python's
`generate` alike, yields the accepted prefix of the step's draft and then exactly one token the
target chose itself (the correction at the first disagreement, or the bonus after a fully
accepted draft).  So a yielded token is an accepted draft token exactly when it continues the
matched prefix of the latest proposal, and the first token that does not closes the step.

Which speculator drafted: a chain or `auto` keeps per-member counters (`counts[name].drafts`);
the member whose counter moved during the call drafted.  A proposer without counters (a draft
model alone) is named by the caller.

`drafting=False` makes every proposal empty: the same engine then decodes without speculation (the
server's "rerun without speculation"), its draft cache still fed, so the next request drafts as
before.
"""

from __future__ import annotations

import codecs
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

__all__ = ["TARGET", "TokenOrigin", "OriginTracker", "TextPieces"]

#: the origin of a token the target chose itself
TARGET = "target"


@dataclass(frozen=True)
class TokenOrigin:
    """One generated token and where it came from.

    `origin` is TARGET or the speculator's name ("draft-dspark", "lookup", "ngram-simple", ...).
    `depth`: for an accepted draft token, its 1-based position in the draft block (0 for the
    target's tokens).  `drafted`: on a target token that closes a step, how many tokens that step
    drafted (0: the step had no draft), so that a client can count acceptance per position."""

    token: int
    origin: str
    depth: int = 0
    drafted: int = 0

    @property
    def is_draft(self) -> bool:
        return self.origin != TARGET

    def to_dict(self, text: Optional[str] = None) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.token, "origin": self.origin}
        if text is not None:
            out["text"] = text
        if self.is_draft:
            out["depth"] = self.depth
        else:
            out["drafted"] = self.drafted
        return out


def _draft_counts(proposer: Any) -> Optional[dict[str, int]]:
    counts = getattr(proposer, "counts", None)
    if not isinstance(counts, dict):
        return None
    return {name: int(getattr(c, "drafts", 0)) for name, c in counts.items()}


class OriginTracker:
    """Marks the tokens of the loop that calls `proposer.propose` (see the module docstring).

    Use as a context manager (attach/detach), call `reset` before each generation and `mark` on
    every token the loop yields, in order."""

    def __init__(self, proposer: Any, name: str, *, drafting: bool = True):
        self.proposer = proposer
        self.name = name  # the drafter's name where the proposer has no per-member counters
        self.drafting = drafting
        self._draft: list[int] = []  # the latest proposal
        self._drafter = name
        self._matched = 0  # tokens of it accepted so far
        self._open = False  # whether the latest proposal's step is still open
        self._original: Optional[Callable[..., list[int]]] = None
        self._shadowed = False

    # ---- watching the proposals --------------------------------------------------------------
    def attach(self) -> "OriginTracker":
        if self._original is not None:
            return self
        original = self.proposer.propose  # (bound method of the class, or an earlier wrapper)

        def propose(id_last: int, n_past: int, n: int, *args: Any, shadow: bool = False, **kwargs: Any) -> list[int]:
            if not self.drafting:
                return []
            if shadow:
                return original(id_last, n_past, n, *args, shadow=True, **kwargs)
            before = _draft_counts(self.proposer)
            draft = original(id_last, n_past, n, *args, **kwargs)
            self._proposed(list(draft), before)
            return draft

        self._original = original
        self._shadowed = "propose" in getattr(self.proposer, "__dict__", {})  # an earlier wrapper
        self.proposer.propose = propose
        return self

    def detach(self) -> None:
        original, self._original = self._original, None
        if original is None:
            return
        if self._shadowed:
            self.proposer.propose = original
        else:
            try:
                del self.proposer.propose  # the class's method shows through again
            except AttributeError:
                pass

    def __enter__(self) -> "OriginTracker":
        return self.attach()

    def __exit__(self, *exc: Any) -> None:
        self.detach()

    def _proposed(self, draft: list[int], before: Optional[dict[str, int]]) -> None:
        drafter = self.name
        if before is not None and draft:
            after = _draft_counts(self.proposer) or {}
            moved = [n for n, v in after.items() if v > before.get(n, 0)]
            if len(moved) == 1:
                drafter = moved[0]
        self._draft = [int(t) for t in draft]
        self._drafter = drafter
        self._matched = 0
        self._open = True

    # ---- marking the tokens ------------------------------------------------------------------
    def reset(self) -> None:
        """A new generation: no proposal is pending."""
        self._draft = []
        self._matched = 0
        self._open = False

    def mark(self, token: int) -> TokenOrigin:
        """The origin of the next token the loop yielded."""
        token = int(token)
        if self._open and self._matched < len(self._draft) and self._draft[self._matched] == token:
            self._matched += 1
            return TokenOrigin(token, self._drafter, depth=self._matched)
        drafted = len(self._draft) if self._open else 0
        self._open = False  # the target's token closes the step: later ones wait for a new proposal
        return TokenOrigin(token, TARGET, drafted=drafted)


class TextPieces:
    """The text each token adds, decoded incrementally: a character split over several tokens is
    given to the token that completes it (the others add ""), so the pieces join to the text.
    `errors`: what becomes of bytes that are no UTF-8, as the text they must join to has it
    ("ignore": llama-cpp-python's completion text; "replace": our engine's `detokenize`)."""

    def __init__(self, token_bytes: Callable[[int], bytes], errors: str = "ignore"):
        self._bytes = token_bytes
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors=errors)

    def piece(self, token: int) -> str:
        return self._decoder.decode(self._bytes(int(token)))

    def pieces(self, tokens: Sequence[int]) -> list[str]:
        return [self.piece(t) for t in tokens]
