"""The README and docs/ cannot rot (issue 43, item 1): every fenced code block of README.md,
docs/*.md and bench/results/*.md still parses against the code, and every relative link resolves.

* python blocks compile, and their import statements run (the names they import exist);
* shell blocks: each `llama-dflash ...` command parses with the CLI's own argument parser (types
  and choices included, as `--help`-level parsing would), each `make TARGET` names a Makefile
  target, each script or module a `python` line runs exists, each other command is one we know;
* links to files and to headings (`file.md#anchor`) point at something that exists.

No model is loaded: the commands the docs show are run for real by their own tests (doctor,
generate --show-drafts, serve and its page, bench).
"""

from __future__ import annotations

import ast
import importlib.util
import re
import shlex
from pathlib import Path

import pytest

from llama_dflash.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "bench" / "results").glob("*.md"))]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
LINK = re.compile(r"\]\(([^)\s]+)\)")
#: commands a shell block may show beyond llama-dflash, make and python (checked no further)
OTHER_COMMANDS = {"curl", "pip", "torchrun", "bench/gpu_check.sh", "bench/gpu_train.sh", "bench/build_cpp_reference.sh"}
README_MAX_LINES = 150


def _blocks(page: Path) -> list[tuple[str, str, int]]:
    text = page.read_text(encoding="utf-8")
    return [(m.group(1).lower(), m.group(2), text[: m.start()].count("\n") + 1) for m in FENCE.finditer(text)]


def _cases(kinds: tuple[str, ...]) -> list:
    out = []
    for page in PAGES:
        for lang, body, line in _blocks(page):
            if lang in kinds:
                out.append(pytest.param(page, body, id=f"{page.relative_to(ROOT)}:{line}"))
    return out


def _commands(body: str) -> list[list[str]]:
    """The commands of a shell block: continuation lines joined, comments dropped."""
    text = body.replace("\\\n", " ")
    cmds = []
    for line in text.splitlines():
        argv = shlex.split(line, comments=True)
        if argv:
            cmds.append(argv)
    return cmds


def _make_targets() -> set[str]:
    return set(re.findall(r"^([A-Za-z][\w-]*):", (ROOT / "Makefile").read_text(), re.M))


def test_readme_fits_on_a_few_screens():
    n = len((ROOT / "README.md").read_text(encoding="utf-8").splitlines())
    assert n < README_MAX_LINES, f"README.md has {n} lines: move details to docs/"


def test_every_page_has_code_and_is_linked_from_the_readme():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for page in (ROOT / "docs").glob("*.md"):
        assert f"docs/{page.name}" in readme, f"{page.name} is not linked from the README"
    assert _cases(("python",)) and _cases(("sh", "bash", "console"))


@pytest.mark.parametrize("page,body", _cases(("python",)))
def test_python_blocks_compile_and_import(page, body):
    tree = ast.parse(body, filename=str(page))
    compile(tree, str(page), "exec")
    imports = [node for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))]
    exec(compile(ast.Module(body=imports, type_ignores=[]), str(page), "exec"), {})


@pytest.mark.parametrize("page,body", _cases(("sh", "bash", "console")))
def test_shell_blocks_parse(page, body):
    parser = build_parser()
    targets = _make_targets()
    for argv in _commands(body):
        if argv[0].startswith("$"):
            argv = argv[1:]
        while argv and "=" in argv[0] and not argv[0].startswith("-"):  # VAR=value prefixes
            argv = argv[1:]
        cmd = argv[0]
        if cmd == "llama-dflash":
            try:
                parser.parse_args(argv[1:])
            except SystemExit as exc:
                pytest.fail(f"{page.name}: `{shlex.join(argv)}` does not parse (exit {exc.code})")
        elif cmd == "make":
            named = [a for a in argv[1:] if "=" not in a and not a.startswith("-")]
            missing = [t for t in named if t not in targets]
            assert not missing, f"{page.name}: make target(s) {missing} not in the Makefile"
        elif cmd in ("python", "python3"):
            if argv[1] == "-m":
                assert importlib.util.find_spec(argv[2]) is not None, f"{page.name}: no module {argv[2]}"
            else:
                assert (ROOT / argv[1]).is_file(), f"{page.name}: no script {argv[1]}"
        else:
            assert cmd in OTHER_COMMANDS, f"{page.name}: unknown command {cmd!r} in a shell block"
            if cmd.startswith("bench/"):
                assert (ROOT / cmd).is_file()


def _anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces as dashes."""
    out = set()
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            out.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return out


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page):
    text = page.read_text(encoding="utf-8")
    for target in LINK.findall(text):
        if re.match(r"^[a-z]+:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        assert dest.exists(), f"{page.name}: link to {target} points nowhere"
        if anchor:
            assert dest.suffix == ".md" and anchor in _anchors(dest), f"{page.name}: no heading #{anchor} in {dest.name}"
