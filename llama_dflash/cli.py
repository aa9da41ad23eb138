"""`llama-dflash` command line: dispatches to one module per subcommand.

Each subcommand module provides `configure(parser: argparse.ArgumentParser) -> None` and
`run(args: argparse.Namespace) -> int`.  Bad arguments and incompatible files end with a
one-line message on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Optional, Sequence

from .defaults import DefaultModelMissing
from .errors import DFlashError

__all__ = ["main", "SUBCOMMANDS", "UsageError"]

#: subcommand -> (module, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "bench": ("llama_dflash.bench.cli", "compare ordinary and speculative decoding on a model pair"),
    "generate": ("llama_dflash.generate_cli", "generate text from a prompt with speculative decoding"),
    "train": ("llama_dflash.train.cli", "train a DFlash/DSpark draft for a GGUF target"),
    "export": ("llama_dflash.train.export_cli", "rewrite a draft GGUF: reduced vocabulary, quantized weights"),
    "serve": ("llama_dflash.server.cli", "OpenAI-compatible server with speculative decoding"),
    "doctor": ("llama_dflash.doctor_cli", "check a target and drafts: what applies, what fails, break-even tau"),
}

EXIT_USAGE = 2


class UsageError(DFlashError, ValueError):
    """A command-line value that cannot work; reported as one line, exit code 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2 (argparse prints usage too)
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        raise SystemExit(EXIT_USAGE)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="llama-dflash", description="DFlash/DSpark speculative decoding for GGUF models")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name and not module_name.startswith(exc.name) and exc.name != module_name:
                # the module exists but one of its optional dependencies does not
                p = sub.add_parser(name, help=f"{help_text} (unavailable: {exc.name} is not installed)")
                p.set_defaults(_missing=exc.name)
            continue
        p = sub.add_parser(name, help=help_text, description=(module.__doc__ or help_text).strip().splitlines()[0])
        module.configure(p)
        p.set_defaults(_run=module.run)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "_missing", None):
        sys.stderr.write(f"llama-dflash {args.command}: needs the Python package '{args._missing}'\n")
        return EXIT_USAGE
    run = getattr(args, "_run", None)
    if run is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    try:
        return int(run(args) or 0)
    except (DFlashError, DefaultModelMissing, ValueError, FileNotFoundError, IsADirectoryError,
            PermissionError) as exc:
        sys.stderr.write(f"llama-dflash {args.command}: error: {exc}\n")
        return EXIT_USAGE
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        return 130


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
