"""Emulate the GPU machine's Python environment here, for the CPU rehearsal and the kit's test.

    python bench/gpu_plan/device_site.py DEST

makes DEST a folder of links to the packages of THIS interpreter's environment that the device
image also has (bench/gpu_plan/device-packages.txt: top-level modules and their .dist-info), and
nothing else.  The plan's venv then chains DEST (GPU_PLAN_SITE=DEST) as it chains
/opt/torch/.venv's site-packages on the device, so an install from the kit sees what the device
would have and must bring the rest itself: a kit that misses a package fails here too.
"""

from __future__ import annotations

import importlib.metadata as md
import os
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def device_names(path: Path = HERE / "device-packages.txt") -> set[str]:
    names = set()
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line and not line.startswith("python "):
            names.add(canonical(line))
    return names


def _requires(dist: md.Distribution) -> list[str]:
    """Canonical names of what `dist` needs (no extras; markers evaluated for this interpreter)."""
    try:
        from packaging.requirements import Requirement
    except ImportError:
        from pip._vendor.packaging.requirements import Requirement
    out = []
    for text in dist.requires or ():
        req = Requirement(text)
        if req.marker is None or req.marker.evaluate({"extra": ""}):
            out.append(canonical(req.name))
    return out


def emulate(dest: Path, names: set[str]) -> list[str]:
    """Link into `dest` every installed distribution named in `names` and what it needs in turn
    (the device's environment is consistent: an installed package has its dependencies there;
    pip's resolver checks them), each as what its RECORD lists at the top level of its
    site-packages; returns the names linked."""
    dest.mkdir(parents=True, exist_ok=True)
    dists = {canonical(d.metadata["Name"] or ""): d for d in md.distributions()}
    todo = [n for n in names if n in dists]
    chosen: set[str] = set()
    while todo:
        name = todo.pop()
        if name in chosen or name not in dists:
            continue
        chosen.add(name)
        todo += _requires(dists[name])
    for name in sorted(chosen):
        dist = dists[name]
        base = Path(dist.locate_file(""))
        tops = set()
        for f in dist.files or ():
            parts = Path(f).parts
            if parts and parts[0] != ".." and not parts[0].startswith("__pycache__"):
                tops.add(parts[0])
        for top in sorted(tops):
            src = base / top
            link = dest / top
            if src.exists() and not os.path.lexists(link):
                os.symlink(src, link)
    return sorted(chosen)


def main() -> int:
    if len(sys.argv) != 2:
        print("usage: device_site.py DEST", file=sys.stderr)
        return 2
    linked = emulate(Path(sys.argv[1]), device_names())
    print(f"{len(linked)} packages of the device image linked into {sys.argv[1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
