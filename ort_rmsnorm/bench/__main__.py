"""``python -m ort_rmsnorm.bench ARGS`` is ``ort-rmsnorm bench ARGS`` (the same options, checks and messages)."""

from __future__ import annotations

import sys

from ..command_line import PROG, Parser, exit_with, run_program
from .about import HELP
from .arguments import add_bench_arguments
from .command import run_checked


def _parser(argv=None) -> Parser:
    parser = Parser(prog=f"{PROG} bench", description=HELP)
    add_bench_arguments(parser)
    parser.set_defaults(run=run_checked)
    return parser


def main(argv: list[str] | None = None) -> int:
    return run_program(_parser, sys.argv[1:] if argv is None else argv, f"{PROG} bench")


if __name__ == "__main__":
    exit_with(main())
