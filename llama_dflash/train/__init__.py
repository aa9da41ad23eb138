"""Draft trainer: self-distillation data from a GGUF target, a PyTorch DFlash draft that matches
llama.cpp's `dflash` graph, export to a draft GGUF, parity check and acceptance evaluation.

Needs the `train` extra (torch).
"""

#: where `llama-dflash train --device` can train (see device.py)
DEVICES = ("auto", "cpu", "cuda", "mps")

#: what answers the prompts of the mix data (`--data-backend`): llama.cpp, or a PyTorch copy of the
#: target (torchgen.py)
DATA_BACKENDS = ("llama.cpp", "torch")
