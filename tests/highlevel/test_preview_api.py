"""A program written from llama-cpp-python's speculative preview documentation runs here with only
its import changed: the names (`SpeculativeType`, `SpecConfig(spec_type=..., draft_model_path=...,
draft_backend_sampling=..., draft_n_gpu_layers=..., ngram_size_n=...)`, `last_speculative_stats`)
and their meanings (`mean_accepted_length` is tau: the target's token plus the accepted prefix)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

# as the preview documents it; the test changes the import line only
PREVIEW_PROGRAM = '''
import json, sys
from llama_cpp import Llama, SpecConfig, SpeculativeType

target, draft, prompt = sys.argv[1], sys.argv[2], sys.argv[3]
configs = {
    "dflash": SpecConfig(spec_type=SpeculativeType.DRAFT_DFLASH, draft_model_path=draft, draft_n_max=4,
                         draft_p_min=0.0, draft_backend_sampling=False, draft_n_gpu_layers="auto"),
    "map-k": SpecConfig(spec_type=SpeculativeType.NGRAM_MAP_K, ngram_size_n=2, ngram_size_m=8,
                        ngram_min_hits=1),
    "map-k4v": SpecConfig(spec_type=SpeculativeType.NGRAM_MAP_K4V, ngram_size_n=2, ngram_size_m=8,
                          ngram_min_hits=1),
}
out = {}
for name, spec in configs.items():
    llm = Llama(model_path=target, n_ctx=512, n_batch=64, n_ubatch=64, n_threads=1, verbose=False,
                speculative=spec)
    r = llm.create_completion(prompt, max_tokens=100, temperature=0.0)
    out[name] = {"text": r["choices"][0]["text"], "stats": llm.last_speculative_stats}
    llm.close()
plain = Llama(model_path=target, n_ctx=512, n_batch=64, n_ubatch=64, n_threads=1, verbose=False)
out["ordinary"] = plain.create_completion(prompt, max_tokens=100, temperature=0.0)["choices"][0]["text"]
plain.close()
print(json.dumps(out))
'''

PREVIEW_KEYS = {
    "drafted", "verified", "accepted", "mean_accepted_length", "acceptance_rate_per_position", "draft_seconds",
    "target_decode_seconds", "target_sync_seconds", "process_seconds", "time_to_first_token_seconds",
    "sustained_tokens_per_second", "generation_tokens_per_second", "rollbacks", "checkpoint_captures",
    "checkpoint_restores",
}


@pytest.fixture(scope="module")
def preview_run(tmp_path_factory, tiny_target, tiny_draft):
    program = PREVIEW_PROGRAM.replace("from llama_cpp import Llama, SpecConfig, SpeculativeType",
                                      "from llama_dflash import Llama, SpecConfig, SpeculativeType")
    assert program != PREVIEW_PROGRAM
    path = tmp_path_factory.mktemp("preview") / "program.py"
    path.write_text(program)
    prompt = " ".join(["the quick brown fox and the lazy dog is"] * 4)  # repeated: the n-gram types find matches in the history
    proc = subprocess.run([sys.executable, str(path), tiny_target, tiny_draft, prompt], capture_output=True, text=True,
                          timeout=300, cwd=os.path.dirname(path))
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("name", ["dflash", "map-k", "map-k4v"])
def test_preview_program_runs_with_only_the_import_changed(preview_run, name):
    run = preview_run[name]
    assert run["text"] == preview_run["ordinary"]  # greedy: the ordinary tokens
    s = run["stats"]
    assert PREVIEW_KEYS <= set(s)
    steps = s["verification_steps"]
    # (the last block drafted may go unverified: the generation ends at max_tokens first)
    assert steps > 0 and 0 < s["verified"] <= s["drafted"] <= s["verified"] + 8
    # the preview's meaning: tau, the target's own token plus the mean accepted prefix
    assert s["mean_accepted_length"] == pytest.approx(1 + s["accepted"] / steps)
    assert s["time_to_first_token_seconds"] > 0 and s["generation_tokens_per_second"] > 0
    assert s["target_decode_seconds"] > 0


def test_acceptance_per_position_is_a_rate(preview_run):
    for name in ("dflash", "map-k", "map-k4v"):
        rates = preview_run[name]["stats"]["acceptance_rate_per_position"]
        assert rates and all(0.0 <= r <= 1.0 for r in rates)
        assert rates == sorted(rates, reverse=True)  # slot i is accepted only after slot i-1
