"""Ordinary-versus-speculative benchmark, runnable as
`python -m examples.high_level_api.high_level_api_dflash_dspark_speculative [bench options]`.

The same program as `llama-dflash bench`; see `-h` for the options.
"""

from __future__ import annotations

import sys

from llama_dflash.cli import main

if __name__ == "__main__":
    raise SystemExit(main(["bench", *sys.argv[1:]]))
