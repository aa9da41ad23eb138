"""The equivalence helper (tests/_equivalence.py): exact where the backend promises it; on a GPU
run, a divergence passes only at a near-tie the measured batch/single rounding explains.  The GPU
branch is driven here on any build by declaring the run a device run and fixing the noise."""

from __future__ import annotations

import numpy as np
import pytest

import _equivalence as eq
from conftest import PROMPT_TEXT
from llama_dflash import OrdinaryDecoding, TargetConfig

pytestmark = pytest.mark.gpu  # the helper itself on the build's devices

N = 32


@pytest.fixture(scope="module")
def setup(tiny_target):
    cfg = TargetConfig(tiny_target, n_ctx=256, n_batch=64, n_ubatch=64, n_threads=1, n_gpu_layers=0)
    with OrdinaryDecoding(cfg) as o:
        prompt = o.tokenize(PROMPT_TEXT)
        ref = o.generate(prompt, N, ignore_eos=True).tokens
        rows, eog = eq._score(tiny_target, prompt + ref, 0, cfg.flash_attn, one_by_one=True)
        rows = rows[len(prompt) - 1 : -1].astype(np.float64)
        rows[:, list(eog)] = -np.inf
        order = np.argsort(rows, axis=1)
        gaps = rows[np.arange(N), order[:, -1]] - rows[np.arange(N), order[:, -2]]
        j = int(np.argmin(gaps))  # the nearest tie of the reference
        runner_up = int(order[j, -2])
        cont = o.generate(prompt + ref[:j] + [runner_up], N - j - 1, ignore_eos=True).tokens
    assert (rows.argmax(axis=1) == np.array(ref)).all()
    return {"cfg": cfg, "prompt": prompt, "ref": ref, "j": j, "gap": float(gaps[j]),
            "near_tie": ref[:j] + [runner_up] + cont, "worst": [int(x) for x in order[:, 0]], "eog": eog}


@pytest.fixture()
def on_device(monkeypatch):
    """Treat runs as GPU runs with a given batch/single noise."""
    def use(delta):
        monkeypatch.setattr(eq, "device_run", lambda n_gpu_layers: True)
        monkeypatch.setattr(eq, "measure_noise", lambda batch, single: delta)
    return use


def test_first_divergence():
    assert eq.first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert eq.first_divergence([1, 5, 3], [1, 2, 3]) == 1
    assert eq.first_divergence([1, 2], [1, 2, 3]) == 2


def test_device_layers_follow_the_build():
    assert eq.DEVICE_LAYERS == (-1 if eq.offload_supported() else 0)
    assert eq.device_run(0) is False
    assert eq.device_run(-1) is eq.offload_supported()


def test_identical_passes(setup):
    eq.assert_same_tokens(setup["ref"], list(setup["ref"]), prompt=setup["prompt"], config=setup["cfg"],
                          n_gpu_layers=-1)


def test_exact_where_nothing_is_offloaded(setup):
    got = list(setup["ref"])
    got[5] = setup["worst"][5]
    with pytest.raises(AssertionError, match="first divergence at token 5 .*promises exact identity"):
        eq.assert_same_tokens(got, setup["ref"], prompt=setup["prompt"], config=setup["cfg"])
    with pytest.raises(AssertionError, match=f"first divergence at token {setup['j']} "):
        eq.assert_same_tokens(setup["near_tie"], setup["ref"], prompt=setup["prompt"], config=setup["cfg"])


def test_device_without_noise_is_exact(setup, on_device):
    on_device(0.0)
    with pytest.raises(AssertionError, match="agree bit for bit"):
        eq.assert_same_tokens(setup["near_tie"], setup["ref"], prompt=setup["prompt"], config=setup["cfg"])


def test_device_near_tie_within_the_noise_passes_and_is_reported(setup, on_device):
    assert setup["near_tie"] != setup["ref"] and len(setup["near_tie"]) == N
    on_device(setup["gap"] / eq.NOISE_MARGIN * 1.01)
    with pytest.warns(eq.DivergenceWarning, match=f"first divergence at token {setup['j']} "):
        eq.assert_same_tokens(setup["near_tie"], setup["ref"], prompt=setup["prompt"], config=setup["cfg"])


def test_device_divergence_beyond_the_noise_fails(setup, on_device):
    on_device(setup["gap"] / eq.NOISE_MARGIN * 0.5)
    with pytest.raises(AssertionError, match=f"not explained by batch-shape rounding.*\n  token {setup['j']} "):
        eq.assert_same_tokens(setup["near_tie"], setup["ref"], prompt=setup["prompt"], config=setup["cfg"])


def test_device_far_token_fails(setup, on_device):
    on_device(0.01)
    got = list(setup["ref"])
    got[5] = setup["worst"][5]
    with pytest.raises(AssertionError, match="token 5 "):
        eq.assert_same_tokens(got, setup["ref"], prompt=setup["prompt"], config=setup["cfg"])


def test_device_length_difference_fails(setup, on_device):
    on_device(0.01)
    with pytest.raises(AssertionError, match="different length"):
        eq.assert_same_tokens(setup["ref"][:-1], setup["ref"], prompt=setup["prompt"], config=setup["cfg"])


def test_device_sampled_tokens_need_support(setup, on_device):
    on_device(0.01)
    got = list(setup["ref"])
    got[5] = setup["eog"][0]  # masked by ignore_eos: probability 0
    with pytest.raises(AssertionError, match="token 5 .*probability 0"):
        eq.assert_same_tokens(got, setup["ref"], prompt=setup["prompt"], config=setup["cfg"], temperature=1.0)
    with pytest.warns(eq.DivergenceWarning, match="sampled at T=1.0"):
        eq.assert_same_tokens(setup["near_tie"], setup["ref"], prompt=setup["prompt"], config=setup["cfg"],
                              temperature=1.0)
