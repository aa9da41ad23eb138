"""llama.cpp's SPEED-Bench client against `llama-dflash serve` and `llama-server`, on local prompts.

    python bench/speed_bench.py [--servers llama-dflash,llama-server] [--osl 128] [--limit 2]
                                [--draft-n-max 3] [--n-threads 2] [--prompts FILE] [--json PATH]

The client is llama.cpp's own `tools/server/bench/speed-bench/speed_bench.py` from the
llama-cpp-python sdist (the copy ../shared/tools/build-cpp-reference.sh extracts; `--client PATH`
names another), loaded unchanged: it sends chat requests, reads each answer's `usage` and
llama-server's `timings` object (prompt_n, predicted_per_second, draft_n, draft_n_accepted) and
prints its table -- decode speed and acceptance rate per category.  Its dataset (nvidia/SPEED-Bench
on the Hugging Face hub) cannot be downloaded here, so only its loader is replaced: a stand-in
`datasets` module serves local samples (`PROMPTS` below, or --prompts FILE: a JSON list of
{"question_id", "category", "turns"}) in the dataset's row format, and everything after that --
requests, parsing, statistics -- is the client's code.

Both servers get the same model, draft, draft length, context and thread count (SmolLM2 with its
shipped DSpark draft by default; llama-server with `--spec-type draft-dspark|draft-dflash`),
started one after the other on free loopback ports.  Exit status 1 when a server fails a request.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import json
import os
import sys
import tempfile
import types
from pathlib import Path
from typing import Any, Iterator, Optional

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
if (REPO / "llama_dflash").is_dir():
    sys.path.insert(0, str(REPO))
sys.path.insert(0, str(HERE))

import load  # noqa: E402  (bench/load.py: starting, probing and stopping servers)

SERVERS = ("llama-dflash", "llama-server")

#: local samples in SPEED-Bench's row format (question_id, category, turns): short, varied prompts
PROMPTS: list[dict[str, Any]] = [
    {"question_id": "code-1", "category": "coding",
     "turns": ["Write a Python function that returns the n-th Fibonacci number iteratively."]},
    {"question_id": "code-2", "category": "coding",
     "turns": ["Write a Python function that checks whether a string is a palindrome."]},
    {"question_id": "code-3", "category": "coding",
     "turns": ["Write a JavaScript function that sums the numbers in an array."]},
    {"question_id": "write-1", "category": "writing",
     "turns": ["Write a short paragraph about autumn in a small town."]},
    {"question_id": "write-2", "category": "writing",
     "turns": ["Write a short story about a robot that learns to paint."]},
    {"question_id": "write-3", "category": "writing",
     "turns": ["Describe the sea at night in a few sentences.", "Now make it sound more cheerful."]},
    {"question_id": "qa-1", "category": "qa", "turns": ["Why is the sky blue? Explain briefly."]},
    {"question_id": "qa-2", "category": "qa", "turns": ["What are the three states of matter?"]},
    {"question_id": "qa-3", "category": "qa", "turns": ["How does a bicycle stay upright when it moves?"]},
]


def default_client() -> str:
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "llama-cpp-reference", "src", "llama_cpp_python-0.3.36", "vendor", "llama.cpp",
                        "tools", "server", "bench", "speed-bench", "speed_bench.py")


class LocalDataset:
    """The two things the client reads of a `datasets.Dataset`: a column by name, and the rows."""

    def __init__(self, rows: list[dict[str, Any]]):
        self.rows = rows

    def __getitem__(self, column: str) -> list[Any]:
        return [row.get(column) for row in self.rows]

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self.rows)

    def __len__(self) -> int:
        return len(self.rows)


def stand_in_datasets(rows: list[dict[str, Any]], config: str = "local") -> types.ModuleType:
    """A `datasets` module whose one config, `config`, holds `rows` (nothing is downloaded)."""
    module = types.ModuleType("datasets")

    def get_dataset_config_names(_repo: str) -> list[str]:
        return [config]

    def load_dataset(_repo: str, name: Optional[str] = None, split: Optional[str] = None) -> LocalDataset:
        if name != config:
            raise ValueError(f"only the local config {config!r} is served here, not {name!r}")
        return LocalDataset(rows)

    module.get_dataset_config_names = get_dataset_config_names  # type: ignore[attr-defined]
    module.load_dataset = load_dataset  # type: ignore[attr-defined]
    return module


def load_client(path: str, rows: list[dict[str, Any]]) -> types.ModuleType:
    """llama.cpp's speed_bench.py, imported as it is, with the stand-in `datasets` module."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no SPEED-Bench client at {path} (../shared/tools/build-cpp-reference.sh "
                                "extracts the sdist that holds it; or pass --client PATH)")
    saved = sys.modules.get("datasets")
    sys.modules["datasets"] = stand_in_datasets(rows)
    try:
        spec = importlib.util.spec_from_file_location("llama_cpp_speed_bench", path)
        module = importlib.util.module_from_spec(spec)
        assert spec.loader is not None
        sys.modules[spec.name] = module  # its dataclasses look their module up there
        spec.loader.exec_module(module)
    finally:
        if saved is None:
            sys.modules.pop("datasets", None)
        else:
            sys.modules["datasets"] = saved
    return module


def serve_command(a: argparse.Namespace, model: str, draft: Optional[str], port: int) -> list[str]:
    cmd = [sys.executable, "-m", "llama_dflash.cli", "serve", "--model", model, "--port", str(port),
           "--n-ctx", str(a.n_ctx), "--n-threads", str(a.n_threads), "--max-tokens-cap", str(max(a.osl, 16))]
    if draft:
        cmd += ["--draft-model", draft, "--spec-type", load.llama_server_spec_type(draft),
                "--draft-n-max", str(a.draft_n_max)]
    else:
        cmd += ["--spec-type", "none"]
    return cmd


def llama_server_command(a: argparse.Namespace, model: str, draft: Optional[str], port: int) -> list[str]:
    cmd = [a.llama_server, "-m", model, "--host", "127.0.0.1", "--port", str(port), "-np", "1", "-c", str(a.n_ctx),
           "-fa", "on", "--no-webui", "-t", str(a.n_threads)]
    if draft:
        cmd += ["-md", draft, "--spec-type", load.llama_server_spec_type(draft), "--spec-draft-n-max",
                str(a.draft_n_max)]
    return cmd


def run_one(a: argparse.Namespace, server: str, client: types.ModuleType, model: str,
            draft: Optional[str]) -> dict[str, Any]:
    """Start `server`, run the client against it, stop it: the client's printed table and summary."""
    port = load.free_port()
    if server == "llama-server":
        if not os.access(a.llama_server, os.X_OK):
            raise FileNotFoundError(f"no llama-server at {a.llama_server} (build it with "
                                    "../shared/tools/build-cpp-reference.sh, or pass --llama-server PATH)")
        cmd = llama_server_command(a, model, draft, port)
    else:
        cmd = serve_command(a, model, draft, port)
    with tempfile.TemporaryDirectory() as tmp, open(os.path.join(tmp, "server.log"), "w+") as log:
        out_json = os.path.join(tmp, "result.json")
        proc = load.start_server(cmd, port, log)
        try:
            argv = ["--url", f"127.0.0.1:{port}", "--bench", "local", "--osl", str(a.osl), "--concurrency", "1",
                    "--extra-inputs", json.dumps({"temperature": 0}), "--timeout", str(a.timeout),
                    "--output", out_json]
            if a.limit:
                argv += ["--limit", str(a.limit)]
            printed = io.StringIO()
            with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(io.StringIO()):
                status = client.main(argv)
        finally:
            load.stop_server(proc)
        result = json.load(open(out_json)) if os.path.isfile(out_json) else {}
    return {"server": server, "status": status, "output": printed.getvalue(), "summary": result.get("summary", []),
            "failed": result.get("failed_samples"), "command": " ".join(cmd)}


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--servers", default=",".join(SERVERS), help="comma list of llama-dflash, llama-server")
    ap.add_argument("--model", default=None, help="target GGUF (default: SmolLM2-135M-Instruct)")
    ap.add_argument("--draft", default=None, help="draft GGUF (default: the shipped draft for SmolLM2)")
    ap.add_argument("--no-draft", action="store_true", help="no speculation on either server")
    ap.add_argument("--draft-n-max", type=int, default=3, help="draft length on both servers (default 3)")
    ap.add_argument("--osl", type=int, default=128, help="max_tokens of each answer (the client's --osl)")
    ap.add_argument("--limit", type=int, default=None, help="samples per category (default: all)")
    ap.add_argument("--n-ctx", type=int, default=2048)
    ap.add_argument("--n-threads", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per request")
    ap.add_argument("--prompts", default=None, help="JSON list of {question_id, category, turns} (default: built in)")
    ap.add_argument("--client", default=default_client(), help="llama.cpp's speed_bench.py")
    ap.add_argument("--llama-server", default=load._default_llama_server(), metavar="PATH")
    ap.add_argument("--json", default=None, metavar="PATH", help="write both runs' summaries here")
    a = ap.parse_args(argv)
    a.servers = [s.strip() for s in a.servers.split(",") if s.strip()]
    bad = [s for s in a.servers if s not in SERVERS]
    if bad or not a.servers:
        ap.error(f"--servers takes {', '.join(SERVERS)}")
    return a


def main(argv: Optional[list[str]] = None) -> int:
    from llama_dflash.defaults import default_draft_path, smollm2_path

    a = parse_args(argv)
    rows = json.load(open(a.prompts)) if a.prompts else PROMPTS
    client = load_client(a.client, rows)
    model = a.model or smollm2_path()
    draft = None if a.no_draft else (a.draft or default_draft_path(model))
    runs = []
    for server in a.servers:
        run = run_one(a, server, client, model, draft)
        runs.append(run)
        print(f"== {server}: {run['command']}")
        print(run["output"].strip())
        print()
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(runs, fh, indent=2)
    return 0 if all(r["status"] == 0 for r in runs) else 1


if __name__ == "__main__":
    raise SystemExit(main())
