"""Drafters: the interfaces (`base`), the DFlash/DSpark draft model (`dflash`), llama.cpp's n-gram
speculators (`ngram`), our own lookup (`lookup`) and the chain that runs several (`chain`)."""

from .base import Proposer, TokenDrafter
from .dflash import DFlashProposer, selector_walk
from .scripted import ScriptedProposer

__all__ = ["Proposer", "TokenDrafter", "DFlashProposer", "ScriptedProposer", "selector_walk"]
