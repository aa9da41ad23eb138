"""bench/gpu_kit.py (`make gpu-kit`): the trimmed llama-cpp-python source, the wheels the device
image lacks, the model in pieces, and every device call under the 64 MiB it may carry.

The install from the kit with no index is exercised by the plan's CPU rehearsal
(test_gpu_plan_rehearsal.py), which runs step 1 on it.
"""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from gpu_kit_helpers import ROOT, host_python, kit_for, load_gpu_kit

kit = load_gpu_kit()
MIB = 1 << 20


# ---- what the trimmed source keeps ------------------------------------------------------------------

@pytest.mark.parametrize("rel, kept", [
    ("CMakeLists.txt", True),
    ("pyproject.toml", True),
    ("llama_cpp/llama.py", True),
    ("vendor/llama.cpp/CMakeLists.txt", True),
    ("vendor/llama.cpp/ggml/src/ggml-cuda/fattn.cu", True),
    ("vendor/llama.cpp/ggml/src/ggml-cuda/template-instances/mmq-instance-q4_0.cu", True),
    ("vendor/llama.cpp/ggml/src/ggml-cpu/ggml-cpu.c", True),
    ("vendor/llama.cpp/ggml/src/ggml.c", True),
    ("vendor/llama.cpp/src/models/dflash.cpp", True),
    ("vendor/llama.cpp/common/speculative.cpp", True),
    ("vendor/llama.cpp/examples/speculative-simple/speculative-simple.cpp", True),
    ("vendor/llama.cpp/tools/mtmd/CMakeLists.txt", True),
    ("vendor/llama.cpp/vendor/nlohmann/json.hpp", True),
    ("vendor/llama.cpp/models/ggml-vocab-llama-bpe.gguf", False),
    ("vendor/llama.cpp/docs/build.md", False),
    ("vendor/llama.cpp/tests/test-backend-ops.cpp", False),
    ("vendor/llama.cpp/tools/server/server.cpp", False),
    ("vendor/llama.cpp/tools/CMakeLists.txt", False),
    ("vendor/llama.cpp/ggml/src/ggml-vulkan/ggml-vulkan.cpp", False),
    ("vendor/llama.cpp/ggml/src/ggml-metal/ggml-metal.m", False),
    ("vendor/llama.cpp/ggml/src/ggml-hip/CMakeLists.txt", False),
    ("vendor/llama.cpp/convert_hf_to_gguf.py", False),
    ("docs/index.md", False),
    ("tests/test_llama.py", False),
])
def test_keep_member(rel, kept):
    assert kit.keep_member(rel) is kept


def _fake_sdist(path: Path, top: str = "llama_cpp_python-0.3.36") -> None:
    files = {"pyproject.toml": b"[project]\n", "vendor/llama.cpp/src/llama.cpp": b"int x;\n",
             "vendor/llama.cpp/models/vocab.gguf": b"\0" * 1000, "docs/a.md": b"doc"}
    with tarfile.open(path, "w:gz") as t:
        for rel, data in files.items():
            info = tarfile.TarInfo(f"{top}/{rel}")
            info.size, info.mtime = len(data), 1_700_000_000
            t.addfile(info, io.BytesIO(data))


def test_trim_sdist_keeps_the_build_and_is_deterministic(tmp_path):
    src = tmp_path / "src.tar.gz"
    _fake_sdist(src)
    a, b = tmp_path / "a" / "x.tar.gz", tmp_path / "b" / "x.tar.gz"
    stats = kit.trim_sdist(src, a)
    kit.trim_sdist(src, b)
    assert a.read_bytes() == b.read_bytes()
    with tarfile.open(a) as t:
        assert sorted(t.getnames()) == ["llama_cpp_python-0.3.36/pyproject.toml",
                                        "llama_cpp_python-0.3.36/vendor/llama.cpp/src/llama.cpp"]
    assert stats["kept_files"] == 2 and stats["dropped_files"] == 2 and stats["dropped_bytes"] == 1003


def test_trim_sdist_refuses_another_archive(tmp_path):
    src = tmp_path / "other.tar.gz"
    _fake_sdist(src, top="something-else-1.0")
    with pytest.raises(kit.KitError, match="not llama-cpp-python 0.3.36's sdist"):
        kit.trim_sdist(src, tmp_path / "out.tar.gz")


def test_get_sdist_checks_the_checksum(tmp_path):
    src = tmp_path / kit.SDIST_NAME
    _fake_sdist(src)
    with pytest.raises(kit.KitError, match="is not llama-cpp-python 0.3.36's sdist"):
        kit.get_sdist(str(src))
    with pytest.raises(kit.KitError, match="no such file"):
        kit.get_sdist(str(tmp_path / "missing.tar.gz"))


# ---- the model's pieces ------------------------------------------------------------------------------

@pytest.mark.parametrize("total, first, piece, room", [
    (98_362_432, 34 * MIB, 30 * MIB, 43 * MIB), (100, 0, 30, 60), (100, 10, 200, 200), (100, 200, 30, 60),
    (101, 100, 100, 100), (5, 3, 1, 2),
])
def test_split_sizes(total, first, piece, room):
    groups = kit.split_sizes(total, first, piece, room)
    assert sum(map(sum, groups)) == total
    assert all(0 < n <= piece for g in groups for n in g)
    assert sum(groups[0]) <= max(first, 0) and all(sum(g) <= room for g in groups[1:])
    # as few calls as the room allows
    n, cap = 1, max(first, 0)
    while cap < total:
        n, cap = n + 1, cap + room
    assert len(groups) == n


def test_split_sizes_refuses_no_room():
    with pytest.raises(kit.KitError):
        kit.split_sizes(100, 10, 0, 50)


def test_split_and_assemble_round_trip(tmp_path):
    src = tmp_path / "model.bin"
    src.write_bytes(bytes(range(256)) * 40)
    parts = [tmp_path / f"p{i}" for i in range(3)]
    kit.split_file(src, [4000, 5000, 1240], parts)
    assert [p.stat().st_size for p in parts] == [4000, 5000, 1240]
    kit.assemble(parts, tmp_path / "back.bin", kit.sha256(src))
    assert (tmp_path / "back.bin").read_bytes() == src.read_bytes()
    with pytest.raises(kit.KitError, match="sha256"):
        kit.assemble(parts[::-1], tmp_path / "bad.bin", kit.sha256(src))
    assert not (tmp_path / "bad.bin").exists()


# ---- which wheels ship -------------------------------------------------------------------------------

def _item(name, version, requires=(), requested=False, extras=()):
    return {"metadata": {"name": name, "version": version, "requires_dist": list(requires)},
            "requested": requested, "requested_extras": list(extras)}


def test_needed_stops_at_what_the_device_has_and_walks_the_build_tools():
    report = [
        _item("llama-dflash", "0.1.0", ["numpy>=1.24", "gguf>=0.10", "llama-cpp-python==0.3.36",
                                        "fastapi; extra == 'server'", "torch==2.13.0; extra == 'train'",
                                        "tomli; python_version < '3.11'"], requested=True, extras=["server"]),
        _item("numpy", "2.0"), _item("gguf", "0.19", ["numpy", "pyyaml"]), _item("pyyaml", "6"),
        _item("llama-cpp-python", "0.3.36", ["diskcache", "jinja2"]), _item("diskcache", "5"),
        _item("jinja2", "3", ["markupsafe-never-shipped"]), _item("fastapi", "1", ["starlette"]),
        _item("starlette", "1"), _item("torch", "2.13"), _item("tomli", "2"),
        _item("scikit-build-core", "1.1", ["packaging", "pathspec"], requested=True),
        _item("packaging", "26"), _item("pathspec", "1"),
    ]
    rows = {r["name"]: r["why"] for r in kit.needed(report, {"numpy", "jinja2", "pyyaml", "packaging", "pathspec",
                                                             "scikit-build-core"}, "3.12")}
    shipped = {n for n, why in rows.items() if why.startswith("shipped")}
    assert shipped == {"gguf", "diskcache", "fastapi", "starlette", "scikit-build-core", "packaging", "pathspec"}
    assert rows["numpy"] == rows["jinja2"] == "on the device image"
    assert "markupsafe-never-shipped" not in rows  # the device's jinja2 comes with its own needs
    assert "torch" not in rows  # the train extra was not asked for
    assert "tomli" not in rows  # python 3.12: no tomli
    assert rows["llama-cpp-python"].startswith("built on the device")


def test_device_packages_list():
    names, python = kit.device_packages()
    assert python == "3.12"
    assert {"torch", "numpy", "pytest", "jinja2", "scikit-build-core", "cmake", "ninja"} <= names
    assert "diskcache" not in names and "gguf" not in names


# ---- the kit itself ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def gpu_kit_device():
    """The kit exactly as `make gpu-kit` makes it for the device (CPython 3.12 wheels)."""
    return kit_for(kit.device_packages()[1])


@pytest.fixture(scope="module")
def gpu_kit_host():
    """A kit whose binary wheels are for THIS interpreter: installable here, as the device's is there."""
    return kit_for(host_python())


def _check_kit(out: Path, manifest: dict, python: str) -> None:
    assert manifest["python"] == python
    tree = kit.tree_bytes(ROOT)
    assert abs(manifest["tree_bytes"] - tree) < 2 * MIB  # measured from this tree
    calls = manifest["calls"]
    # the source and wheels, then the model over the plan's three calls (one script each)
    assert len(calls) == kit.PLAN_CALLS == 3
    for c in calls:
        carried = kit.dir_bytes(out / f"call{c['call']}")
        assert carried == c["carry_bytes"]
        assert carried + tree <= kit.CALL_LIMIT - 2 * MIB, f"call {c['call']} carries {carried + tree} bytes"
        assert c["carry"] == [f"{out.name}/call{c['call']}"]
    wheels = out / "call1" / "wheels"
    assert (wheels / kit.SDIST_NAME).stat().st_size < 8 * MIB  # 76.6 MB before trimming
    names = {w.name.split("-")[0].lower() for w in wheels.glob("*.whl")}
    assert {"diskcache", "gguf", "scikit_build_core", "setuptools"} <= names
    assert not names & {"torch", "numpy", "triton"}  # the device's own
    tag = "cp" + python.replace(".", "")
    for w in wheels.glob("*.whl"):
        assert w.name.endswith("-none-any.whl") or f"-{tag}-" in w.name or "-abi3-" in w.name, w.name
    for entry in manifest["wheels"] + [manifest["llama_cpp_python"]]:
        assert kit.sha256(out / "call1" / entry["file"]) == entry["sha256"]
    parts = manifest["model"]["parts"]
    assert all(p["bytes"] <= 30 * MIB for p in parts)
    assert sum(p["bytes"] for p in parts) == manifest["model"]["bytes"]
    for p in parts:
        assert kit.sha256(out / f"call{p['call']}" / p["file"]) == p["sha256"]
    for c in calls:
        assert json.loads((out / f"call{c['call']}" / "manifest.json").read_text()) == manifest


def test_the_device_kit_fits_every_call(gpu_kit_device):
    out, manifest = gpu_kit_device
    _check_kit(out, manifest, kit.device_packages()[1])
    # the trimmed source is a valid sdist of 0.3.36 with what a CUDA build and the C++ driver read
    with tarfile.open(out / "call1" / "wheels" / kit.SDIST_NAME) as t:
        names = set(t.getnames())
    top = "llama_cpp_python-0.3.36/"
    for rel in ("PKG-INFO", "pyproject.toml", "CMakeLists.txt", "vendor/llama.cpp/ggml/src/ggml-cuda/CMakeLists.txt",
                "vendor/llama.cpp/examples/speculative-simple/CMakeLists.txt", "llama_cpp/__init__.py"):
        assert top + rel in names


def test_the_host_kit_reassembles_the_model(gpu_kit_host, tmp_path):
    out, manifest = gpu_kit_host
    _check_kit(out, manifest, host_python())
    parts = [out / f"call{p['call']}" / p["file"] for p in manifest["model"]["parts"]]
    kit.assemble(parts, tmp_path / manifest["model"]["file"], manifest["model"]["sha256"])
    from llama_dflash.defaults import smollm2_path

    assert kit.sha256(tmp_path / manifest["model"]["file"]) == kit.sha256(Path(smollm2_path()))


def test_cli_bad_arguments(tmp_path):
    bad = tmp_path / "notakit"
    bad.mkdir()
    (bad / "something").write_text("x")
    run = lambda *a: subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_kit.py"), *a],  # noqa: E731
                                    capture_output=True, text=True, timeout=120)
    r = run(str(tmp_path / "k"), "--python-version", "three")
    assert r.returncode == 2 and "--python-version must look like 3.12" in r.stderr
    r = run(str(tmp_path / "k"), "--sdist", str(tmp_path / "none.tar.gz"))
    assert r.returncode == 2 and "no such file" in r.stderr
    sdist = kit.cache_dir() / kit.SDIST_NAME
    if sdist.is_file():
        r = run(str(bad), "--sdist", str(sdist))
        assert r.returncode == 2 and "is not a kit" in r.stderr and (bad / "something").exists()


def test_gpu_kit_is_ignored_by_git():
    r = subprocess.run(["git", "-C", str(ROOT), "check-ignore", "-q", "gpu-kit/call1/x"], capture_output=True)
    assert r.returncode == 0


def test_check_kit_measures_the_calls_against_the_tree_now(gpu_kit_host, tmp_path, monkeypatch):
    src, manifest = gpu_kit_host
    out = tmp_path / "gpu-kit"
    shutil.copytree(src, out)
    rows = kit.check_kit(out)
    assert [r["call"] for r in rows] == [c["call"] for c in manifest["calls"]]
    tree = kit.tree_bytes(ROOT)
    for r in rows:
        assert r["with_tree_bytes"] == r["carry_bytes"] + tree <= kit.CALL_LIMIT
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_kit.py"), "--check", str(out)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.count(" of 64 MiB") == len(rows), r.stderr
    assert "not in the repository's top folder" in r.stderr  # a kit in /tmp cannot be carried
    # the tree grew past the headroom since the kit was made: make it again
    monkeypatch.setattr(kit, "tree_bytes", lambda repo: kit.CALL_LIMIT - rows[0]["carry_bytes"] + 1)
    with pytest.raises(kit.KitError, match="call 1 would carry .* make the kit again"):
        kit.check_kit(out)
    monkeypatch.undo()
    part = out / f"call{manifest['model']['parts'][-1]['call']}" / manifest["model"]["parts"][-1]["file"]
    with open(part, "r+b") as fh:
        fh.write(b"X")
    with pytest.raises(kit.KitError, match="sha256 differs from the manifest"):
        kit.check_kit(out)
    part.unlink()
    with pytest.raises(kit.KitError, match="missing"):
        kit.check_kit(out)
    with pytest.raises(kit.KitError, match="no manifest.json"):
        kit.check_kit(tmp_path)


def test_a_kit_needing_more_calls_than_the_plan_has_is_refused(tmp_path, monkeypatch):
    """The plan has three calls: where the tree leaves too little room for the model in three, the
    kit is refused before any piece is written."""
    sdist = tmp_path / kit.SDIST_NAME
    _fake_sdist(sdist)
    model = tmp_path / "model.gguf"
    with open(model, "wb") as fh:
        fh.truncate(60 * MIB)  # sparse
    monkeypatch.setattr(kit, "get_sdist", lambda given: sdist)
    monkeypatch.setattr(kit, "build_our_wheel", lambda dest: dest)
    monkeypatch.setattr(kit, "gather_wheels", lambda *a: [])
    monkeypatch.setattr(kit, "tree_bytes", lambda repo: 40 * MIB)  # 64 - 40 - 6: 18 MiB per call
    with pytest.raises(kit.KitError, match="needs 4 calls beside the tree .* the device plan has 3"):
        kit.make_kit(tmp_path / "gpu-kit", model=str(model), log=lambda _m: None)
    assert not list((tmp_path / "gpu-kit").rglob("*.part*"))
