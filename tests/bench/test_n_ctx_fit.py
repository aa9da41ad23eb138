"""`--n-ctx` grows to hold the longest prompt + the largest --max-tokens (+ a draft block): a
2048-token cell in the default 2048 used to stop short of 2048 tokens, silently."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass

from llama_dflash.bench.runner import CTX_MARGIN, CTX_STEP, raise_context
from llama_dflash.config import TargetConfig


@dataclass
class _Cfg:
    target: TargetConfig


def test_raise_context_only_when_needed(tiny_target):
    cfg = _Cfg(TargetConfig(tiny_target, n_ctx=2048))
    assert raise_context(cfg, 40, "the prompt", 512) == [] and cfg.target.n_ctx == 2048
    notes = raise_context(cfg, 40, "the prompt", 2048)
    assert cfg.target.n_ctx == 2304 and cfg.target.n_ctx % CTX_STEP == 0
    assert cfg.target.n_ctx >= 40 + 2048 + CTX_MARGIN
    assert notes == [f"n_ctx raised from 2048 to 2304: the longest prompt (the prompt) has 40 tokens, plus max-tokens "
                     f"2048 and {CTX_MARGIN} for the last draft block"]


def _bench(tiny_target, tiny_draft, tmp_path, *args):
    out = tmp_path / "b.json"
    proc = subprocess.run([sys.executable, "-m", "llama_dflash.cli", "bench", "--model", tiny_target, "--draft-model",
                           tiny_draft, "--raw-prompt", "--ignore-eos", "--n-ctx", "256", "--n-batch", "64",
                           "--n-ubatch", "64", "--runs", "1", "--warmup-tokens", "0", "--no-cost-probe", "--threads",
                           "1", "--quiet", "--json", str(out), *args], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return json.loads(out.read_text()), proc.stdout


def test_single_run_reaches_max_tokens_past_n_ctx(tiny_target, tiny_draft, tmp_path):
    d, text = _bench(tiny_target, tiny_draft, tmp_path, "--max-tokens", "300", "--draft-tokens", "2")
    assert [r["tokens"] for r in d["ordinary"]["runs"]] == [300]
    assert [r["tokens"] for r in d["speculative"]["runs"]] == [300]
    assert int(d["settings"]["n_ctx"]) >= 300 and d["notes"][0].startswith("n_ctx raised from 256 to ")
    assert "n_ctx raised from 256" in text


def test_sweep_cells_reach_their_max_tokens(tiny_target, tiny_draft, tmp_path):
    d, _ = _bench(tiny_target, tiny_draft, tmp_path, "--sweep-max-tokens", "8,300", "--sweep-draft-tokens", "2")
    assert [c["max_tokens"] for c in d["cells"]] == [8, 300]
    for cell in d["cells"]:
        assert [r["tokens"] for r in cell["ordinary"]["runs"]] == [cell["max_tokens"]]
        assert [r["tokens"] for r in cell["speculative"]["2"]["runs"]] == [cell["max_tokens"]]
    assert d["n_ctx"] >= 300 and any(n.startswith("n_ctx raised from 256") for n in d["notes"])
