import json
import os
import subprocess
import sys

import pytest

from llama_dflash.writer import write_tiny_target


def _train(*args, timeout=180):
    return subprocess.run([sys.executable, "-m", "llama_dflash.cli", "train", *args], capture_output=True,
                          text=True, timeout=timeout)


def test_trained_draft_on_predictable_target_reaches_high_acceptance(cycle_target, tmp_path):
    prompts = tmp_path / "p.txt"
    letters = "abcdefghijklmnopqrstuvwxyz"
    prompts.write_text("\n".join(" ".join(letters[(i + k) % 26] for k in range(3)) for i in range(26)) + "\n")
    out = tmp_path / "draft.gguf"
    r = _train("--model", cycle_target, "--output", str(out), "--prompts", str(prompts), "--n-prompts", "24",
               "--eval-prompts", "2", "--max-new-tokens", "40", "--block-size", "4", "--steps", "300",
               "--batch-size", "4", "--anchors-per-seq", "8", "--lr", "1e-2", "--threads", "1",
               "--workdir", str(tmp_path / "w"), "--no-progress")
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert out.is_file()
    assert rep["parity"]["agreement"] >= 0.99
    acc = rep["eval"]["acceptance_per_position"]
    assert len(acc) == 3 and min(acc) >= 0.85, rep["eval"]
    assert rep["eval"]["accepted_per_step"] >= 2.3
    assert rep["eval"]["tau"] == rep["eval"]["mean_accepted_length"] == pytest.approx(1 + rep["eval"]["accepted_per_step"])
    assert json.load(open(tmp_path / "w" / "report.json"))["mask_token"] == "<mask>"


@pytest.fixture(scope="module")
def gemma_like(tmp_path_factory):
    return write_tiny_target(str(tmp_path_factory.mktemp("g") / "g.gguf"), arch="gemma3")


def test_unsupported_target(gemma_like, tmp_path):
    r = _train("--model", gemma_like, "--output", str(tmp_path / "o.gguf"))
    assert r.returncode == 2 and "gemma3" in r.stderr and "Traceback" not in r.stderr


def test_layer_out_of_range(tiny_target, tmp_path):
    r = _train("--model", tiny_target, "--output", str(tmp_path / "o.gguf"), "--target-layers", "1,9")
    assert r.returncode == 2 and "out of range" in r.stderr and "Traceback" not in r.stderr


def test_empty_prompt_file(tiny_target, tmp_path):
    p = tmp_path / "empty.txt"
    p.write_text("\n\n")
    r = _train("--model", tiny_target, "--output", str(tmp_path / "o.gguf"), "--prompts", str(p))
    assert r.returncode == 2 and "no prompts" in r.stderr


def test_unwritable_output(tiny_target, tmp_path):
    f = tmp_path / "file.txt"
    f.write_text("x")
    r = _train("--model", tiny_target, "--output", str(f / "o.gguf"))
    assert r.returncode == 2 and "not writable" in r.stderr
    r = _train("--model", tiny_target, "--output", str(tmp_path))
    assert r.returncode == 2 and "directory" in r.stderr


def test_mixed_data_reduced_vocab_early_stopping_end_to_end(tiny_target, tmp_path):
    """The default data (--data mix), a reduced training vocabulary, held-out proxy evaluation and
    the engine evaluation on held-out prompts, through the CLI; a second run resumes."""
    out = tmp_path / "draft.gguf"
    args = ["--model", tiny_target, "--output", str(out), "--data-tokens", "300", "--eval-seqs", "3", "--n-seq", "4",
            "--train-vocab", "64", "--steps", "20", "--eval-every", "10", "--patience", "2", "--block-size", "4",
            "--batch-size", "2", "--anchors-per-seq", "4", "--eval-prompts", "2", "--max-new-tokens", "8",
            "--eval-draft-tokens", "2", "--threads", "1", "--workdir", str(tmp_path / "w"), "--no-progress"]
    r = _train(*args)
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert rep["data"] == "mix" and rep["reduced_vocab"] == 64 and rep["eval_sequences"] == 3
    assert rep["train_answer_tokens"] >= 300
    assert rep["parity"]["agreement"] >= 0.9  # a barely trained draft has near ties (test_train_loop checks parity)
    assert len(rep["train"]["evals"]) == 2 and rep["train"]["best_step"] in (10, 20)
    assert len(rep["eval"]["acceptance_per_position"]) == 2 and rep["eval"]["prompts"] == 2
    r2 = _train(*args)  # everything cached: no new data, no new steps
    assert r2.returncode == 0, r2.stderr
    rep2 = json.loads(r2.stdout)
    assert rep2["sequences"] == rep["sequences"] and rep2["train"]["best_step"] == rep["train"]["best_step"]


def test_mix_refuses_a_prompt_file(tiny_target, tmp_path):
    p = tmp_path / "p.txt"
    p.write_text("hello\n")
    r = _train("--model", tiny_target, "--output", str(tmp_path / "d.gguf"), "--data", "mix", "--prompts", str(p))
    assert r.returncode == 2 and "--prompts" in r.stderr
