"""Per-token origins (`llama_dflash.origins`): which tokens were accepted drafts, from which
speculator, and which the target's own -- on the rigged qwen35 fixture, whose DSpark draft and MTP
head are right most of the time (issue 43, items 3 and 6)."""

from __future__ import annotations

import pytest

from llama_dflash.config import SpecConfig, TargetConfig
from llama_dflash.engine import LlamaDFlashDecoding, OrdinaryDecoding
from llama_dflash.origins import TARGET, OriginTracker, TextPieces
from llama_dflash.testing.drafts import write_rigged_draft
from llama_dflash.testing.targets import write_target

PROMPT = "the quick brown fox and the lazy dog is"


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    d = tmp_path_factory.mktemp("origins")
    fx = write_target(str(d / "qwen35.gguf"), "qwen35", mtp=True)
    return fx.path, write_rigged_draft(str(d / "dspark.gguf"), fx, "dspark")


def _cfg(path: str) -> TargetConfig:
    return TargetConfig(path, n_ctx=512, n_batch=64, n_ubatch=64, n_threads=2)


def _marked(engine: LlamaDFlashDecoding, prompt: list[int], n: int, *, drafting: bool = True):
    tracker = OriginTracker(engine.proposer, engine.speculator_names[0], drafting=drafting)
    with tracker:
        tracker.reset()
        marks = [tracker.mark(t) for t in engine.stream(prompt, n)]
    assert "propose" not in vars(engine.proposer)  # detached
    return marks


def _check_steps(marks) -> None:
    """Every step: drafts at depths 1, 2, ... then one target token that drafted at least that many."""
    run = 0
    for m in marks:
        if m.is_draft:
            run += 1
            assert m.depth == run
        else:
            assert m.drafted >= run
            run = 0


@pytest.fixture(scope="module")
def reference(pair):
    with OrdinaryDecoding(_cfg(pair[0])) as o:
        prompt = o.tokenize(PROMPT)
        return prompt, o.generate(prompt, 32).tokens


def test_a_draft_model_alone_marks_its_accepted_tokens(pair, reference):
    prompt, ref = reference
    with LlamaDFlashDecoding(_cfg(pair[0]), SpecConfig(pair[1], draft_n_max=4)) as eng:
        marks = _marked(eng, prompt, 32)
        stats = eng.last_stats
    assert [m.token for m in marks] == ref  # watching changes nothing
    drafts = [m for m in marks if m.is_draft]
    assert drafts and {m.origin for m in drafts} == {"draft-dspark"}
    _check_steps(marks)
    # the loop counts a step before yielding it: a step cut by max_tokens is counted whole
    assert stats.accepted - 4 <= len(drafts) <= stats.accepted
    assert sum(m.drafted for m in marks if not m.is_draft) <= stats.drafted


def test_a_chain_names_the_member_that_drafted(pair, reference):
    prompt, ref = reference
    with LlamaDFlashDecoding(_cfg(pair[0]), SpecConfig(pair[1], spec_type="draft-mtp,draft-dspark",
                                                        draft_n_max=4)) as eng:
        marks = _marked(eng, prompt, 32)
        counts = eng.last_stats.speculators
    assert [m.token for m in marks] == ref
    by = {m.origin for m in marks if m.is_draft}
    assert by and by <= {"draft-mtp", "draft-dspark"}
    for name in by:  # what the chain counted for each member
        assert sum(m.origin == name for m in marks) <= counts[name]["accepted"]
    _check_steps(marks)


def test_auto_names_lookup_and_models(pair, reference):
    prompt, ref = reference
    with LlamaDFlashDecoding(_cfg(pair[0]), SpecConfig(pair[1], spec_type="auto,draft-mtp")) as eng:
        marks = _marked(eng, prompt, 32)
    assert [m.token for m in marks] == ref
    assert {m.origin for m in marks if m.is_draft} <= {"lookup", "draft-mtp", "draft-dspark"}
    _check_steps(marks)


def test_drafting_off_decodes_ordinarily_on_the_same_engine(pair, reference):
    prompt, ref = reference
    with LlamaDFlashDecoding(_cfg(pair[0]), SpecConfig(pair[1], draft_n_max=4)) as eng:
        marks = _marked(eng, prompt, 32, drafting=False)
        assert eng.last_stats.drafted == 0
        again = _marked(eng, prompt, 32)  # and drafts again afterwards
    assert [m.token for m in marks] == ref and all(m.origin == TARGET and m.drafted == 0 for m in marks)
    assert [m.token for m in again] == ref and any(m.is_draft for m in again)


def test_text_pieces_join_to_the_text():
    data = "naïve – ok".encode()
    pieces = TextPieces(lambda i: data[i:i + 1]).pieces(range(len(data)))
    assert "".join(pieces) == "naïve – ok" and "" in pieces  # a split character goes to its last byte
