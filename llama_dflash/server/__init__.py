"""OpenAI-compatible HTTP server over `llama_dflash.highlevel.Llama` (needs the `server` extra)."""

from .app import Metrics, create_app

__all__ = ["create_app", "Metrics"]
