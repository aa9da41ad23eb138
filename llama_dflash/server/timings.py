"""llama-server's per-response `timings` object and OpenAI's streamed `usage`, from the
`speculative` statistics every answer carries.

Tools written for llama-server (its web UI, llama.cpp's SPEED-Bench client) read `timings`:
prompt_n / prompt_ms are the prompt tokens actually decoded (a prefix found in the cache is not
counted, as llama-server does not count it) and the time that took; predicted_n / predicted_ms the
tokens generated (the end-of-generation token included, as llama-server counts it) and the time
from the end of the prompt to the last token; draft_n / draft_n_accepted the drafted and accepted
tokens.
"""

from __future__ import annotations

from typing import Any

__all__ = ["timings", "usage"]


def _rate(n: float, ms: float) -> tuple[float, float]:
    """(ms per token, tokens per second); zeros where nothing was timed."""
    if n <= 0 or ms <= 0:
        return 0.0, 0.0
    return ms / n, 1e3 * n / ms


def timings(spec: dict[str, Any]) -> dict[str, Any]:
    """llama-server's `timings` for one answer's `speculative` statistics."""
    prompt_n = max(0, int(spec.get("prompt_tokens", 0)) - int(spec.get("cached_tokens", 0)))
    prompt_ms = 1e3 * float(spec.get("prefill_seconds", 0.0))
    predicted_n = int(spec.get("generated_tokens", 0))
    predicted_ms = max(0.0, 1e3 * (float(spec.get("total_seconds", 0.0)) - float(spec.get("prefill_seconds", 0.0))))
    p_tok, p_sec = _rate(prompt_n, prompt_ms)
    g_tok, g_sec = _rate(predicted_n, predicted_ms)
    return {
        "cache_n": int(spec.get("cached_tokens", 0)),
        "prompt_n": prompt_n, "prompt_ms": prompt_ms, "prompt_per_token_ms": p_tok, "prompt_per_second": p_sec,
        "predicted_n": predicted_n, "predicted_ms": predicted_ms, "predicted_per_token_ms": g_tok,
        "predicted_per_second": g_sec,
        "draft_n": int(spec.get("drafted", 0)), "draft_n_accepted": int(spec.get("accepted", 0)),
    }


def usage(spec: dict[str, Any]) -> dict[str, int]:
    """OpenAI's `usage` for a streamed answer, counted as llama-cpp-python counts a non-streamed one
    (the prompt's tokens; the answer's, without a closing end-of-generation token)."""
    prompt = int(spec.get("prompt_tokens", 0))
    completion = int(spec.get("completion_tokens", spec.get("generated_tokens", 0)))
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
