"""Teacher-forced simulation of the lookup drafter on SmolLM2-135M's greedy answers.

    .venv/bin/python bench/lookup_sim.py [--set tune|heldout|both] [--max-tokens 256] [--json PATH]

Greedy answers (temperature 0, top_k 1, the model's own chat template) are generated once with
llama-cpp-python and cached in /work/tmp/lookup_sim/.  Then, for every answer, the drafter replays
the decode: at each step it sees the committed tokens (prompt + answer so far) and the token just
sampled, drafts k tokens, and accepts the longest prefix that agrees with the true greedy answer;
the step advances by accepted + 1, exactly as a greedy verify does.  Reported per workload and k:
tau (tokens per step), the fraction of steps that drafted, tokens drafted per step, and how well
the drafter's predicted tokens-per-step (1 + expected_accepted) matches the measured tau.

`--sweep` also prints tau and drafted tokens per step for every min_match in 1..6 plus a
12-token-match baseline (llama.cpp's n-gram speculators' default size), and the per-bucket
conditional acceptance (the data behind the prior in `llama_dflash.proposers.lookup`).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from dataclasses import dataclass
from typing import Optional, Sequence

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from llama_dflash.bench.copy_workloads import (  # noqa: E402
    CONTROL_WORKLOAD, COPY_HEAVY, COPY_HEAVY_HELDOUT, Prompt, messages)

CACHE_DIR = "/work/tmp/lookup_sim"
KS = (4, 8, 16)


@dataclass
class Sample:
    """One greedy answer: the prompt's tokens and the answer's tokens."""

    workload: str
    prompt_tokens: list[int]
    answer_tokens: list[int]


# ----------------------------------------------------------------------------- generation

def _cache_path(model_path: str, prompt: Prompt, max_tokens: int) -> str:
    key = json.dumps([os.path.basename(model_path), messages(prompt), max_tokens]).encode()
    return os.path.join(CACHE_DIR, hashlib.sha256(key).hexdigest()[:20] + ".json")


class Generator:
    """Greedy chat answers from llama-cpp-python, loaded lazily (cached answers need no model)."""

    def __init__(self, model_path: str, threads: Optional[int]):
        self.model_path = model_path
        self.threads = threads
        self._llm = None
        self._fmt = None

    def _load(self):
        from llama_cpp import Llama
        from llama_cpp.llama_chat_format import Jinja2ChatFormatter

        self._llm = Llama(self.model_path, n_ctx=4096, verbose=False, n_threads=self.threads)
        template = self._llm.metadata["tokenizer.chat_template"]
        eos = self._llm._model.token_get_text(self._llm.token_eos())
        self._fmt = Jinja2ChatFormatter(template, eos_token=eos, bos_token="")

    def answer(self, prompt: Prompt, max_tokens: int) -> tuple[list[int], list[int]]:
        if self._llm is None:
            self._load()
        llm = self._llm
        text = self._fmt(messages=messages(prompt)).prompt
        ptoks = llm.tokenize(text.encode(), add_bos=True, special=True)
        out: list[int] = []
        eos = llm.token_eos()  # SmolLM2: <|im_end|>, the end of the assistant turn
        for tok in llm.generate(ptoks, top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0):
            if tok == eos:
                break
            out.append(int(tok))
            if len(out) >= max_tokens:
                break
        return [int(t) for t in ptoks], out


def load_samples(prompt_set: dict[str, list[Prompt]], gen: Generator, max_tokens: int) -> list[Sample]:
    os.makedirs(CACHE_DIR, exist_ok=True)
    samples = []
    for workload, prompts in prompt_set.items():
        for prompt in prompts:
            path = _cache_path(gen.model_path, prompt, max_tokens)
            if os.path.isfile(path):
                with open(path) as fh:
                    data = json.load(fh)
            else:
                t0 = time.perf_counter()
                ptoks, atoks = gen.answer(prompt, max_tokens)
                data = {"prompt_tokens": ptoks, "answer_tokens": atoks}
                with open(path, "w") as fh:
                    json.dump(data, fh)
                print(f"  generated {workload}: {len(atoks)} tokens in {time.perf_counter() - t0:.1f}s",
                      file=sys.stderr)
            samples.append(Sample(workload, data["prompt_tokens"], data["answer_tokens"]))
    return samples


# ----------------------------------------------------------------------------- simulation

@dataclass
class Tally:
    """One (workload, drafter configuration, k) over its samples."""

    steps: int = 0
    tokens: int = 0
    drafted_steps: int = 0
    drafted_tokens: int = 0
    predicted: float = 0.0  # sum over drafted steps of 1 + expected_accepted(k)
    produced_drafted: int = 0  # tokens produced on drafted steps

    @property
    def tau(self) -> float:
        return self.tokens / self.steps if self.steps else 0.0

    @property
    def drafted_frac(self) -> float:
        return self.drafted_steps / self.steps if self.steps else 0.0

    @property
    def draft_per_step(self) -> float:
        return self.drafted_tokens / self.steps if self.steps else 0.0

    def add(self, other: "Tally") -> None:
        for f in ("steps", "tokens", "drafted_steps", "drafted_tokens", "predicted", "produced_drafted"):
            setattr(self, f, getattr(self, f) + getattr(other, f))


def simulate(sample: Sample, drafter, k: int, slots: Optional[list[list[int]]] = None) -> Tally:
    """Replay one greedy answer with teacher-forced drafting (see the module docstring).

    `slots`, when given, collects [bucket successes, bucket trials] of every verified slot."""
    from llama_dflash.proposers.lookup import bucket_of

    seq = sample.prompt_tokens + sample.answer_tokens
    n = len(sample.prompt_tokens)  # answer[0] is sampled by the prefill: the first id_last
    hist = seq[:n]
    drafter.n_max = k
    drafter.begin(hist)
    tally = Tally()
    while n < len(seq) - 1:
        pred = drafter.predict(hist, seq[n])
        draft = drafter.draft(hist, seq[n])[:k]
        truth = seq[n + 1:n + 1 + len(draft)]
        a = 0
        for d, t in zip(draft, truth):
            if d != t:
                break
            a += 1
        drafter.accept(a, not draft)
        produced = min(a + 1, len(seq) - 1 - n)
        tally.steps += 1
        tally.tokens += produced
        if draft:
            tally.drafted_steps += 1
            tally.drafted_tokens += len(draft)
            tally.predicted += 1.0 + pred.expected_accepted(len(draft))
            tally.produced_drafted += produced
            if slots is not None:
                for i in range(min(a + 1, len(truth))):
                    b = bucket_of(pred.match_length + i)
                    slots[b][0] += i < a
                    slots[b][1] += 1
        hist.extend(seq[n:n + produced])  # id_last and the accepted tokens; the bonus is the next id_last
        n += produced
    return tally


def run_config(samples: list[Sample], k: int, slots=None, **kw) -> dict[str, Tally]:
    """Tally per workload; one drafter per workload (it learns across that workload's prompts)."""
    from llama_dflash.proposers.lookup import SuffixLookup

    out: dict[str, Tally] = {}
    drafters: dict[str, SuffixLookup] = {}
    for s in samples:
        d = drafters.setdefault(s.workload, SuffixLookup(k, **kw))
        out.setdefault(s.workload, Tally()).add(simulate(s, d, k, slots))
    return out


def _copy_total(per: dict[str, Tally]) -> Tally:
    tot = Tally()
    for w, t in per.items():
        if w != CONTROL_WORKLOAD:
            tot.add(t)
    return tot


def main_table(samples: list[Sample], label: str, **kw) -> dict:
    """workload x k -> tau, drafted fraction, and the predicted tokens/step on drafted steps."""
    results: dict = {}
    per_k = {k: run_config(samples, k, **kw) for k in KS}
    workloads = list(per_k[KS[0]])
    print(f"\n## {label}  ({', '.join(f'{a}={b}' for a, b in kw.items()) or 'defaults'})")
    head = "workload".ljust(18) + "".join(f"| k={k:<2} tau  drafted  pred/real " for k in KS)
    print(head)
    rows = [(w, {k: per_k[k][w] for k in KS}) for w in workloads]
    rows.append(("copy-heavy (all)", {k: _copy_total(per_k[k]) for k in KS}))
    for w, by_k in rows:
        line = w.ljust(18)
        for k in KS:
            t = by_k[k]
            real = t.produced_drafted / t.drafted_steps if t.drafted_steps else 0.0
            pred = t.predicted / t.drafted_steps if t.drafted_steps else 0.0
            line += f"|     {t.tau:4.2f}   {100 * t.drafted_frac:4.0f}%  {pred:4.2f}/{real:4.2f} "
            results.setdefault(w, {})[k] = {"tau": round(t.tau, 3), "drafted": round(t.drafted_frac, 3),
                                            "draft_tokens_per_step": round(t.draft_per_step, 2),
                                            "predicted_on_drafted": round(pred, 3),
                                            "measured_on_drafted": round(real, 3)}
        print(line)
    return results


def sweep(samples: list[Sample], betas: Sequence[float] = (0.02, 0.1, 0.25)) -> dict:
    """tau and draft tokens/step per min_match; speedup proxy tau / (1 + beta * drafted/step)."""
    out: dict = {}
    print("\n## min_match sweep (tuning set); speedup proxy = tau / (1 + beta * draft tokens per step)")
    print("min_match  k  | copy tau  draft/st | open tau  draft/st | " +
          " ".join(f"sp(b={b}) copy/open" for b in betas))
    for mm in (1, 2, 3, 4, 5, 6, 12):
        for k in KS:
            per = run_config(samples, k, min_match=mm)
            c, o = _copy_total(per), per[CONTROL_WORKLOAD]
            sps = [(c.tau / (1 + b * c.draft_per_step), o.tau / (1 + b * o.draft_per_step)) for b in betas]
            print(f"{mm:^9d} {k:2d}  |   {c.tau:4.2f}    {c.draft_per_step:5.2f} |   {o.tau:4.2f}    "
                  f"{o.draft_per_step:5.2f} | " + " ".join(f"    {a:4.2f}/{b:4.2f}     " for a, b in sps))
            out[f"{mm}/{k}"] = {"copy_tau": c.tau, "copy_draft": c.draft_per_step,
                                "open_tau": o.tau, "open_draft": o.draft_per_step}
    return out


def calibration_sweep(samples: list[Sample], k: int = 8) -> dict:
    """Predicted vs measured tokens per drafted step, pooled, for a few prior strengths."""
    print(f"\n## calibration: predicted / measured tokens per drafted step (k={k}), by prior_strength")
    out = {}
    for strength in (1.0, 4.0, 16.0, 64.0):
        per = run_config(samples, k, prior_strength=strength)
        errs, cells = [], []
        for w, t in per.items():
            pred, real = t.predicted / t.drafted_steps, t.produced_drafted / t.drafted_steps
            errs.append(abs(pred - real) / real)
            cells.append(f"{w[:10]} {pred:4.2f}/{real:4.2f}")
        out[strength] = sum(errs) / len(errs)
        print(f"strength {strength:4.0f}: mean |rel. err| {out[strength]:.3f}   " + "  ".join(cells))
    return out


def pmin_sweep(samples: list[Sample], k: int = 16, beta: float = 0.1) -> dict:
    """What cutting drafts by cumulative confidence buys (p_min), k=16."""
    print(f"\n## p_min sweep (k={k}, min_match default): tau, draft tokens/step, speedup proxy at beta={beta}")
    out = {}
    for p_min in (0.0, 0.1, 0.3, 0.5):
        per = run_config(samples, k, p_min=p_min)
        c, o = _copy_total(per), per[CONTROL_WORKLOAD]
        out[p_min] = {"copy": (c.tau, c.draft_per_step), "open": (o.tau, o.draft_per_step)}
        print(f"p_min {p_min:.1f}: copy tau {c.tau:4.2f} draft/step {c.draft_per_step:5.2f} "
              f"sp {c.tau / (1 + beta * c.draft_per_step):4.2f} | open tau {o.tau:4.2f} draft/step "
              f"{o.draft_per_step:5.2f} sp {o.tau / (1 + beta * o.draft_per_step):4.2f}")
    return out


def bucket_acceptance(samples: list[Sample], k: int = 8) -> dict:
    """Conditional acceptance per bucket of L + slot (min_match 1), copy-heavy and open apart."""
    from llama_dflash.proposers.lookup import BUCKETS

    print(f"\n## conditional acceptance per bucket of (match length + slot), k={k}, min_match=1")
    res = {}
    for name, sel in (("copy-heavy", lambda w: w != CONTROL_WORKLOAD), ("open-chat", lambda w: w == CONTROL_WORKLOAD),
                      ("pooled", lambda w: True)):
        slots = [[0, 0] for _ in BUCKETS]
        run_config([s for s in samples if sel(s.workload)], k, slots=slots, min_match=1)
        res[name] = [(ok / n if n else None, n) for ok, n in slots]
        print(f"{name:11s} " + "  ".join(f"{lo}{'' if lo == hi else ('+' if hi > 99 else f'-{hi}')}: "
                                         f"{'  -  ' if p is None else f'{p:.2f}'} ({n})"
                                         for (lo, hi), (p, n) in zip(BUCKETS, res[name])))
    return res


def main() -> None:
    from llama_dflash.defaults import smollm2_path

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--set", choices=("tune", "heldout", "both"), default="both")
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--sweep", action="store_true", help="min_match sweep and bucket acceptance (tuning set)")
    ap.add_argument("--json", metavar="PATH")
    args = ap.parse_args()

    gen = Generator(smollm2_path(), args.threads)
    report: dict = {}
    t0 = time.perf_counter()
    sets = {"tune": COPY_HEAVY, "heldout": COPY_HEAVY_HELDOUT}
    for name in (("tune", "heldout") if args.set == "both" else (args.set,)):
        samples = load_samples(sets[name], gen, args.max_tokens)
        if args.sweep and name == "tune":
            report["sweep"] = sweep(samples)
            report["buckets"] = bucket_acceptance(samples)
            report["calibration"] = calibration_sweep(samples)
            report["p_min"] = pmin_sweep(samples)
        report[name] = main_table(samples, f"{name} set: lookup defaults")
        report[name + "_12"] = main_table(samples, f"{name} set: 12-token match (llama.cpp n-gram size)",
                                          min_match=12)
    print(f"\n({time.perf_counter() - t0:.0f}s)", file=sys.stderr)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(report, fh, indent=1)


if __name__ == "__main__":
    main()
