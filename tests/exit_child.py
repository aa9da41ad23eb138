"""Child process of tests/test_exit_safety.py: build instances, drop or keep them, exit.

    python exit_child.py FIXTURES MODE N_GPU_LAYERS CASE...

FIXTURES is the directory `exit_fixtures.write_fixtures` filled.  MODE:

* ``drop``: each instance is used, left unclosed in a reference cycle and collected -- with the
  garbage collector's finalisation order turned against us: the instance object is aged into an
  older generation before its `__init__` runs, so everything `__init__` creates (models before
  their contexts, contexts before their dependents) is finalised before the instance itself,
  parents first.  A weak reference checks that nothing keeps the instance alive afterwards.
  A second, plain instance is dropped without a cycle (freed by its reference count).
* ``alive``: every instance is used (one with an unfinished stream) and kept until the
  interpreter exits.

Every case runs under `FreeAudit`: a handle freed twice or before its dependents ends the
process with exit code 3 and a message, whether or not that use-after-free would crash.

CASE is ``API:TARGET:SPEC[:lora]``: API ``llama`` (llama_dflash.Llama), ``engine``
(LlamaDFlashDecoding), ``ordinary`` (OrdinaryDecoding) or, in ``alive`` mode only, ``served`` (a
Llama and a BatchedEngine on a view of its model, as `serve --parallel N` builds them; the view
has no owner to close it first, so dropping them in a cycle is left out); TARGET a fixture name (``llama``,
``qwen3next``); SPEC ``none``, ``draft``, ``ngram`` (a chain of n-gram types), ``chain`` (an n-gram
type and the draft), ``lookup``, ``auto`` or ``auto-draft``.  Prints ``ok CASE`` after each case.
"""

from __future__ import annotations

import gc
import os
import sys
import weakref
from typing import Any, Optional

SPECS = {
    "none": None,
    "draft": dict(),
    "ngram": dict(spec_type="ngram-simple,ngram-map-k,ngram-mod"),
    "chain": dict(spec_type="ngram-map-k,draft"),
    "lookup": dict(spec_type="lookup"),
    "auto": dict(spec_type="auto"),
    "auto-draft": dict(spec_type="auto"),
}
_WITH_DRAFT = ("draft", "chain", "auto-draft")
KW = dict(n_ctx=256, n_batch=64, n_ubatch=64, n_threads=1, verbose=False)
N_GPU_LAYERS = 0  # set by main()
PROMPT = "the dog"


def _spec(fixtures: str, target: str, name: str):
    from llama_dflash import SpecConfig

    kw = SPECS[name]
    if kw is None:
        return None
    kw = dict(kw, draft_n_max=4)
    if name in _WITH_DRAFT:
        kw["draft_model"] = os.path.join(fixtures, f"{target}.draft.gguf")
    return SpecConfig(**kw)


class Served:
    """A Llama and a BatchedEngine on a borrowed view of its model (server.cli.batched_engine)."""

    def __init__(self, path: str, spec: Any, **kwargs: Any):
        from llama_dflash import Llama
        from llama_dflash._llama import Model
        from llama_dflash.batched import BatchedEngine

        self.llm = Llama(path, speculative=spec, **kwargs)
        model = Model.borrow(self.llm._model.model, self.llm.model_path, False,
                             n_gpu_layers=int(self.llm.model_params.n_gpu_layers))
        self.engine = BatchedEngine(model, n_seq=2, n_ctx_seq=128, n_batch=64, n_threads=1,
                                    n_gpu_layers=N_GPU_LAYERS)

    def use(self) -> None:
        self.llm.create_completion(PROMPT, max_tokens=12, temperature=0)
        self.engine.generate([self.llm.tokenize(PROMPT.encode())], max_tokens=8)


def build(fixtures: str, case: str, *, aged: bool) -> Any:
    """The instance a case names; `aged`: allocated, moved to an older GC generation, then
    initialised (what its __init__ creates stays younger and is finalised first)."""
    api, target, spec_name, *rest = case.split(":")
    path = os.path.join(fixtures, f"{target}.gguf")
    spec = _spec(fixtures, target, spec_name)
    if api == "served":
        return Served(path, spec, **dict(KW, n_gpu_layers=N_GPU_LAYERS))
    if api == "llama":
        from llama_dflash import Llama

        cls: type = Llama
        args: tuple = (path,)
        kwargs: dict = dict(KW, speculative=spec, n_gpu_layers=N_GPU_LAYERS)
        if "lora" in rest:
            kwargs["lora_path"] = os.path.join(fixtures, f"{target}.lora.gguf")
    else:
        from llama_dflash import LlamaDFlashDecoding, OrdinaryDecoding, TargetConfig

        config = TargetConfig(path, n_ctx=256, n_batch=64, n_ubatch=64, n_threads=1, n_gpu_layers=N_GPU_LAYERS)
        if api == "engine":
            cls, args, kwargs = LlamaDFlashDecoding, (config, spec), {}
        else:
            cls, args, kwargs = OrdinaryDecoding, (config,), {}
    obj = cls.__new__(cls)
    if aged:
        gc.collect(0)
    obj.__init__(*args, **kwargs)
    return obj


def use(obj: Any, *, leave_open: bool = False) -> Optional[Any]:
    """Generate a few greedy tokens; `leave_open`: also return a stream left unfinished."""
    from llama_dflash import Llama

    if isinstance(obj, Served):
        obj.use()
        return None
    if isinstance(obj, Llama):
        obj.create_completion(PROMPT, max_tokens=12, temperature=0)
        if leave_open:
            stream = obj.create_completion(PROMPT, max_tokens=12, temperature=0, stream=True)
            next(stream)
            return stream
        return None
    prompt = obj.tokenize(PROMPT)
    obj.generate(prompt, 12)
    if leave_open:
        stream = obj.stream(prompt, 12)
        next(stream)
        return stream
    return None


def drop(fixtures: str, case: str) -> None:
    obj = build(fixtures, case, aged=True)
    use(obj)
    obj._exit_test_cycle = obj  # a cycle: only the collector frees it, in its own order
    ref = weakref.ref(obj)
    del obj
    gc.collect()
    if ref() is not None:
        sys.exit(f"{case}: still alive after gc.collect() (something outside keeps a reference)")
    obj = build(fixtures, case, aged=False)
    use(obj)
    ref = weakref.ref(obj)
    del obj
    gc.collect()
    if ref() is not None:
        sys.exit(f"{case}: a plain instance is still alive after gc.collect()")


def _addr(p: Any) -> Optional[int]:
    """A handle as an int, whichever ctypes type the binding gives it."""
    import ctypes

    if p is None or isinstance(p, int):
        return p
    if isinstance(p, ctypes.c_void_p):
        return p.value
    return ctypes.cast(p, ctypes.c_void_p).value


class FreeAudit:
    """Wraps llama.cpp's create/free functions in `llama_cpp.llama_cpp` (every caller looks them up
    there at call time) and ends the process with a message, before the C call, where a handle
    would be freed twice or before what depends on it: a model before its contexts, a context
    before its batches or the contexts reading it through ctx_other.  A use-after-free does not
    always crash; this always notices.  llama_model_free also frees the model's LoRA adapters."""

    def __init__(self) -> None:
        from llama_cpp import llama_cpp as ll

        self.ll = ll
        self.ctx_model: dict[int, int] = {}  # live context -> its model
        self.ctx_other: dict[int, int] = {}  # live context -> the context it reads (ctx_other)
        self.batch_ctx: dict[int, int] = {}  # live batch -> its context
        self.adapters: dict[int, int] = {}  # live adapter -> its model
        self.models: set[int] = set()
        self._wrap("llama_model_load_from_file", self._model_loaded)
        self._wrap("llama_init_from_model", self._ctx_made)
        self._wrap("llama_batch_ext_init", self._batch_made)
        self._wrap("llama_adapter_lora_init", self._adapter_made)
        self._wrap("llama_model_free", None, self._model_free)
        self._wrap("llama_free", None, self._ctx_free)
        self._wrap("llama_batch_ext_free", None, self._batch_free)
        self._wrap("llama_adapter_lora_free", None, self._adapter_free)

    def _wrap(self, name: str, after: Any, before: Any = None) -> None:
        real = getattr(self.ll, name)

        def call(*args: Any) -> Any:
            if before is not None:
                before(*args)
            out = real(*args)
            if after is not None:
                after(out, *args)
            return out

        setattr(self.ll, name, call)

    @staticmethod
    def fail(msg: str) -> None:
        sys.stderr.write(f"FreeAudit: {msg}\n")
        sys.stderr.flush()
        os._exit(3)

    def _model_loaded(self, out: Any, *args: Any) -> None:
        if out:
            self.models.add(_addr(out))

    def _ctx_made(self, out: Any, model: Any, params: Any) -> None:
        if out:
            self.ctx_model[_addr(out)] = _addr(model)
            other = _addr(params.ctx_other)
            if other:
                self.ctx_other[_addr(out)] = other

    def _batch_made(self, out: Any, ctx: Any) -> None:
        if out:
            self.batch_ctx[_addr(out)] = _addr(ctx)

    def _adapter_made(self, out: Any, model: Any, path: Any) -> None:
        if out:
            self.adapters[_addr(out)] = _addr(model)

    def _model_free(self, model: Any) -> None:
        m = _addr(model)
        if m not in self.models:
            self.fail(f"llama_model_free({m:#x}): not a live model")
        if any(v == m for v in self.ctx_model.values()):
            self.fail(f"llama_model_free({m:#x}) while a context of it is alive")
        self.models.discard(m)
        for a in [a for a, owner in self.adapters.items() if owner == m]:
            del self.adapters[a]  # llama.cpp's model deletes its adapters

    def _ctx_free(self, ctx: Any) -> None:
        c = _addr(ctx)
        if c not in self.ctx_model:
            self.fail(f"llama_free({c:#x}): not a live context")
        if any(v == c for v in self.ctx_other.values()):
            self.fail(f"llama_free({c:#x}) while a context reading it through ctx_other is alive")
        if any(v == c for v in self.batch_ctx.values()):
            self.fail(f"llama_free({c:#x}) while a batch of it is alive")
        del self.ctx_model[c]
        self.ctx_other.pop(c, None)

    def _batch_free(self, batch: Any) -> None:
        if self.batch_ctx.pop(_addr(batch), None) is None:
            self.fail(f"llama_batch_ext_free({_addr(batch):#x}): not a live batch")

    def _adapter_free(self, adapter: Any) -> None:
        if self.adapters.pop(_addr(adapter), None) is None:
            self.fail(f"llama_adapter_lora_free({_addr(adapter):#x}): not a live adapter "
                      "(its model has freed it already?)")


def main(argv: list[str]) -> None:
    global N_GPU_LAYERS
    fixtures, mode, N_GPU_LAYERS, cases = argv[0], argv[1], int(argv[2]), argv[3:]
    FreeAudit()
    keep = []
    if mode == "drop":
        gc.disable()  # no collection but ours: the order drop() arranges holds
    for case in cases:
        if mode == "drop":
            drop(fixtures, case)
        elif mode == "alive":
            obj = build(fixtures, case, aged=False)
            keep.append((obj, use(obj, leave_open=True)))
        else:
            sys.exit(f"unknown mode {mode}")
        print("ok", case, flush=True)
    globals()["_kept"] = keep  # alive until the interpreter exits


if __name__ == "__main__":
    main(sys.argv[1:])
