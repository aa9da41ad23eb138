"""Owners of llama.cpp handles: one Python object per C handle, idempotent `close()`.

A handle's pointer and the function that frees it sit in a `_Cell` that knows the cells which
must be freed before it (a context before its model, a draft context before the target context
it reads through ctx_other, a batch before its context).  Cells hold no reference to the Python
objects wrapping them, so closing a parent frees its dependents first whatever order the garbage
collector finalises the wrappers of a reference cycle in.

Every handle created here is registered in a weak set, and every engine that owns handles in
`close_at_exit`; an `atexit` hook closes whatever handle is still open, then the engines (what
they hold beyond our handles: llama_cpp.Llama's model and context), before the interpreter tears
down ctypes, so exiting without `close()` is safe.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import threading
import weakref
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional, Sequence

import llama_cpp
from llama_cpp import llama_cpp as ll

from .config import SPLIT_MODE_NAMES as SPLIT_MODES
from .errors import LlamaCallError

__all__ = ["Model", "Context", "BatchExt", "Placement", "placement_defaults", "ensure_backend", "set_verbose",
           "seq_state", "set_seq_state",
           "recent_log_messages"]

_backend_lock = threading.Lock()
_backend_ready = False
_verbose = False
_messages: deque[tuple[int, str]] = deque(maxlen=200)
_open: "weakref.WeakSet[_Handle]" = weakref.WeakSet()
_engines: "weakref.WeakSet[Any]" = weakref.WeakSet()

_LEVEL_WARN = 3  # ggml_log_level: NONE 0, DEBUG 1, INFO 2, WARN 3, ERROR 4, CONT 5
_LEVEL_ERROR = 4
_LEVEL_CONT = 5
_last_level = 0


@ll.llama_log_callback
def _log_callback(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
    """Keep llama.cpp quiet unless verbose; remember warnings and errors for the report."""
    global _last_level
    if level != _LEVEL_CONT:
        _last_level = level
    msg = text.decode("utf-8", errors="replace")
    if _last_level in (_LEVEL_WARN, _LEVEL_ERROR) and msg.strip():
        _messages.append((_last_level, msg.rstrip()))
    if _verbose:
        import sys

        sys.stderr.write(msg)


def set_verbose(verbose: bool) -> None:
    global _verbose
    _verbose = bool(verbose)


def recent_log_messages() -> list[tuple[str, str]]:
    """Warnings and errors llama.cpp logged in this process, oldest first."""
    return [("warning" if lvl == _LEVEL_WARN else "error", m) for lvl, m in _messages]


def ensure_backend() -> None:
    """Initialise the llama.cpp backend once per process and install our log callback."""
    global _backend_ready
    with _backend_lock:
        if not _backend_ready:
            ll.llama_log_set(_log_callback, ctypes.c_void_p(0))
            ll.llama_backend_init()
            _backend_ready = True


def close_at_exit(obj: Any) -> None:
    """Close `obj` (anything with `close()`, weakly referenced) at interpreter exit if it is still
    alive then, after every open handle: what it holds beyond them (llama-cpp-python's objects) is
    freed before shutdown tears modules down."""
    _engines.add(obj)


@atexit.register
def _close_all_at_exit() -> None:
    # our handles first, contexts before models (a parent's close frees its dependents first
    # anyway): a context of ours on a borrowed model (the server's batched engine on a Llama's) goes
    # before the engine that owns that model frees it
    for handle in sorted(list(_open), key=lambda h: h.close_order):
        try:
            handle.close()
        except Exception:  # noqa: BLE001 - never raise during interpreter shutdown
            pass
    # then what the engines hold beyond our handles (llama_cpp.Llama's model and context)
    for engine in list(_engines):
        try:
            engine.close()
        except Exception:  # noqa: BLE001 - never raise during interpreter shutdown
            pass
    # the Python log callback dies with the interpreter; hand logging back to C
    try:
        ll.llama_log_set(ctypes.cast(None, ll.llama_log_callback), ctypes.c_void_p(0))
    except Exception:  # noqa: BLE001
        pass


class _Cell:
    """One C handle: its address, the C function that frees it (None: borrowed, someone else
    frees it), hooks to run just before, and the cells to free first.

    No reference to the wrapping Python object: a parent can free its dependents even while the
    garbage collector finalises their wrappers, parents first."""

    __slots__ = ("ptr", "free", "hooks", "dependents")

    def __init__(self) -> None:
        self.ptr: Optional[int] = None
        self.free: Optional[Callable[[int], Any]] = None
        self.hooks: list[Callable[[], None]] = []
        self.dependents: list[_Cell] = []

    def add_dependent(self, cell: "_Cell") -> None:
        if self.ptr is None:
            raise RuntimeError("cannot depend on a closed handle")
        self.dependents = [c for c in self.dependents if c.ptr is not None]
        self.dependents.append(cell)

    def close(self) -> None:
        """Free the dependents (newest first), run the hooks, free the handle; once."""
        if self.ptr is None:
            return
        deps, self.dependents = self.dependents, []
        hooks, self.hooks = self.hooks, []
        ptr, free = self.ptr, self.free
        try:
            for cell in reversed(deps):
                cell.close()
            for fn in reversed(hooks):
                fn()
        finally:
            self.ptr = None
            if free is not None:
                free(ptr)


class _Handle:
    close_order = 0

    def __init__(self) -> None:
        self._cell = _Cell()
        _open.add(self)

    def _own(self, ptr: int, free: Optional[Callable[[int], Any]]) -> None:
        """Take `ptr`, freed by `free` on close (None: a borrowed handle, never freed here)."""
        self._cell.ptr = ptr
        self._cell.free = free

    @property
    def _ptr(self) -> Optional[int]:
        return self._cell.ptr

    @property
    def ptr(self) -> int:
        ptr = self._cell.ptr
        if ptr is None:
            raise RuntimeError(f"{type(self).__name__} is closed")
        return ptr

    @property
    def closed(self) -> bool:
        return self._cell.ptr is None

    def depend_on(self, parent: "_Handle") -> None:
        """Closing `parent` (by whatever path) closes this handle first."""
        parent._cell.add_dependent(self._cell)

    def close_with(self, owner: Any) -> None:
        """Close this handle (a view of `owner`'s pointer) just before `owner` frees it --
        `owner` a llama-cpp-python object (LlamaModel, LlamaContext) whose `close()` runs its
        `_exit_stack`, as it runs by its own `__del__` when the collector finalises it."""
        stack = getattr(owner, "_exit_stack", None)
        if stack is not None:
            stack.callback(self._cell.close)

    def close(self) -> None:
        self._cell.close()
        _open.discard(self)

    def __enter__(self):
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001
            pass


_ALL_LAYERS = 0x7FFFFFFF  # what llama-cpp-python passes for n_gpu_layers=-1


@dataclass(frozen=True)
class Placement:
    """Where a model's weights go, as passed to llama.cpp's model parameters.

    `n_gpu_layers` as asked (-1: all; llama-cpp-python's 0x7FFFFFFF reads as -1 here),
    `split_mode` a llama_split_mode value (0 none, 1 layer, 2 row, 3 tensor), `main_gpu` the
    device index split mode "none" uses (-1 there: no GPU), `tensor_split` the per-device shares
    (None: llama.cpp's default, by free memory).
    """

    n_gpu_layers: int = -1
    split_mode: int = SPLIT_MODES["layer"]
    main_gpu: int = 0
    tensor_split: Optional[tuple[float, ...]] = None

    def __post_init__(self) -> None:
        if self.n_gpu_layers >= _ALL_LAYERS:
            object.__setattr__(self, "n_gpu_layers", -1)

    @property
    def offloads(self) -> bool:
        """Whether any layer is asked to go to a GPU (llama.cpp puts the output head there first)."""
        return self.n_gpu_layers != 0 and not (self.split_mode == SPLIT_MODES["none"] and self.main_gpu < 0)

    def devices(self, n_gpus: int) -> frozenset:
        """The devices the weights may sit on with `n_gpus` GPUs: "CPU" and/or GPU indices."""
        if not self.offloads or n_gpus <= 0:
            return frozenset({"CPU"})
        if self.split_mode == SPLIT_MODES["none"]:
            return frozenset({self.main_gpu})
        shares = self.tensor_split
        gpus = [i for i in range(n_gpus) if shares is None or (i < len(shares) and shares[i] > 0)]
        return frozenset(gpus or range(n_gpus))


_placement_defaults = threading.local()


@contextlib.contextmanager
def placement_defaults(split_mode: Optional[int] = None, main_gpu: Optional[int] = None,
                       tensor_split: Optional[Sequence[float]] = None) -> Iterator[None]:
    """Models loaded by this thread inside the block take these placement values unless the
    caller passes its own (`llama_dflash.Llama` loads its draft this way, on the target's
    split mode, main GPU and tensor split)."""
    saved = getattr(_placement_defaults, "value", None)
    _placement_defaults.value = (split_mode, main_gpu, None if tensor_split is None else tuple(tensor_split))
    try:
        yield
    finally:
        _placement_defaults.value = saved


class Model(_Handle):
    """A loaded GGUF model."""

    close_order = 2

    def __init__(self, path: str, n_gpu_layers: int = -1, repack: Optional[bool] = None, *,
                 split_mode: Optional[int] = None, main_gpu: Optional[int] = None,
                 tensor_split: Optional[Sequence[float]] = None, load_mtp: bool = False,
                 vocab_only: bool = False):
        """`load_mtp`: also load the model's MTP (nextn) blocks, for `draft-mtp` (llama.cpp skips
        them by default, and an MTP context on a model loaded without them has no graph).
        `vocab_only`: the vocabulary alone (no weights: quick; no context can be made on it)."""
        super().__init__()
        ensure_backend()
        params = ll.llama_model_default_params()
        params.n_gpu_layers = _ALL_LAYERS if n_gpu_layers < 0 else n_gpu_layers
        self.n_gpu_layers = int(n_gpu_layers)  # as asked (-1: all); a draft "auto" follows it
        d_split, d_main, d_shares = getattr(_placement_defaults, "value", None) or (None, None, None)
        split_mode = d_split if split_mode is None else split_mode
        main_gpu = d_main if main_gpu is None else main_gpu
        tensor_split = d_shares if tensor_split is None else tensor_split
        if split_mode is not None:
            params.split_mode = int(split_mode)
        if main_gpu is not None:
            params.main_gpu = int(main_gpu)
        if tensor_split is not None:
            values = [float(x) for x in tensor_split]
            n_max = int(ll.llama_max_devices())
            if len(values) > n_max or any(not x >= 0 for x in values):
                raise ValueError(f"tensor_split must hold at most {n_max} shares >= 0, not {values}")
            params.tensor_split = (ctypes.c_float * n_max)(*values)  # params keeps it alive (read at load)
        self.placement = Placement(int(n_gpu_layers), int(params.split_mode), int(params.main_gpu),
                                   None if tensor_split is None else tuple(float(x) for x in tensor_split))
        # llama.cpp's AMX weight repacking crashes batched decodes of Q4_1 models (seen with
        # SmolLM2 on Xeon CPUs with AMX), so the default turns it off where AMX is present
        self.repack = (not cpu_has_amx()) if repack is None else bool(repack)
        params.use_extra_bufts = self.repack
        params.load_mtp = self.load_mtp = bool(load_mtp)
        params.vocab_only = bool(vocab_only)
        ptr = ll.llama_model_load_from_file(path.encode("utf-8"), params)
        if not ptr:
            raise LlamaCallError(f"llama.cpp could not load the model {path} (run with --verbose for its log)")
        self._own(ptr, ll.llama_model_free)
        self._adopt(ptr, path)

    @classmethod
    def borrow(cls, ptr: int, path: str, repack: bool, n_gpu_layers: int = -1,
               placement: Optional[Placement] = None, owner: Any = None, load_mtp: bool = False) -> "Model":
        """A view of a model someone else loaded and frees (e.g. a llama_cpp.Llama's); `owner`,
        the llama-cpp-python object that frees it, closes the view (and what depends on it) first.
        `load_mtp`: whether it was loaded with its MTP layers."""
        self = cls.__new__(cls)
        _Handle.__init__(self)
        self._own(ptr, None)
        if owner is not None:
            self.close_with(owner)
        self.repack = bool(repack)
        self.load_mtp = bool(load_mtp)
        self.n_gpu_layers = int(n_gpu_layers)
        self.placement = placement if placement is not None else Placement(int(n_gpu_layers))
        self._adopt(ptr, path)
        return self

    def _adopt(self, ptr: int, path: str) -> None:
        self.path = path
        self.vocab = ll.llama_model_get_vocab(ptr)
        self.n_vocab = int(ll.llama_vocab_n_tokens(self.vocab))
        self.n_embd = int(ll.llama_model_n_embd(ptr))
        self.n_layer = int(ll.llama_model_n_layer(ptr))
        self.n_layer_nextn = int(ll.llama_model_n_layer_nextn(ptr))
        self._eog: Optional[tuple[int, ...]] = None

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        data = text.encode("utf-8")
        n_max = len(data) + 16
        buf = (ll.llama_token * n_max)()
        n = ll.llama_tokenize(self.vocab, data, len(data), buf, n_max, add_special, parse_special)
        if n < 0:
            n_max = -n
            buf = (ll.llama_token * n_max)()
            n = ll.llama_tokenize(self.vocab, data, len(data), buf, n_max, add_special, parse_special)
        return list(buf[:n])

    def detokenize(self, tokens: list[int]) -> str:
        out = bytearray()
        buf = ctypes.create_string_buffer(256)
        for tok in tokens:
            n = ll.llama_token_to_piece(self.vocab, tok, buf, len(buf), 0, False)
            if n > 0:
                out += buf.raw[:n]
        return out.decode("utf-8", errors="replace")

    def is_eog(self, token: int) -> bool:
        return bool(ll.llama_vocab_is_eog(self.vocab, token))

    def eog_tokens(self) -> tuple[int, ...]:
        """Every end-of-generation token of the vocabulary (computed once)."""
        if self._eog is None:
            self._eog = tuple(t for t in range(self.n_vocab) if ll.llama_vocab_is_eog(self.vocab, t))
        return self._eog

    def meta(self, key: str) -> Optional[str]:
        buf = ctypes.create_string_buffer(256)
        n = ll.llama_model_meta_val_str(self.ptr, key.encode("utf-8"), buf, len(buf))
        return buf.value.decode("utf-8", errors="replace") if n >= 0 else None


class Context(_Handle):
    """A llama.cpp context over a Model; keeps the model alive as long as it lives.

    `other`: the context whose model's embeddings and output head this one uses
    (`ctx_other`, a draft reading its target's): closing either parent frees this one first."""

    close_order = 1

    def __init__(self, model: Model, params: "ll.llama_context_params", *, other: "Optional[Context]" = None):
        super().__init__()
        self.model = model
        if other is not None:
            params.ctx_other = other.ptr
        ptr = ll.llama_init_from_model(model.ptr, params)
        if not ptr:
            raise LlamaCallError(f"llama.cpp could not create a context for {model.path}")
        self._own(ptr, ll.llama_free)
        self.depend_on(model)
        if other is not None:
            self.depend_on(other)
        self._adopt(ptr)

    @classmethod
    def borrow(cls, model: Model, ptr: int, owner: Any = None) -> "Context":
        """A view of a context someone else created and frees (e.g. a llama_cpp.Llama's);
        `owner`, the llama-cpp-python object that frees it, closes the view (and what depends on
        it: a draft context reading it through ctx_other) first."""
        self = cls.__new__(cls)
        _Handle.__init__(self)
        self.model = model
        self._own(ptr, None)
        self.depend_on(model)
        if owner is not None:
            self.close_with(owner)
        self._adopt(ptr)
        return self

    def _adopt(self, ptr: int) -> None:
        self.memory = ll.llama_get_memory(ptr)
        self.n_ctx = int(ll.llama_n_ctx(ptr))
        self.n_batch = int(ll.llama_n_batch(ptr))
        self.n_ubatch = int(ll.llama_n_ubatch(ptr))

    def on_close(self, fn: Callable[[], None]) -> None:
        """Run `fn` just before the context is freed, by whatever path (e.g. detach a sampler it
        references)."""
        self._cell.hooks.append(fn)

    def _memory(self) -> int:
        if self._cell.ptr is None:  # the cached memory pointer died with the context
            raise RuntimeError("Context is closed")
        return self.memory

    def seq_rm(self, seq_id: int, p0: int, p1: int = -1) -> bool:
        return bool(ll.llama_memory_seq_rm(self._memory(), seq_id, p0, p1))

    def pos_max(self, seq_id: int = 0) -> int:
        return int(ll.llama_memory_seq_pos_max(self._memory(), seq_id))

    def clear(self) -> None:
        ll.llama_memory_clear(self._memory(), True)


class BatchExt(_Handle):
    """A reusable `llama_batch_ext` sized for its context (allocated once, cleared per step)."""

    close_order = 0

    def __init__(self, ctx: Context):
        super().__init__()
        ptr = ll.llama_batch_ext_init(ctx.ptr)
        if not ptr:
            raise LlamaCallError("llama_batch_ext_init failed")
        self._own(ptr, ll.llama_batch_ext_free)
        self.depend_on(ctx)
        self.ctx = ctx
        self.n = 0
        self._pos = (ll.llama_pos * 4)()

    def clear(self) -> None:
        ll.llama_batch_ext_clear(self.ptr)
        self.n = 0

    def add_token(self, token: int, pos: int, output: bool, seq_id: int = 0) -> int:
        idx = ll.llama_batch_ext_add_token(self._ptr, seq_id, token)
        if idx < 0:
            raise LlamaCallError(f"llama_batch_ext_add_token failed ({idx}) for token {token} at {pos}")
        pa = self._pos  # a text token: one position (llama.cpp derives M-RoPE's from it)
        pa[0] = pos
        pa[1] = pa[2] = pa[3] = 0
        ll.llama_batch_ext_set_pos(self._ptr, idx, pa)
        if output:
            ll.llama_batch_ext_set_output_logits(self._ptr, idx, True)
        self.n += 1
        return idx

    def add_embd(self, embd: "ll.llama_embd", pos: int, seq_id: int = 0) -> int:
        idx = ll.llama_batch_ext_add_embd(self._ptr, seq_id, embd)
        if idx < 0:
            raise LlamaCallError(f"llama_batch_ext_add_embd failed ({idx}) at position {pos}")
        pa = self._pos
        pa[0] = pa[1] = pa[2] = pos
        pa[3] = 0
        ll.llama_batch_ext_set_pos(self._ptr, idx, pa)
        self.n += 1
        return idx

    def process(self) -> int:
        """Decode the batch on its context; returns llama.cpp's status code."""
        return int(ll.llama_process(self.ctx.ptr, ll.LLAMA_PROCESS_TYPE_DECODE, self._ptr))


def seq_state(ctx: int) -> bytes:
    """Sequence 0's cache of a context, as llama.cpp serialises it (`llama_state_seq_get_data`)."""
    size = int(ll.llama_state_seq_get_size(ctx, 0))
    buf = (ctypes.c_uint8 * size)()
    n = int(ll.llama_state_seq_get_data(ctx, buf, size, 0))
    if n <= 0:
        raise LlamaCallError("could not read the draft cache state")
    return bytes(buf[:n])


def set_seq_state(ctx: int, data: bytes) -> bool:
    """Load what `seq_state` returned into sequence 0; False if llama.cpp refuses it."""
    buf = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
    return int(ll.llama_state_seq_set_data(ctx, buf, len(data), 0)) > 0


def cpu_has_amx() -> bool:
    """Whether this CPU advertises AMX tiles (Linux only; elsewhere False)."""
    global _amx
    if _amx is None:
        try:
            with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
                _amx = any(line.startswith("flags") and " amx_tile" in line for line in fh)
        except OSError:
            _amx = False
    return _amx


_amx: Optional[bool] = None


def llama_cpp_version() -> str:
    return str(getattr(llama_cpp, "__version__", "unknown"))
