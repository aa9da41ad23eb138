"""`llama-dflash train --algorithm eagle3 | simple` end to end, and its refusals (exit 2, one line)."""

import json
import subprocess
import sys

import pytest

from conftest import make_cycle_target
from llama_dflash.inspect import read_gguf
from llama_dflash.train.ar_eval import find_driver
from llama_dflash.writer import write_tiny_target


def _train(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "llama_dflash.cli", "train", *args], capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture(scope="module")
def cycle4(tmp_path_factory):
    """The cycling target with 4 layers: an EAGLE-3 head reads three of them."""
    return make_cycle_target(str(tmp_path_factory.mktemp("cyc4") / "cycle4.gguf"), n_layer=4)


@pytest.fixture(scope="module")
def cycle_prompts(tmp_path_factory):
    p = tmp_path_factory.mktemp("cp") / "p.txt"
    letters = "abcdefghijklmnopqrstuvwxyz"
    p.write_text("\n".join(" ".join(letters[(i + k) % 26] for k in range(3)) for i in range(26)) + "\n")
    return str(p)


def test_eagle3_on_a_predictable_target(cycle4, cycle_prompts, tmp_path):
    """The head learns the cycle; the GGUF is an eagle3 that llama.cpp runs with parity 1.0; the C++
    driver accepts nearly every draft token; the Hugging Face layout is written beside it."""
    out, hf = tmp_path / "e3.gguf", tmp_path / "hf"
    r = _train("--model", cycle4, "--output", str(out), "--prompts", cycle_prompts, "--n-prompts", "24",
               "--eval-prompts", "2", "--max-new-tokens", "40", "--algorithm", "eagle3", "--ttt-steps", "3",
               "--steps", "150", "--batch-size", "4", "--lr", "1e-2", "--threads", "1",
               "--workdir", str(tmp_path / "w"), "--no-progress", "--hf-output", str(hf))
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert rep["algorithm"] == "eagle3" and rep["ttt_steps"] == 3 and rep["target_layers"] == [1, 2, 3]
    assert rep["parity"]["agreement"] == 1.0 and rep["parity"]["slots"] >= 12
    info = read_gguf(str(out))
    assert info.architecture == "eagle3" and info.get("eagle3.target_layers") == [1, 2, 3]
    cfg = json.loads((hf / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"] and cfg["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3]
    assert (hf / "model.safetensors").is_file()
    if find_driver() is None:
        assert "skipped" in rep["eval"]
    else:
        assert rep["eval"]["spec_type"] == "draft-eagle3" and rep["eval"]["prompts"] == 2
        assert min(rep["eval"]["acceptance_per_position"]) >= 0.8, rep["eval"]


def test_eagle3_mix_data_distill_and_proxy(tiny_target, tmp_path):
    """The default data pipeline (mix, several sequences per decode), a reduced head, the target's
    distributions as labels, the held-out proxy with the best checkpoint, q4_0 export."""
    out = tmp_path / "e3.gguf"
    r = _train("--model", tiny_target, "--output", str(out), "--algorithm", "eagle3", "--data-tokens", "300",
               "--eval-seqs", "3", "--n-seq", "4", "--train-vocab", "64", "--distill", "0.5", "--steps", "20",
               "--eval-every", "10", "--batch-size", "2", "--eval-prompts", "2", "--max-new-tokens", "8",
               "--ttt-steps", "2", "--threads", "1", "--workdir", str(tmp_path / "w"), "--no-progress",
               "--quantize", "q4_0")
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert rep["data"] == "mix" and rep["reduced_vocab"] == 64 and rep["distill"]["weight"] == 0.5
    assert len(rep["train"]["evals"]) == 2 and rep["train"]["best_step"] in (10, 20)
    assert len(rep["train"]["evals"][0]["acceptance_per_position"]) == 2
    assert rep["parity"]["slots"] > 0
    from gguf import GGMLQuantizationType as Q
    from gguf import GGUFReader

    t = {x.name: x for x in GGUFReader(str(out), "r").tensors}
    assert len(t["d2t"].data) == 64 and t["blk.0.attn_q.weight"].tensor_type == Q.Q4_0


def test_drafts_of_every_kind_share_one_workdir_each_with_its_own_checkpoint(tiny_target, tmp_path):
    """One data cache serves an EAGLE-3 head, a classic draft and a DSpark draft (--reuse-data); each
    resumes its own checkpoint, and a checkpoint of another shape is a one-line refusal (it was a
    load_state_dict traceback when a simple draft was trained after an EAGLE-3 head)."""
    w = str(tmp_path / "w")
    common = ("--model", tiny_target, "--workdir", w, "--threads", "1", "--no-progress", "--skip-eval",
              "--batch-size", "2")
    r = _train(*common, "--output", str(tmp_path / "unused.gguf"), "--algorithm", "eagle3", "--data-tokens", "200",
               "--eval-seqs", "2", "--n-seq", "4", "--data-only")
    assert r.returncode == 0, r.stderr
    for algo, extra in (("eagle3", ("--ttt-steps", "2", "--train-vocab", "64")), ("simple", ("--draft-layers", "1")),
                        ("dspark", ("--block-size", "4"))):
        r = _train(*common, "--output", str(tmp_path / f"{algo}.gguf"), "--algorithm", algo, "--reuse-data",
                   "--steps", "4", *extra)
        assert r.returncode == 0, (algo, r.stderr)
        assert (tmp_path / "w" / f"checkpoint.{algo}.pt").is_file()
        assert read_gguf(str(tmp_path / f"{algo}.gguf")).architecture == {"eagle3": "eagle3", "simple": "llama",
                                                                         "dspark": "dflash"}[algo]
    r = _train(*common, "--output", str(tmp_path / "dspark2.gguf"), "--algorithm", "dspark", "--reuse-data",
               "--steps", "8", "--block-size", "4", "--draft-layers", "2")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "checkpoint.dspark.pt holds the checkpoint of another draft (layers.1." in r.stderr
    assert "is missing" in r.stderr and "another --workdir" in r.stderr


def test_simple_on_a_predictable_target(cycle_target, cycle_prompts, tmp_path):
    out, hf = tmp_path / "s.gguf", tmp_path / "hf"
    r = _train("--model", cycle_target, "--output", str(out), "--prompts", cycle_prompts, "--n-prompts", "24",
               "--eval-prompts", "2", "--max-new-tokens", "40", "--algorithm", "simple", "--draft-layers", "1",
               "--steps", "40", "--batch-size", "4", "--lr", "3e-3", "--threads", "1", "--train-vocab", "64",
               "--workdir", str(tmp_path / "w"), "--no-progress", "--hf-output", str(hf))
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert rep["copied_layers"] == [1] and rep["parity"]["agreement"] >= 0.99
    info = read_gguf(str(out))
    assert info.architecture == "llama" and info.n_layer == 1 and info.n_vocab == read_gguf(cycle_target).n_vocab
    cfg = json.loads((hf / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"] and (hf / "tokenizer.model").is_file()
    if find_driver() is not None:
        assert rep["eval"]["spec_type"] == "draft-simple"
        assert min(rep["eval"]["acceptance_per_position"]) >= 0.8, rep["eval"]


@pytest.fixture(scope="module")
def qwen3_like(tmp_path_factory):
    return write_tiny_target(str(tmp_path_factory.mktemp("q") / "q.gguf"), arch="qwen3")


@pytest.mark.parametrize("args, says", [
    (["--algorithm", "eagle3", "--target-layers", "1,3"], "exactly 3 target layers"),
    (["--algorithm", "eagle3", "--draft-layers", "2"], "exactly one decoder layer"),
    (["--algorithm", "eagle3", "--ttt-steps", "0"], "--ttt-steps must be in 1..16"),
    (["--algorithm", "eagle3", "--copy-layers", "0"], "are for --algorithm simple"),
    (["--algorithm", "eagle3", "--init-from-target"], "--init-from-target is for dflash/dspark"),
    (["--algorithm", "simple", "--reduce-vocab", "64"], "keeps the target's whole vocabulary"),
    (["--algorithm", "simple", "--copy-layers", "0,1,2"], "3 layers for --draft-layers 2"),
    (["--algorithm", "simple", "--copy-layers", "0,9"], "out of range"),
    (["--algorithm", "simple", "--copy-layers", "0,1", "--random-layers"], "exclude each other"),
    (["--algorithm", "medusa"], "invalid choice"),
])
def test_refusals(tiny_target, tmp_path, args, says):
    r = _train("--model", tiny_target, "--output", str(tmp_path / "o.gguf"), *args, timeout=120)
    assert r.returncode == 2, r.stderr
    assert says in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) <= 2  # argparse prints its usage line before the error
    assert not (tmp_path / "o.gguf").exists()


def test_simple_refuses_to_copy_other_architectures(qwen3_like, tmp_path):
    r = _train("--model", qwen3_like, "--output", str(tmp_path / "o.gguf"), "--algorithm", "simple", timeout=120)
    assert r.returncode == 2 and "copies llama layers" in r.stderr and "--random-layers" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_export_requantizes_and_writes_the_hf_layout(tiny_target, tmp_path):
    """`llama-dflash export` on an EAGLE-3 head: q4_0 weights (d2t kept), the Hugging Face layout with
    the target directory the converter needs; --reduce-vocab is a one-line refusal."""
    from gguf import GGMLQuantizationType as Q
    from gguf import GGUFReader

    from llama_dflash.train.arwriter import write_eagle3
    from llama_dflash.train.eagle3 import Eagle3Model, Eagle3Shape
    from llama_dflash.train.model import load_target_head

    emb, head = load_target_head(tiny_target)
    shape = Eagle3Shape(n_embd=64, n_head=4, n_head_kv=2, n_ff=128, target_layers=[1, 2, 3])
    m = Eagle3Model(shape, emb, head, vocab=list(range(0, 316, 2)))
    src = write_eagle3(str(tmp_path / "e3.gguf"), shape, m.export_weights(), tokenizer_from=tiny_target)

    def export(*a):
        return subprocess.run([sys.executable, "-m", "llama_dflash.cli", "export", *a], capture_output=True,
                              text=True, timeout=120)

    out, hf, tdir = tmp_path / "q4.gguf", tmp_path / "hf", tmp_path / "tdir"
    r = export(src, str(out), "--model", tiny_target, "--quantize", "q4_0", "--hf-output", str(hf),
               "--hf-target-dir", str(tdir))
    assert r.returncode == 0, r.stderr
    t = {x.name: x for x in GGUFReader(str(out), "r").tensors}
    assert t["blk.0.attn_q.weight"].tensor_type == Q.Q4_0 and len(t["d2t"].data) == 158
    assert read_gguf(str(out)).architecture == "eagle3"
    cfg = json.loads((hf / "config.json").read_text())
    assert cfg["draft_vocab_size"] == 158 and (tdir / "config.json").is_file()
    r = export(src, str(tmp_path / "x.gguf"), "--model", tiny_target, "--reduce-vocab", "10")
    assert r.returncode == 2 and "--train-vocab" in r.stderr and len(r.stderr.strip().splitlines()) == 1
