import numpy as np

from llama_dflash.inspect import read_gguf
from llama_dflash.train.data import FeatureCache, build_cache, extract_features
from llama_dflash.train.model import load_target_head


def test_extraction_shapes_and_positions(tiny_target, tmp_path):
    layers = [0, 2]
    cache = build_cache(str(tmp_path / "data"), tiny_target, ["the cat", "a b c d"], target_layers=layers,
                        max_new_tokens=12, progress=False)
    info = read_gguf(tiny_target)
    assert len(cache) == 2 and cache.width == 2 * info.n_embd
    emb, _ = load_target_head(tiny_target)
    for i in range(2):
        toks, feats, plen = cache.get(i)
        assert feats.shape == (len(toks), 2 * info.n_embd) and feats.dtype == np.float16
        assert 0 < plen < len(toks)
        # the input of layer 0 is the token embedding, row by row: positions line up
        np.testing.assert_allclose(feats[:, : info.n_embd].astype(np.float32), emb[toks], rtol=2e-3, atol=2e-3)
    assert cache.n_rows == sum(len(cache.get(i)[0]) for i in range(2))


def test_cache_resumes_and_truncates(tiny_target, tmp_path):
    root = str(tmp_path / "data")
    build_cache(root, tiny_target, ["x y"], target_layers=[1], max_new_tokens=6, progress=False)
    c = build_cache(root, tiny_target, ["x y", "z"], target_layers=[1], max_new_tokens=6, progress=False)
    assert len(c) == 2
    c = build_cache(root, tiny_target, ["x y"], target_layers=[1], max_new_tokens=6, progress=False)
    assert len(c) == 1
    assert len(FeatureCache(root)) == 2


def test_chunked_extraction_matches_single_decode(tiny_target):
    from llama_dflash._llama import Model
    from llama_dflash.config import TargetConfig
    from llama_dflash.target import TargetContext

    m = Model(tiny_target)
    try:
        toks = m.tokenize("the quick brown fox and the lazy dog is")
        a = TargetContext(m, TargetConfig(model=tiny_target, n_ctx=128, n_batch=4, n_ubatch=4), extract_layers=[1, 3])
        b = TargetContext(m, TargetConfig(model=tiny_target, n_ctx=128), extract_layers=[1, 3])
        fa, fb = extract_features(a, toks), extract_features(b, toks)
        a.close(); b.close()
    finally:
        m.close()
    assert fa.shape == fb.shape == (len(toks), 2 * 64)
    np.testing.assert_allclose(fa, fb, rtol=1e-3, atol=1e-3)
