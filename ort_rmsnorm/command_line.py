"""What every entry point of the command line keeps (``ort-rmsnorm``, ``python -m ort_rmsnorm.bench``): the exit
statuses, errors on one line, progress lines on stderr, interrupts.

Expected errors (unreadable or invalid input, bad options, an output that would overwrite the input) print one line
on stderr and exit with 2; a verification mismatch exits with 1; an interrupt exits with 128 + the signal: 130 for
Ctrl-C (SIGINT), 143 for SIGTERM (``kill``, ``timeout``, a container or service stopping), 129 for SIGHUP (the
terminal closed). SIGTERM and SIGHUP are raised where the program is, as Python raises Ctrl-C, so every command cleans
up alike: no partial output, no temporary. Names in messages are printed with control characters escaped
(:func:`printable`).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import time
import unicodedata
from pathlib import Path
from typing import Callable, Iterator, Sequence

PROG = "ort-rmsnorm"
EXIT_OK, EXIT_MISMATCH, EXIT_USAGE = 0, 1, 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a process that SIGINT ended
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE, as a shell reports a process whose reader left
TERMINATING_SIGNALS = ("SIGTERM", "SIGHUP")
"""Handled like Ctrl-C: raised as :class:`Terminated` where the program is."""
_UNPRINTABLE = frozenset({"Cc", "Cs", "Zl", "Zp"})
_BIDI_CONTROLS = frozenset("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200e\u200f")


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP received: an interrupt, cleaned up as Ctrl-C is (``except Exception`` does not catch it)."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def interrupted_status(signum: int) -> int:
    """128 + the signal, as a shell reports a process the signal ended."""
    return 128 + signum


def printable(text: str) -> str:
    """``text`` with control characters (NUL, escape, newlines, ...), lone surrogates (undecodable bytes of a file
    name) and bidirectional overrides escaped as Python writes them (``\\x00``, ``\\x1b``, ``\\udcff``): a name
    from a model or a folder cannot break a line or drive the terminal."""
    if text.isprintable():
        return text
    return "".join(ascii(char)[1:-1] if unicodedata.category(char) in _UNPRINTABLE or char in _BIDI_CONTROLS
                   else char for char in text)


def printable_lines(text: str) -> str:
    """:func:`printable` on each line of a multi-line text (its newlines kept)."""
    return "\n".join(printable(line) for line in text.split("\n"))


@contextlib.contextmanager
def signals_as_interrupts() -> Iterator[None]:
    """For the block, SIGTERM and SIGHUP raise :class:`Terminated` (once: later ones are ignored while the first is
    cleaned up). A signal the parent set to be ignored (``nohup``) stays ignored. The handlers are restored after."""
    received: list[int] = []

    def handle(signum: int, _frame) -> None:
        if not received:
            received.append(signum)
            raise Terminated(signum)

    previous = {}
    for name in TERMINATING_SIGNALS:
        signum = getattr(signal, name, None)
        if signum is None:
            continue
        try:
            if signal.getsignal(signum) == signal.SIG_IGN:
                continue
            previous[signum] = signal.signal(signum, handle)
        except ValueError:  # not the main thread: signals stay as they are
            continue
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


class UsageError(Exception):
    """A bad option value found after parsing; exits with 2."""


class Parser(argparse.ArgumentParser):
    """argparse's parser with its errors on one line (argparse prints the whole usage first)."""

    def error(self, message: str):
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


_command_started: float | None = None
"""When :func:`run_program` started the running command: every :class:`Progress` of a command counts from it."""


class Progress:
    """Stage and progress lines on stderr, with the time since the command started."""

    def __init__(self, quiet: bool = False, interval_s: float = 2.0):
        self.quiet, self.interval_s = quiet, interval_s
        self.last = time.perf_counter()
        self.start = _command_started if _command_started is not None else self.last

    def stage(self, message: str) -> None:
        if not self.quiet:
            print(f"[{time.perf_counter() - self.start:6.1f}s] {printable(message)}", file=sys.stderr, flush=True)
            self.last = time.perf_counter()

    def tensors_written(self, index: int, total: int) -> None:
        if index == total or time.perf_counter() - self.last >= self.interval_s:
            self.stage(f"  external data: {index}/{total} tensors written")


def make_directory(option: str, directory: Path) -> None:
    """Where a command writes at its end: made (or refused) before it runs."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise UsageError(f"{option}: cannot make the directory {directory}: {error.strerror or error}") from None


def _expected_errors() -> tuple[type[BaseException], ...]:
    from .auto_table import AutoTableError
    from .model.read import ModelFileError

    errors = (UsageError, ModelFileError, AutoTableError, FileNotFoundError)
    try:
        from .verify import VerifyInputError
    except ModuleNotFoundError as error:  # without onnxruntime nothing raised it: the error at hand is another
        if error.name != "onnxruntime":
            raise
        return errors
    return (*errors, VerifyInputError)


# The API's options in the words of the command line, for the messages of the pass and the API that name them.
CLI_SPELLINGS = {"allow_opset_upgrade=True": "--convert-opset"}


def for_cli(text: str) -> str:
    """``text`` (a report, an error) with the API's option names replaced by the command line's flags."""
    for api, flag in CLI_SPELLINGS.items():
        text = text.replace(api, flag)
    return text


def run_program(build_parser: Callable[[Sequence[str]], argparse.ArgumentParser], argv: Sequence[str] | None,
                name: str, name_of: Callable[[argparse.Namespace], str] | None = None) -> int:
    """Parses ``argv`` (default: the process's arguments) with ``build_parser(argv)``'s parser and runs
    ``args.run(args)``; expected errors and interrupts (Ctrl-C, SIGTERM, SIGHUP: :func:`signals_as_interrupts`)
    become a line on stderr and the exit status. ``name``: the program's name in those lines, ``name_of(args)`` the
    command's once known."""
    global _command_started
    _command_started = time.perf_counter()
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        with signals_as_interrupts():
            # Building the parser imports the subcommands' modules: an interrupt may land here too.
            args = build_parser(argv).parse_args(argv)
            name = name_of(args) if name_of is not None else name
            status = args.run(args)
            sys.stdout.flush()  # here, where a reader that left is caught below, not at the interpreter's exit
            return status
    except Terminated as interrupt:  # the output and temporaries were cleaned up on the way here
        _print_error(f"{name}: interrupted ({signal.Signals(interrupt.signum).name})")
        return interrupted_status(interrupt.signum)
    except KeyboardInterrupt:  # first: the next clause imports modules, which an interrupt may have left half-made
        _print_error(f"{name}: interrupted")
        return EXIT_INTERRUPTED
    except SystemExit:  # argparse's exits (--help, --version, usage errors): not through the next clause's imports
        raise
    except BrokenPipeError:  # the reader of stdout left (`| head`): as a program killed by SIGPIPE, without a word
        with contextlib.suppress(OSError, ValueError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nothing left to flush into the pipe
        return EXIT_BROKEN_PIPE
    except UsageError as error:  # said at once: the next clause imports the modules of the other errors (seconds)
        _print_error(f"{name}: error: {for_cli(str(error))}")
        return EXIT_USAGE
    except ModuleNotFoundError as error:  # onnxruntime: the one dependency the package leaves to the user
        if error.name != "onnxruntime":
            raise
        from ._library import ONNXRUNTIME_MISSING

        _print_error(f"{name}: error: {ONNXRUNTIME_MISSING}")
        return EXIT_USAGE
    except _expected_errors() as error:
        _print_error(f"{name}: error: {for_cli(str(error))}")
        return EXIT_USAGE
    finally:
        _command_started = None


def _print_error(line: str) -> None:
    """One line on stderr; a terminal gone (SIGHUP) does not turn it into a traceback."""
    with contextlib.suppress(OSError):
        print(printable(line), file=sys.stderr, flush=True)


def exit_with(status: int) -> None:
    """Ends the process with ``status``. After an interruption (a status above 128) it leaves through ``os._exit``:
    CPython ends the process by SIGINT at exit, even after the interrupt was handled, when the KeyboardInterrupt
    passed through an ``eval()`` of a string (``collections.namedtuple`` makes its classes so: an interrupt during
    fusing would end with status -2, not 130). Everything was cleaned up by then."""
    if status > 128:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        os._exit(status)
    sys.exit(status)
