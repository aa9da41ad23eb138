import textwrap

import numpy as np
import pytest

pytest.importorskip("torch")


@pytest.fixture(scope="session")
def tiny_target(tmp_path_factory):
    from llama_dflash.writer import write_tiny_target

    path = str(tmp_path_factory.mktemp("tgt") / "tiny.gguf")
    return write_tiny_target(path, n_embd=64, n_layer=4)


def make_cycle_target(path: str, n_layer: int = 2) -> str:
    """A tiny llama whose greedy continuation is trivially predictable: every layer adds nothing
    (attention output and FFN down are zero), and the head maps the word piece of letter x to
    the one of the next letter (BOS -> 'a'), so greedy text cycles a b c ... z a b ..."""
    from gguf import GGUFReader

    from llama_dflash.writer import tiny_vocab, write_tiny_target

    write_tiny_target(path, n_embd=64, n_layer=n_layer, seed=1)
    tokens = tiny_vocab()[0]
    ids = [tokens.index("\u2581" + chr(c)) for c in range(ord("a"), ord("z") + 1)]
    r = GGUFReader(path, "r+")
    t = {x.name: x for x in r.tensors}
    for name, x in t.items():
        if name.endswith("attn_output.weight") or name.endswith("ffn_down.weight"):
            x.data[...] = 0
    emb = np.array(t["token_embd.weight"].data, dtype=np.float32)
    out = t["output.weight"].data
    out[...] = 0
    for k, src in enumerate(ids):
        out[ids[(k + 1) % 26]] = emb[src] * 4
    out[ids[0]] += emb[1] * 4  # BOS -> 'a'
    r.data.flush()
    del r
    return path


@pytest.fixture(scope="session")
def cycle_target(tmp_path_factory):
    return make_cycle_target(str(tmp_path_factory.mktemp("cyc") / "cycle.gguf"))


@pytest.fixture
def fake_stdlib(tmp_path):
    """A tiny standard library: documented functions in a module and a package, and a test dir."""
    root = tmp_path / "stdlib"
    root.mkdir()
    (root / "alpha.py").write_text(textwrap.dedent('''
        def add_numbers(a, b):
            """Add two numbers and return their sum.

            Works for ints and floats.
            """
            return a + b

        def _private(x):
            """A private helper that is never used as a prompt at all."""
            return x

        def nodoc(x):
            return x
    '''))
    pkg = root / "beta"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "core.py").write_text(textwrap.dedent('''
        class Box:
            def area(self, w, h):
                """Compute the area of a rectangle with width w and height h."""
                return w * h
    '''))
    (root / "test").mkdir()
    (root / "test" / "t.py").write_text('def skipped():\n    """Tests are never a prompt source, skip them."""\n')
    return str(root)
