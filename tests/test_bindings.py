import pytest

from llama_dflash import _bindings as ext
from llama_dflash._llama import Model
from llama_dflash.inspect import read_gguf


def test_all_extension_symbols_resolve():
    ext.check_symbols()


def test_missing_symbol_names_the_function():
    fn = ext._ExtFunction("llama_not_a_real_function", ("_Z99nothing",), [], None)
    with pytest.raises(ext.MissingSymbolError) as exc:
        fn()
    assert "llama_not_a_real_function" in str(exc.value) and "_Z99nothing" in str(exc.value)


def test_target_layer_ids_through_llama_cpp(tiny_draft):
    with Model(tiny_draft) as m:
        assert ext.target_layer_ids(m.ptr) == read_gguf(tiny_draft).get("dflash.target_layers")
        assert ext.llama_model_dflash_selector_top_k(m.ptr) == 0
