"""Comparing llama.cpp's driver with ours over the same token budget (issue 14 item 4).

The driver decodes one step past n_predict, and a draft cap of 0 reaches llama.cpp's speculative
layer as "no limit", so its totals include drafts ours never makes; the per-step log separates them.
"""

from __future__ import annotations

from llama_dflash.bench.cpp_reference import CppResult, parse_cpp_output


def _log(steps: list[tuple[int, int]]) -> str:
    lines = [f"0.01.000.000 D accepted {a}/{d} draft tokens, the last target token is: (42)" for a, d in steps]
    n = sum(a + 1 for a, _ in steps)
    lines += [f"0.02.000.000 I decoded {n:4d} tokens in    1.000 seconds, speed:   {n:.3f} t/s",
              f"n_drafted = {sum(d for _, d in steps)}", f"n_accept  = {sum(a for a, _ in steps)}"]
    return "\n".join(lines)


def test_steps_are_parsed_from_the_debug_log():
    r = parse_cpp_output(_log([(1, 4), (0, 4), (2, 3)]))
    assert r.steps == [(1, 4), (0, 4), (2, 3)]
    assert (r.n_accept, r.n_drafted, r.decoded_tokens) == (3, 11, 6)


def test_budget_leaves_out_the_cap_zero_and_past_budget_steps():
    # n_predict 8: caps min(4, 8 - n - 1) -> n=0: 4 (accepts 2, n=3), n=3: 4 (accepts 0, n=4),
    # n=4: 3 (accepts 2, n=7), n=7: cap 0 -> llama.cpp drafts a full block anyway (accepts 0, n=8),
    # n=8: past the budget (drafts 4 again, n=9 > 8 ends the driver)
    steps = [(2, 4), (0, 4), (2, 3), (0, 4), (0, 4)]
    b = CppResult(9, 1.0, 9.0, 19, 4, steps).within_budget(8)
    assert (b.accepted, b.drafted) == (4, 11)
    assert (b.excluded_steps, b.excluded_drafted) == (2, 8)


def test_budget_keeps_everything_when_the_driver_stops_early():
    # an end-of-generation token ended the run before the budget: nothing to leave out
    steps = [(1, 4), (0, 4)]
    b = CppResult(3, 1.0, 3.0, 8, 1, steps).within_budget(100)
    assert (b.accepted, b.drafted, b.excluded_steps) == (1, 8, 0)


def test_plain_steps_at_the_end_are_not_left_out():
    # a step without a draft costs nothing to compare: only drafting steps past the cap are dropped
    steps = [(3, 4), (0, 0)]
    b = CppResult(5, 1.0, 5.0, 4, 3, steps).within_budget(5)
    assert (b.accepted, b.drafted, b.excluded_steps) == (3, 4, 0)
