"""Nothing crashes on the way out (issue 41 item 5).

Instances of `llama_dflash.Llama`, `LlamaDFlashDecoding` and `OrdinaryDecoding` -- with a LoRA
adapter, a draft model, every speculator kind, on an attention and on a hybrid (qwen3next)
target -- are dropped unclosed inside reference cycles and collected with the collector's
finalisation order turned against us (parents before children), or kept alive until the
interpreter exits.  Each runs in a child process (tests/exit_child.py) that audits every free
of a model, context, batch and adapter: exit code 0, no signal, nothing printed on the way out.
Before the fix, `Llama(lora_path=...)` died with SIGSEGV freeing its adapter a second time, and
the engines freed models before their contexts and target contexts before their drafts.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from _equivalence import DEVICE_LAYERS
from exit_fixtures import write_fixtures
from llama_dflash._llama import BatchExt, Context, Model

HERE = os.path.dirname(os.path.abspath(__file__))

CASES = {
    "llama": [
        "llama:llama:none:lora", "llama:llama:draft:lora", "llama:llama:ngram", "llama:llama:chain:lora",
        "llama:llama:lookup:lora", "llama:llama:auto", "llama:llama:auto-draft:lora",
        "llama:qwen3next:none:lora", "llama:qwen3next:draft:lora", "llama:qwen3next:ngram",
        "llama:qwen3next:lookup", "llama:qwen3next:auto-draft:lora",
    ],
    "engine": [
        "engine:llama:draft", "engine:llama:ngram", "engine:llama:chain", "engine:llama:lookup",
        "engine:llama:auto", "engine:llama:auto-draft", "engine:qwen3next:draft", "engine:qwen3next:ngram",
        "engine:qwen3next:chain", "engine:qwen3next:lookup", "engine:qwen3next:auto-draft",
    ],
    "ordinary": ["ordinary:llama:none", "ordinary:qwen3next:none"],
    # serve --parallel N: a Llama and a batched engine on a view of its model (alive at exit only)
    "served": ["served:llama:none", "served:llama:ngram"],
}


@pytest.fixture(scope="module")
def fixtures(tmp_path_factory):
    return write_fixtures(str(tmp_path_factory.mktemp("exit")))


def _run_child(fixtures: str, mode: str, cases: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, os.path.join(HERE, "exit_child.py"), fixtures, mode,
                           str(DEVICE_LAYERS), *cases], capture_output=True, text=True, timeout=300, cwd=HERE)


# (served: server.cli borrows the Llama's model for the batched engine without an owner -- with
# Model.borrow(owner=llm._model) a collected cycle would close the engine's context first too -- so
# only exiting with them alive is covered)
RUNS = [(api, mode) for api in sorted(CASES) for mode in ("drop", "alive") if (api, mode) != ("served", "drop")]


@pytest.mark.gpu
@pytest.mark.parametrize("api,mode", RUNS)
def test_instances_dropped_or_alive_exit_cleanly(fixtures, api, mode):
    proc = _run_child(fixtures, mode, CASES[api])
    assert proc.returncode == 0, f"exit code {proc.returncode}\n{proc.stdout}\n{proc.stderr[-3000:]}"
    assert proc.stdout.split() == [w for case in CASES[api] for w in ("ok", case)]
    for noise in ("Traceback", "Exception ignored", "FreeAudit", "~llama_context"):
        assert noise not in proc.stderr, proc.stderr[-3000:]


def test_closing_a_model_frees_its_dependents_first(tiny_target):
    """Whatever closes first, a context goes before its model and a batch before its context:
    the order the collector may pick for a garbage cycle."""
    from llama_cpp import llama_cpp as ll

    model = Model(tiny_target, n_gpu_layers=0)
    params = ll.llama_context_default_params()
    params.n_ctx, params.n_batch, params.n_ubatch = 64, 16, 16
    target = Context(model, params)
    draft = Context(model, ll.llama_context_default_params(), other=target)
    batch = BatchExt(draft)
    target.close()  # the draft reads it through ctx_other: freed first, with its batch
    assert draft.closed and batch.closed and not model.closed
    again = Context(model, params)
    model.close()
    assert again.closed
    with pytest.raises(RuntimeError, match="closed"):
        again.seq_rm(0, 0)  # not a call through the dead context's memory pointer
    for h in (again, draft, batch, target, model):
        h.close()  # idempotent
