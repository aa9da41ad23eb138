"""`python -m llama_dflash.train ...` (and `torchrun --nproc-per-node N -m llama_dflash.train ...`):
the same options as `llama-dflash train`."""

import sys

from ..cli import main

if __name__ == "__main__":
    raise SystemExit(main(["train", *sys.argv[1:]]))
