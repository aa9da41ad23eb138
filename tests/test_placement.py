"""Where the weights go: `Placement` (llama.cpp's device rules), `Model`'s split_mode / main_gpu /
tensor_split, and the drop-in's draft placement (it follows the target unless told otherwise;
a `PlacementWarning` names target and draft on different devices).

The device logic is checked with a given number of GPUs, so it means the same on any build; the
loads run on this build's devices (on a GPU build `eq.DEVICE_LAYERS` offloads them)."""

from __future__ import annotations

import warnings

import llama_cpp
import pytest
from llama_cpp import llama_cpp as ll

import _equivalence as eq
from llama_dflash import SpecConfig
from llama_dflash import highlevel as hl
from llama_dflash._llama import Model, Placement, placement_defaults
from llama_dflash.config import SPLIT_MODE_NAMES, split_mode_value
from llama_dflash.highlevel import Llama, PlacementWarning, draft_placement, placement_warning

pytestmark = pytest.mark.gpu

KW = dict(n_ctx=256, n_batch=64, n_ubatch=64, n_threads=1, verbose=False)
NONE, LAYER, ROW = SPLIT_MODE_NAMES["none"], SPLIT_MODE_NAMES["layer"], SPLIT_MODE_NAMES["row"]


# ---- Placement: llama.cpp's rules for which devices a model's weights use ------------------------
def test_llama_cpp_python_all_layers_reads_as_minus_one():
    assert Placement(0x7FFFFFFF).n_gpu_layers == -1
    assert Placement(-1) == Placement(0x7FFFFFFF)
    assert Placement(12).n_gpu_layers == 12


@pytest.mark.parametrize("placement,n_gpus,devices", [
    (Placement(0), 0, {"CPU"}),
    (Placement(0), 2, {"CPU"}),  # nothing offloaded
    (Placement(-1), 0, {"CPU"}),  # a CPU-only build
    (Placement(-1), 1, {0}),
    (Placement(3), 1, {0}),  # partly offloaded: the output head goes to the GPU first
    (Placement(-1), 2, {0, 1}),  # layer split over both
    (Placement(-1, ROW), 2, {0, 1}),
    (Placement(-1, LAYER, 0, (0.0, 1.0)), 2, {1}),  # a zero share: no layer there
    (Placement(-1, LAYER, 0, (1.0,)), 3, {0}),  # shares past the list are zero
    (Placement(-1, LAYER, 0, (0.0, 0.0)), 2, {0, 1}),  # all zero: llama.cpp's default split
    (Placement(-1, NONE, 1), 2, {1}),  # split mode none: main_gpu only
    (Placement(-1, NONE, -1), 2, {"CPU"}),  # none with main_gpu -1: no GPU at all
])
def test_devices(placement, n_gpus, devices):
    assert placement.devices(n_gpus) == frozenset(devices)
    assert placement.offloads == (placement.n_gpu_layers != 0 and placement.main_gpu >= 0)


# ---- the draft follows the target -----------------------------------------------------------------
def test_draft_follows_the_target_by_default():
    spec = SpecConfig("d.gguf")
    assert spec.draft_n_gpu_layers == "auto" and spec.draft_split_mode is None and spec.draft_main_gpu is None
    cpu = Placement(0, LAYER, 0, None)
    assert draft_placement(spec, cpu) == cpu  # llama_cpp.Llama's default: everything on the CPU
    for target in (Placement(-1, ROW, 1, (1.0, 3.0)), Placement(5, LAYER, 0, (2.0, 1.0)), Placement(0x7FFFFFFF)):
        d = draft_placement(spec, target)
        # any offloaded layer puts the target's output head (read by the draft) on a GPU: all draft layers go
        assert d == Placement(-1, target.split_mode, target.main_gpu, target.tensor_split)
        for n_gpus in (0, 1, 2, 4):
            assert placement_warning(target, d, n_gpus) is None


def test_draft_placement_told_otherwise():
    target = Placement(-1, LAYER, 0, (1.0, 1.0))
    pinned = draft_placement(SpecConfig("d.gguf", draft_split_mode="none", draft_main_gpu=1), target)
    assert pinned == Placement(-1, NONE, 1, (1.0, 1.0))
    assert draft_placement(SpecConfig("d.gguf", draft_n_gpu_layers=0), target).n_gpu_layers == 0
    assert draft_placement(SpecConfig("d.gguf", draft_n_gpu_layers="all"), Placement(0)).n_gpu_layers == -1
    assert draft_placement(SpecConfig("d.gguf", draft_n_gpu_layers=7), Placement(0)).n_gpu_layers == 7
    assert draft_placement(SpecConfig("d.gguf", draft_split_mode=ROW), target).split_mode == ROW


# ---- the warning ------------------------------------------------------------------------------------
def test_no_warning_without_gpus():
    for target, draft in ((Placement(0), Placement(-1)), (Placement(-1), Placement(0)),
                          (Placement(-1), Placement(-1, NONE, 3))):
        assert placement_warning(target, draft, 0) is None


def test_warning_names_the_devices():
    msg = placement_warning(Placement(0), Placement(-1), 1)
    assert msg is not None
    assert "target model sits on the CPU" in msg and "draft model on GPU 0" in msg
    assert "n_gpu_layers=0" in msg and "draft_n_gpu_layers=-1" in msg and "ctx_other" in msg
    msg = placement_warning(Placement(-1), Placement(0), 1)
    assert "target model sits on GPU 0" in msg and "draft model on the CPU" in msg
    msg = placement_warning(Placement(-1), Placement(-1, NONE, 1), 2)
    assert "target model sits on GPUs 0, 1" in msg and "draft model on GPU 1" in msg
    assert "split_mode=0, main_gpu=1" in msg
    # same device: no warning, however it was asked for
    assert placement_warning(Placement(-1, NONE, 1), Placement(-1, LAYER, 0, (0.0, 1.0)), 2) is None
    assert placement_warning(Placement(-1), Placement(-1, NONE, 0), 1) is None


def test_gpu_count_is_the_builds():
    from llama_dflash.bench.backend import backend_info

    info = backend_info()
    assert hl._gpu_count() == (len(info.gpus) if info.gpu_offload else 0)
    assert (hl._gpu_count() > 0) == eq.offload_supported()


# ---- SpecConfig validation ---------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs,needle", [
    ({"draft_split_mode": "diagonal"}, "draft_split_mode must be one of none, layer, row, tensor or 0..3"),
    ({"draft_split_mode": 4}, "draft_split_mode must be in 0..3"),
    ({"draft_split_mode": -1}, "draft_split_mode must be in 0..3"),
    ({"draft_split_mode": True}, "draft_split_mode must be an integer"),
    ({"draft_split_mode": 1.0}, "draft_split_mode must be an integer"),
    ({"draft_main_gpu": -2}, "draft_main_gpu must be >= -1"),
    ({"draft_main_gpu": "1"}, "draft_main_gpu must be an integer"),
    ({"draft_main_gpu": 0.5}, "draft_main_gpu must be an integer"),
    ({"draft_n_gpu_layers": "some"}, "draft_n_gpu_layers must be an integer >= -1, 'all' or 'auto'"),
])
def test_spec_config_rejects_bad_placement(kwargs, needle):
    with pytest.raises(ValueError, match=needle.replace(".", r"\.")):
        SpecConfig("d.gguf", **kwargs)


def test_split_mode_by_name_or_value():
    assert [split_mode_value("x", n) for n in ("none", "Layer", " row ", "TENSOR")] == [0, 1, 2, 3]
    assert [split_mode_value("x", v) for v in range(4)] == [0, 1, 2, 3]
    assert SpecConfig("d.gguf", draft_split_mode="row", draft_main_gpu=-1).draft_split_mode == ROW
    # the names are llama.cpp's values
    assert (ll.LLAMA_SPLIT_MODE_NONE, ll.LLAMA_SPLIT_MODE_LAYER, ll.LLAMA_SPLIT_MODE_ROW) == (NONE, LAYER, ROW)


# ---- Model hands the placement to llama.cpp ----------------------------------------------------------
@pytest.fixture()
def loads(monkeypatch):
    """The placement fields of every llama_model_load_from_file call (the real load still runs)."""
    seen: list[dict] = []
    real = ll.llama_model_load_from_file

    def spy(path, params):
        shares = None
        if params.tensor_split:
            shares = tuple(round(params.tensor_split[i], 6) for i in range(int(ll.llama_max_devices())))
        seen.append(dict(path=path.decode(), n_gpu_layers=params.n_gpu_layers, split_mode=params.split_mode,
                         main_gpu=params.main_gpu, tensor_split=shares))
        return real(path, params)

    monkeypatch.setattr(ll, "llama_model_load_from_file", spy)
    return seen


def _shares(*head: float) -> tuple:
    return tuple(head) + (0.0,) * (int(ll.llama_max_devices()) - len(head))


def test_model_passes_the_placement_to_llama_cpp(tiny_target, loads):
    ngl = eq.DEVICE_LAYERS
    with Model(tiny_target, n_gpu_layers=ngl, split_mode=ROW, main_gpu=0, tensor_split=[0.75, 0.25]) as m:
        assert m.placement == Placement(ngl, ROW, 0, (0.75, 0.25))
        assert m.n_vocab > 0
    with Model(tiny_target, n_gpu_layers=ngl, split_mode=NONE, main_gpu=-1) as m:
        assert m.placement == Placement(ngl, NONE, -1, None) and not m.placement.offloads
    with Model(tiny_target, n_gpu_layers=0) as m:  # llama.cpp's defaults otherwise
        assert m.placement == Placement(0, LAYER, 0, None)
    assert [(x["n_gpu_layers"], x["split_mode"], x["main_gpu"], x["tensor_split"]) for x in loads] == [
        (0x7FFFFFFF if ngl < 0 else ngl, ROW, 0, _shares(0.75, 0.25)),
        (0x7FFFFFFF if ngl < 0 else ngl, NONE, -1, None),
        (0, LAYER, 0, None),
    ]


def test_placement_defaults_apply_inside_the_block_only(tiny_target, loads):
    with placement_defaults(NONE, -1, (1.0,)):
        with Model(tiny_target, n_gpu_layers=0) as m:
            assert m.placement == Placement(0, NONE, -1, (1.0,))
        with Model(tiny_target, n_gpu_layers=0, split_mode=LAYER, main_gpu=0) as m:  # the caller's win
            assert m.placement == Placement(0, LAYER, 0, (1.0,))
    with Model(tiny_target, n_gpu_layers=0) as m:
        assert m.placement == Placement(0, LAYER, 0, None)
    assert [x["split_mode"] for x in loads] == [NONE, LAYER, LAYER]
    assert [x["tensor_split"] for x in loads] == [_shares(1.0), _shares(1.0), None]


@pytest.mark.parametrize("shares", [[-0.5, 1.0], [float("nan")], [1.0] * 17])
def test_bad_tensor_split_is_refused_before_loading(tiny_target, loads, shares):
    with pytest.raises(ValueError, match="tensor_split must hold at most"):
        Model(tiny_target, n_gpu_layers=0, tensor_split=shares)
    assert loads == []


# ---- the drop-in -------------------------------------------------------------------------------------------
def _completion(llm) -> str:
    return llm.create_completion("the dog", max_tokens=16, temperature=0)["choices"][0]["text"]


def _greedy(llm, n: int = 24) -> tuple[list[int], list[int]]:
    prompt = llm.tokenize(b"the dog")
    g = llm.generate(prompt, temp=0)
    out = [next(g) for _ in range(n)]
    g.close()
    return prompt, out


def test_drop_in_draft_follows_the_target(tiny_target, tiny_draft, loads):
    ngl = eq.DEVICE_LAYERS
    ref = llama_cpp.Llama(tiny_target, n_gpu_layers=ngl, **KW)
    prompt, expected = _greedy(ref)
    ref.close()
    loads.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("error", PlacementWarning)
        llm = Llama(tiny_target, speculative=SpecConfig(tiny_draft, draft_n_max=4), n_gpu_layers=ngl,
                    split_mode=ROW, main_gpu=0, tensor_split=[1.0], **KW)
    try:
        target = Placement(ngl, ROW, 0, (1.0,))
        assert llm.placement == {"target": target, "draft": Placement(ngl, ROW, 0, (1.0,))}
        assert [x["path"] for x in loads] == [tiny_target, tiny_draft]
        assert loads[0] | {"path": tiny_draft} == loads[1]  # the draft was loaded as the target
        # spec output vs ordinary llama_cpp.Llama: exact where the backend promises it
        got_prompt, got = _greedy(llm)
        assert got_prompt == prompt
        eq.assert_same_tokens(got, expected, prompt=prompt, model=tiny_target, n_gpu_layers=ngl,
                              what="drop-in with the target's placement")
        assert llm.speculator.stats.verification_steps > 0
    finally:
        llm.close()


def test_drop_in_draft_told_otherwise(tiny_target, tiny_draft, loads):
    spec = SpecConfig(tiny_draft, draft_n_max=4, draft_split_mode="none", draft_main_gpu=-1,
                      draft_n_gpu_layers=eq.DEVICE_LAYERS)
    with warnings.catch_warnings():
        # the target offloads nothing, the draft asks for GPU layers but main_gpu -1: both on the CPU
        warnings.simplefilter("error", PlacementWarning)
        llm = Llama(tiny_target, speculative=spec, **KW)
    try:
        assert llm.placement["target"] == Placement(0, LAYER, 0, None)
        assert llm.placement["draft"] == Placement(eq.DEVICE_LAYERS, NONE, -1, None)
        assert [(x["split_mode"], x["main_gpu"]) for x in loads[-1:]] == [(NONE, -1)]
        ref = llama_cpp.Llama(tiny_target, **KW)
        assert _completion(llm) == _completion(ref)  # all on the CPU: exact
        ref.close()
    finally:
        llm.close()
    plain = Llama(tiny_target, **KW)
    try:
        assert plain.placement == {"target": Placement(0, LAYER, 0, None), "draft": None}
    finally:
        plain.close()


def test_drop_in_warns_when_target_and_draft_are_apart(tiny_target, tiny_draft, monkeypatch):
    """A machine with one GPU (as far as the warning knows): target on the CPU, draft told -1."""
    monkeypatch.setattr(hl, "_gpu_count", lambda: 1)
    with pytest.warns(PlacementWarning, match="target model sits on the CPU .* draft model on GPU 0"):
        llm = Llama(tiny_target, speculative=SpecConfig(tiny_draft, draft_n_gpu_layers=-1), **KW)
    llm.close()
    with warnings.catch_warnings():
        warnings.simplefilter("error", PlacementWarning)
        Llama(tiny_target, speculative=SpecConfig(tiny_draft), **KW).close()  # "auto": no warning
    monkeypatch.undo()
    if not eq.offload_supported():  # this build: nothing to warn about, whatever is asked
        with warnings.catch_warnings():
            warnings.simplefilter("error", PlacementWarning)
            Llama(tiny_target, speculative=SpecConfig(tiny_draft, draft_n_gpu_layers=-1), **KW).close()
