"""`llama-dflash generate --show-drafts` (issue 43, item 6): the answer streamed with accepted draft
tokens marked -- brackets when the output is not a terminal, colour when it is."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from llama_dflash.origins import TARGET, TokenOrigin
from llama_dflash.show import DraftMarker, use_colour
from llama_dflash.testing.drafts import write_rigged_draft
from llama_dflash.testing.targets import write_target

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    d = tmp_path_factory.mktemp("show")
    fx = write_target(str(d / "qwen35.gguf"), "qwen35", mtp=True)
    return fx.path, write_rigged_draft(str(d / "dspark.gguf"), fx, "dspark")


def _generate(pair, tmp_path, *extra):
    out = tmp_path / "g.json"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    env.pop("NO_COLOR", None)
    proc = subprocess.run([sys.executable, "-m", "llama_dflash.cli", "generate", "--model", pair[0],
                           "--draft-model", pair[1], "--raw-prompt", "--prompt", "the quick brown fox and the lazy dog is",
                           "--max-tokens", "24", "--draft-tokens", "4", "--threads", "2", "--n-ctx", "512",
                           "--show-drafts", "--json", str(out), *extra],
                          capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    return proc, json.loads(out.read_text())


def test_brackets_in_a_pipe_and_the_text_unchanged(pair, tmp_path):
    proc, data = _generate(pair, tmp_path, "--spec-type", "draft-mtp,draft-dspark")
    shown = proc.stdout.rstrip("\n")
    assert "\x1b[" not in shown  # not a terminal: no colour codes
    origins = data["token_origins"]
    assert "".join(o["text"] for o in origins) == data["text"]
    names = []
    for o in origins:
        if o["origin"] != TARGET and o["origin"] not in names:
            names.append(o["origin"])
    assert names  # the rigged draft and head are right most of the time
    pairs = {"[": "]", "{": "}"}
    # each run of one speculator's accepted tokens sits in its own bracket pair, in order of appearance
    runs = re.findall(r"[\[{]([^\]}]*)[\]}]", shown)
    assert runs and "".join(runs) == "".join(o["text"] for o in origins if o["origin"] != TARGET)
    stripped = re.sub(r"[\[\]{}]", "", shown)
    assert stripped == data["text"]
    for left, right in list(pairs.items())[: len(names)]:
        assert shown.count(left) == shown.count(right) > 0
    assert "accepted draft tokens: [...] " + names[0] in proc.stderr


def test_ordinary_decoding_marks_nothing(pair, tmp_path):
    proc, data = _generate(pair, tmp_path, "--spec-type", "none", "--draft-model", "")
    assert proc.stdout.rstrip("\n") == data["text"]
    assert all(o["origin"] == TARGET for o in data["token_origins"])
    assert "every token is the target's own" in proc.stderr


def test_colour_on_a_terminal():
    out = io.StringIO()
    m = DraftMarker(out, colour=True)
    m.write("a", TokenOrigin(1, TARGET))
    m.write(" b", TokenOrigin(2, "draft-dspark", depth=1))
    m.write("\n c", TokenOrigin(3, "lookup", depth=1))
    m.close()
    assert out.getvalue() == "a\x1b[42m b\x1b[0m\n\x1b[44m c\x1b[0m"  # each line coloured on its own
    assert "draft-dspark" in m.legend() and "lookup" in m.legend()


def test_colour_only_where_it_shows(monkeypatch):
    class Tty(io.StringIO):
        def isatty(self):
            return True

    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setenv("TERM", "xterm-256color")
    assert use_colour(Tty()) and not use_colour(io.StringIO())
    monkeypatch.setenv("NO_COLOR", "1")
    assert not use_colour(Tty())
