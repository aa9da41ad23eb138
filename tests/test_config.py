import pytest

from llama_dflash import SpecConfig, TargetConfig


@pytest.mark.parametrize("kwargs,needle", [
    ({"algorithm": "eagle"}, "algorithm must be one of"),
    ({"draft_n_max": 0}, "draft_n_max must be >= 1"),
    ({"draft_n_max": 2.5}, "draft_n_max must be an integer"),
    ({"draft_n_min": -1}, "draft_n_min must be >= 0"),
    ({"draft_n_min": 5, "draft_n_max": 3}, "must not exceed draft_n_max"),
    ({"draft_p_min": -0.1}, "draft_p_min must be in [0, 1]"),
    ({"draft_p_min": "high"}, "draft_p_min must be a number"),
    ({"backend_sampling": "yes"}, "backend_sampling must be True, False or 'auto'"),
    ({"draft_n_threads": 0}, "draft_n_threads must be >= 1"),
    ({"draft_n_gpu_layers": -2}, "draft_n_gpu_layers must be >= -1"),
])
def test_spec_config_rejects(kwargs, needle):
    with pytest.raises(ValueError, match=needle.replace("[", r"\[").replace("]", r"\]")):
        SpecConfig("draft.gguf", **kwargs)


def test_spec_config_requires_path():
    with pytest.raises(ValueError, match="draft_model must be a path"):
        SpecConfig("")


@pytest.mark.parametrize("kwargs,needle", [
    ({"n_ctx": 4}, "n_ctx must be >= 16"),
    ({"n_batch": 0}, "n_batch must be >= 1"),
    ({"n_ubatch": 1024, "n_batch": 512}, "must not exceed n_batch"),
    ({"n_threads": 0}, "n_threads must be >= 1"),
])
def test_target_config_rejects(kwargs, needle):
    with pytest.raises(ValueError, match=needle):
        TargetConfig("t.gguf", **kwargs)


def test_defaults_are_valid():
    s = SpecConfig("d.gguf")
    assert (s.algorithm, s.draft_n_max, s.draft_p_min, s.backend_sampling) == ("auto", 7, 0.0, "auto")
