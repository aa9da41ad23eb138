"""Counters and timers of one or more generations, as a dataclass that also serialises to a dict."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["SpecStats", "merge_speculator_counts"]


def merge_speculator_counts(into: dict[str, dict[str, Any]], other: dict[str, dict[str, Any]]) -> None:
    """Add per-speculator raw counts (numbers summed, per-position lists summed slot by slot)."""
    for name, counts in other.items():
        mine = into.setdefault(name, {})
        for key, value in counts.items():
            if isinstance(value, list):
                acc = mine.setdefault(key, [])
                acc.extend([0] * (len(value) - len(acc)))
                for i, v in enumerate(value):
                    acc[i] += v
            elif isinstance(value, (int, float)) and not isinstance(value, bool):
                mine[key] = mine.get(key, 0) + value


@dataclass
class SpecStats:
    """What speculative decoding did and what it cost.

    `accepted_per_position[i]` counts steps in which draft slot i was accepted, and
    `proposed_per_position[i]` the steps in which slot i was drafted at all, so their ratio
    is the acceptance at that position.
    """

    algorithm: str = "dflash"
    draft_n_max: int = 0
    drafted: int = 0  # tokens proposed by the draft
    verified: int = 0  # draft tokens sent to the target for verification
    accepted: int = 0
    verification_steps: int = 0
    draft_steps: int = 0
    rollbacks: int = 0  # steps that rejected part of their draft
    # how the target cache went back (see `rewind`): "kv", "native" or "checkpoint"
    rollback_mode: str = "kv"
    native_rollbacks: int = 0  # llama.cpp recurrent-snapshot rollbacks (n_rs_seq)
    native_rollback_seconds: float = 0.0
    checkpoint_captures: int = 0
    checkpoint_restores: int = 0  # = rollbacks done through a checkpoint
    checkpoint_bytes: int = 0  # recurrent state one checkpoint holds
    checkpoint_on_device: bool = False
    checkpoint_capture_seconds: float = 0.0
    checkpoint_restore_seconds: float = 0.0
    replayed_tokens: int = 0  # accepted tokens decoded again after a restore
    replay_seconds: float = 0.0
    generated_tokens: int = 0
    prompt_tokens: int = 0
    reused_prompt_tokens: int = 0  # prompt positions found in the caches (prefix reuse), not decoded
    target_seconds: float = 0.0  # target decode + sync (logits read)
    target_decode_seconds: float = 0.0  # the llama_decode calls of target_seconds
    target_sync_seconds: float = 0.0  # waiting for their results (the first logits read) of target_seconds
    draft_seconds: float = 0.0  # draft block decode + candidate read
    process_seconds: float = 0.0  # target features gathered and injected into the draft
    sample_seconds: float = 0.0
    prefill_seconds: float = 0.0
    total_seconds: float = 0.0
    first_token_seconds: float = 0.0
    backend_sampling_requested: bool = False
    backend_sampling_active: bool = False
    accepted_per_position: list[int] = field(default_factory=list)
    proposed_per_position: list[int] = field(default_factory=list)
    # adaptive draft length (draft_n_max="auto")
    adaptive: bool = False
    chosen_draft_tokens: dict[str, int] = field(default_factory=dict)  # k -> steps that drafted k
    ordinary_steps: int = 0  # steps the controller decoded without a draft
    # probes drafted but not verified: scored against the tokens ordinary decoding went on to produce
    shadow_probes: int = 0
    shadow_drafted: int = 0
    shadow_accepted: int = 0
    cost_curve: dict[str, float] = field(default_factory=dict)  # k -> measured seconds per step
    # a chain's or auto's counts by speculator name (see proposers.chain.SpeculatorCounts.raw)
    speculators: dict[str, dict[str, Any]] = field(default_factory=dict)

    # ---- derived values -------------------------------------------------------------------
    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.verified if self.verified else 0.0

    @property
    def accepted_per_step(self) -> float:
        """Draft tokens accepted per verification step (the target's own token not counted)."""
        return self.accepted / self.verification_steps if self.verification_steps else 0.0

    @property
    def tokens_per_step(self) -> float:
        """tau as the DFlash/DSpark papers report it: tokens per verification step, i.e. the
        accepted drafts plus the target's own token (1.0 means no draft token was ever accepted).
        Tokens generated with no verification step counted (ordinary decoding, where every token is
        the target's own) are tau 1.0 too: 0.0 is left for "nothing generated"."""
        if self.verification_steps:
            return 1.0 + self.accepted_per_step
        return 1.0 if self.generated_tokens else 0.0

    @property
    def tau(self) -> float:
        """Tokens per verification step (`tokens_per_step`)."""
        return self.tokens_per_step

    @property
    def mean_accepted_length(self) -> float:
        """tau, under the name llama-cpp-python's speculative preview gives it: the target's own
        token plus the mean accepted draft prefix.  (Until 0.4 this name meant the draft tokens
        alone, now `accepted_per_step`: one name must not mean two things across the APIs.)"""
        return self.tokens_per_step

    @property
    def decode_seconds(self) -> float:
        """The decode loop's wall time: from the end of the prompt to the last token."""
        return max(0.0, self.total_seconds - self.prefill_seconds)

    @property
    def generation_tokens_per_second(self) -> float:
        """Generated tokens over the decode loop's time (prompt processing left out)."""
        t = self.decode_seconds
        return self.generated_tokens / t if t > 0 else 0.0

    @property
    def sustained_tokens_per_second(self) -> float:
        """The rate after the first token: (generated - 1) over the time from the first token to
        the last, what a reader of a long streamed answer sees (0 with fewer than 2 tokens)."""
        t = self.total_seconds - self.first_token_seconds
        return (self.generated_tokens - 1) / t if self.generated_tokens > 1 and t > 0 else 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.generated_tokens / self.total_seconds if self.total_seconds > 0 else 0.0

    @property
    def acceptance_per_position(self) -> list[float]:
        return [a / p if p else 0.0 for a, p in zip(self.accepted_per_position, self.proposed_per_position)]

    @property
    def checkpoint_seconds(self) -> float:
        """Capture + restore + replay: what rolling back through checkpoints cost."""
        return self.checkpoint_capture_seconds + self.checkpoint_restore_seconds + self.replay_seconds

    @property
    def overhead_seconds(self) -> float:
        """Wall time of the decode loop not spent in target, draft or injection calls."""
        loop = self.total_seconds - self.prefill_seconds
        return max(0.0, loop - self.target_seconds - self.draft_seconds - self.process_seconds
                   - self.checkpoint_seconds)

    def phase_seconds(self) -> dict[str, float]:
        """Decode-loop wall time (prefill excluded) split by phase; the values sum to the loop's
        time.  "python" is what no timer covers: our own loop, copies and conversions."""
        loop = max(0.0, self.total_seconds - self.prefill_seconds)
        phases = {
            "draft": self.draft_seconds,  # draft block decode + candidate read
            "inject": self.process_seconds,  # target features written into the draft cache
            "verify": self.target_seconds,  # target decode of the k+1 rows + first logits read
            "sample": self.sample_seconds,  # target sampling of the verified rows
            "rollback": self.checkpoint_seconds + self.native_rollback_seconds,
        }
        phases["python"] = max(0.0, loop - sum(phases.values()))
        return phases

    # ---- bookkeeping ------------------------------------------------------------------------
    def record_step(self, n_drafted: int, n_accepted: int) -> None:
        self.verification_steps += 1
        self.verified += n_drafted
        self.accepted += n_accepted
        if n_drafted:
            grow = n_drafted - len(self.proposed_per_position)
            if grow > 0:
                self.proposed_per_position.extend([0] * grow)
                self.accepted_per_position.extend([0] * grow)
            for i in range(n_drafted):
                self.proposed_per_position[i] += 1
            for i in range(n_accepted):
                self.accepted_per_position[i] += 1
            if n_accepted < n_drafted:
                self.rollbacks += 1

    def merge(self, other: "SpecStats") -> None:
        """Add another run's counters to these (for aggregates over several runs)."""
        for name in (
            "drafted", "verified", "accepted", "verification_steps", "draft_steps", "rollbacks",
            "native_rollbacks", "native_rollback_seconds", "checkpoint_captures", "checkpoint_restores",
            "replayed_tokens", "checkpoint_capture_seconds", "checkpoint_restore_seconds", "replay_seconds",
            "generated_tokens", "prompt_tokens", "reused_prompt_tokens", "target_seconds", "draft_seconds",
            "process_seconds", "sample_seconds", "prefill_seconds", "total_seconds", "first_token_seconds",
            "target_decode_seconds", "target_sync_seconds", "shadow_probes", "shadow_drafted", "shadow_accepted",
        ):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for mine, theirs in (
            (self.accepted_per_position, other.accepted_per_position),
            (self.proposed_per_position, other.proposed_per_position),
        ):
            if len(theirs) > len(mine):
                mine.extend([0] * (len(theirs) - len(mine)))
            for i, v in enumerate(theirs):
                mine[i] += v
        self.ordinary_steps += other.ordinary_steps
        self.adaptive |= other.adaptive
        for k, v in other.chosen_draft_tokens.items():
            self.chosen_draft_tokens[k] = self.chosen_draft_tokens.get(k, 0) + v
        if other.cost_curve:
            self.cost_curve = dict(other.cost_curve)
        self.rollback_mode = other.rollback_mode
        self.checkpoint_bytes = max(self.checkpoint_bytes, other.checkpoint_bytes)
        self.checkpoint_on_device |= other.checkpoint_on_device
        self.backend_sampling_requested |= other.backend_sampling_requested
        self.backend_sampling_active |= other.backend_sampling_active
        merge_speculator_counts(self.speculators, other.speculators)

    def preview_stats(self) -> dict[str, Any]:
        """These statistics under the keys of llama-cpp-python's speculative preview
        (`Llama.last_speculative_stats` there), with their meanings there."""
        return {
            "drafted": self.drafted,
            "verified": self.verified,
            "accepted": self.accepted,
            "mean_accepted_length": self.mean_accepted_length,
            "acceptance_rate": self.acceptance_rate,
            "acceptance_rate_per_position": self.acceptance_per_position,
            "verification_steps": self.verification_steps,
            "draft_seconds": self.draft_seconds,
            "target_decode_seconds": self.target_decode_seconds,
            "target_sync_seconds": self.target_sync_seconds,
            "process_seconds": self.process_seconds,
            "rollbacks": self.rollbacks,
            "native_rollbacks": self.native_rollbacks,
            "checkpoint_captures": self.checkpoint_captures,
            "checkpoint_restores": self.checkpoint_restores,
            "checkpoint_bytes": self.checkpoint_bytes,
            "replayed_tokens": self.replayed_tokens,
            "time_to_first_token_seconds": self.first_token_seconds,
            "sustained_tokens_per_second": self.sustained_tokens_per_second,
            "generation_tokens_per_second": self.generation_tokens_per_second,
            "generated_tokens": self.generated_tokens,
            "prompt_tokens": self.prompt_tokens,
        }

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(
            acceptance_rate=self.acceptance_rate,
            mean_accepted_length=self.mean_accepted_length,
            tau=self.tau,
            generation_tokens_per_second=self.generation_tokens_per_second,
            sustained_tokens_per_second=self.sustained_tokens_per_second,
            accepted_per_step=self.accepted_per_step,
            tokens_per_step=self.tokens_per_step,
            tokens_per_second=self.tokens_per_second,
            acceptance_per_position=self.acceptance_per_position,
            overhead_seconds=self.overhead_seconds,
            checkpoint_seconds=self.checkpoint_seconds,
        )
        return d
