"""ctypes bindings for the `llama-ext.h` symbols that llama-cpp-python does not bind.

These functions are exported from libllama with C++ linkage, so their symbol names are
mangled and differ between ABIs.  Each one is looked up under several candidate names
(plain, Itanium, MSVC) the first time it is used; a missing symbol raises
:class:`MissingSymbolError` naming the function, instead of failing at import.
"""

from __future__ import annotations

import ctypes
from typing import Any, Callable, Sequence

import llama_cpp
from llama_cpp import llama_cpp as _ll

__all__ = [
    "MissingSymbolError",
    "llama_set_embeddings_layer_inp",
    "llama_get_embeddings_layer_inp",
    "llama_get_embeddings_layer_inp_addr",
    "llama_model_target_layer_ids",
    "llama_model_target_layer_ids_n",
    "llama_model_dflash_selector_top_k",
    "llama_set_embeddings_nextn",
    "llama_get_embeddings_nextn",
    "llama_get_embeddings_nextn_ith",
    "target_layer_ids",
    "check_symbols",
]

_ctx_p = _ll.llama_context_p_ctypes
_model_p = _ll.llama_model_p_ctypes


class MissingSymbolError(RuntimeError):
    """The installed libllama lacks an extension symbol that DFlash needs."""

    def __init__(self, function: str, tried: Sequence[str]):
        self.function = function
        self.tried = tuple(tried)
        super().__init__(
            f"libllama from llama-cpp-python {llama_cpp.__version__} does not export "
            f"'{function}' (tried: {', '.join(tried)}); DFlash needs llama-cpp-python==0.3.36 "
            "or a build whose llama.cpp has the dflash draft architecture"
        )


class _ExtFunction:
    """A lazily resolved C function with several candidate symbol names."""

    def __init__(self, name: str, symbols: Sequence[str], argtypes: list[Any], restype: Any):
        self.name = name
        self.symbols = (name, *symbols)
        self.argtypes = argtypes
        self.restype = restype
        self._fn: Callable[..., Any] | None = None

    def resolve(self) -> Callable[..., Any]:
        if self._fn is None:
            lib = _ll._lib
            for symbol in self.symbols:
                try:
                    # item access makes a function object of our own (attribute access shares
                    # one per symbol, whose restype another binding of the symbol would change)
                    fn = lib[symbol]
                except AttributeError:
                    continue
                else:
                    fn.argtypes = self.argtypes
                    fn.restype = self.restype
                    self._fn = fn
                    break
            else:
                raise MissingSymbolError(self.name, self.symbols)
        return self._fn

    def __call__(self, *args: Any) -> Any:
        return self.resolve()(*args)


_float_p = ctypes.POINTER(ctypes.c_float)

# void llama_set_embeddings_layer_inp(llama_context *, uint32_t il, bool value)
llama_set_embeddings_layer_inp = _ExtFunction(
    "llama_set_embeddings_layer_inp",
    (
        "_Z30llama_set_embeddings_layer_inpP13llama_contextjb",
        "?llama_set_embeddings_layer_inp@@YAXPEAUllama_context@@I_N@Z",
    ),
    [_ctx_p, ctypes.c_uint32, ctypes.c_bool],
    None,
)

# float * llama_get_embeddings_layer_inp(llama_context *, uint32_t il)
llama_get_embeddings_layer_inp = _ExtFunction(
    "llama_get_embeddings_layer_inp",
    (
        "_Z30llama_get_embeddings_layer_inpP13llama_contextj",
        "?llama_get_embeddings_layer_inp@@YAPEAMPEAUllama_context@@I@Z",
    ),
    [_ctx_p, ctypes.c_uint32],
    _float_p,
)

# the same, returning the address as an int (None for NULL): the hot path views it without a cast
llama_get_embeddings_layer_inp_addr = _ExtFunction(
    "llama_get_embeddings_layer_inp",
    llama_get_embeddings_layer_inp.symbols[1:],
    [ctypes.c_void_p, ctypes.c_uint32],
    ctypes.c_void_p,
)

# const int32_t * llama_model_target_layer_ids(const llama_model *)
llama_model_target_layer_ids = _ExtFunction(
    "llama_model_target_layer_ids",
    (
        "_Z28llama_model_target_layer_idsPK11llama_model",
        "?llama_model_target_layer_ids@@YAPEBHPEBUllama_model@@@Z",
    ),
    [_model_p],
    ctypes.POINTER(ctypes.c_int32),
)

# uint32_t llama_model_target_layer_ids_n(const llama_model *)
llama_model_target_layer_ids_n = _ExtFunction(
    "llama_model_target_layer_ids_n",
    (
        "_Z30llama_model_target_layer_ids_nPK11llama_model",
        "?llama_model_target_layer_ids_n@@YAIPEBUllama_model@@@Z",
    ),
    [_model_p],
    ctypes.c_uint32,
)

# int32_t llama_model_dflash_selector_top_k(const llama_model *)
llama_model_dflash_selector_top_k = _ExtFunction(
    "llama_model_dflash_selector_top_k",
    (
        "_Z33llama_model_dflash_selector_top_kPK11llama_model",
        "?llama_model_dflash_selector_top_k@@YAHPEBUllama_model@@@Z",
    ),
    [_model_p],
    ctypes.c_int32,
)

# The next three are bound by llama-cpp-python's llama_cpp_ext; we keep our own lazily
# resolved copies so that a missing symbol is reported the same way as the others.
llama_set_embeddings_nextn = _ExtFunction(
    "llama_set_embeddings_nextn",
    (
        "_Z26llama_set_embeddings_nextnP13llama_contextbb",
        "?llama_set_embeddings_nextn@@YAXPEAUllama_context@@_N1@Z",
    ),
    [_ctx_p, ctypes.c_bool, ctypes.c_bool],
    None,
)

llama_get_embeddings_nextn = _ExtFunction(
    "llama_get_embeddings_nextn",
    (
        "_Z26llama_get_embeddings_nextnP13llama_context",
        "?llama_get_embeddings_nextn@@YAPEAMPEAUllama_context@@@Z",
    ),
    [_ctx_p],
    _float_p,
)

llama_get_embeddings_nextn_ith = _ExtFunction(
    "llama_get_embeddings_nextn_ith",
    (
        "_Z30llama_get_embeddings_nextn_ithP13llama_contexti",
        "?llama_get_embeddings_nextn_ith@@YAPEAMPEAUllama_context@@H@Z",
    ),
    [_ctx_p, ctypes.c_int32],
    _float_p,
)

_ALL = (
    llama_set_embeddings_layer_inp,
    llama_get_embeddings_layer_inp,
    llama_get_embeddings_layer_inp_addr,
    llama_model_target_layer_ids,
    llama_model_target_layer_ids_n,
    llama_model_dflash_selector_top_k,
    llama_set_embeddings_nextn,
    llama_get_embeddings_nextn,
    llama_get_embeddings_nextn_ith,
)


def check_symbols() -> None:
    """Resolve every extension symbol now; raises MissingSymbolError for the first missing one."""
    for fn in _ALL:
        fn.resolve()


def target_layer_ids(model: Any) -> list[int]:
    """The draft model's `dflash.target_layers`, read through llama.cpp."""
    n = int(llama_model_target_layer_ids_n(model))
    if n == 0:
        return []
    ptr = llama_model_target_layer_ids(model)
    return [int(ptr[i]) for i in range(n)]
