"""SIGTERM and SIGHUP sent to a real `ort-rmsnorm fuse` mid-run end it as Ctrl-C does: status 128 + the signal, the
line `ort-rmsnorm fuse: interrupted (SIGTERM)`, no output, no temporary (`.OUT.tmp-*`, the report's), the input
untouched. `kill`, `timeout`, container stops and systemd send SIGTERM; a closed terminal sends SIGHUP.

Folder form: the signal is sent when the run prints its first `loading` line, when its temporary folder exists and
the models are still to be read and fused, so it always lands mid-run. File form: it is sent at the `writing` line,
inside the write of an 8 MiB model and its report (or, rarely, once they are complete: then they are complete, and
still no temporary is left).
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from deploy.conftest import tree_digest
from deploy.genai_folders import write_onnx_folder
from ort_rmsnorm.model.read import load_model
from ort_rmsnorm.model.write import save_model
from ort_rmsnorm.builders.llama import LlamaConfig, build_llama_onnx

SIGNALS = [name for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name)]
LLAMA = LlamaConfig(vocab_size=1024, hidden_size=256, intermediate_size=640, num_layers=2, num_heads=4)

pytestmark = pytest.mark.skipif(not SIGNALS, reason="needs POSIX signals")


class Run:
    """`ort-rmsnorm fuse ...` in a subprocess; ``wait_for(pattern)`` returns once a stderr line matches."""

    def __init__(self, *args, ignore_hangup: bool = False):
        def hangup_disposition():
            # Ignored as nohup does, or the default: not what the process running the tests inherited (a suite
            # started under nohup would pass its ignored SIGHUP on to every child).
            signal.signal(signal.SIGHUP, signal.SIG_IGN if ignore_hangup else signal.SIG_DFL)

        self.process = subprocess.Popen([sys.executable, "-m", "ort_rmsnorm.cli", "fuse", *map(str, args)],
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                        preexec_fn=hangup_disposition if hasattr(signal, "SIGHUP") else None)
        self.lines: list[str] = []
        self.stdout = ""
        self.changed = threading.Condition()
        self.readers = [threading.Thread(target=self._read_stderr, daemon=True),
                        threading.Thread(target=self._read_stdout, daemon=True)]
        for reader in self.readers:
            reader.start()

    def _read_stderr(self):
        for line in self.process.stderr:
            with self.changed:
                self.lines.append(line.rstrip("\n"))
                self.changed.notify_all()

    def _read_stdout(self):
        self.stdout = self.process.stdout.read()

    def wait_for(self, pattern: str, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        with self.changed:
            while not any(re.search(pattern, line) for line in self.lines):
                assert self.process.poll() is None, f"ended before {pattern!r}:\n" + "\n".join(self.lines)
                assert time.monotonic() < deadline, f"no {pattern!r} after {timeout} s:\n" + "\n".join(self.lines)
                self.changed.wait(0.05)

    def finish(self, timeout: float = 300) -> int:
        returncode = self.process.wait(timeout)
        for reader in self.readers:
            reader.join(timeout)
        return returncode


def _temporaries(directory: Path) -> list[str]:
    return sorted(path.name for path in directory.iterdir() if path.name.startswith("."))


@pytest.fixture(scope="module")
def model_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("signal_model") / "model.onnx"
    save_model(build_llama_onnx(LLAMA), path)
    return path


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory) -> Path:
    return write_onnx_folder(tmp_path_factory.mktemp("signal_folder") / "model")


@pytest.mark.parametrize("name", SIGNALS)
def test_signal_during_a_folder_fuse(name, model_folder, tmp_path):
    signum = getattr(signal, name)
    before = tree_digest(model_folder)
    out = tmp_path / "out"
    run = Run(model_folder, out)
    run.wait_for(r"\[1/\d+\] loading ")
    assert _temporaries(tmp_path), "the temporary folder exists once the first model loads"
    run.process.send_signal(signum)
    assert run.finish() == 128 + signum, "\n".join(run.lines)
    assert run.lines[-1] == f"ort-rmsnorm fuse: interrupted ({name})", run.lines
    assert not any("Traceback" in line for line in run.lines)
    assert not out.exists() and _temporaries(tmp_path) == []
    assert tree_digest(model_folder) == before


@pytest.mark.parametrize("name", SIGNALS)
def test_signal_during_a_file_fuse(name, model_file, tmp_path):
    signum = getattr(signal, name)
    before = tree_digest(model_file.parent)
    out, report = tmp_path / "out.onnx", tmp_path / "report.json"
    run = Run(model_file, out, "--report", report)
    run.wait_for(r"\] writing ")
    run.process.send_signal(signum)
    returncode = run.finish()
    if returncode == 128 + signum:
        assert run.lines[-1] == f"ort-rmsnorm fuse: interrupted ({name})", run.lines
        assert not out.exists()
    else:  # the signal came once the output was complete: before the command returned, or while Python exits
        assert returncode in (0, -signum), "\n".join(run.lines)
        assert load_model(out) is not None and report.is_file()
    assert not any("Traceback" in line for line in run.lines)
    assert _temporaries(tmp_path) == []
    assert tree_digest(model_file.parent) == before


def test_a_hangup_ignored_by_the_parent_stays_ignored(model_folder, tmp_path):
    """Under nohup (SIGHUP ignored when the process starts) a hangup does not stop the run."""
    run = Run(model_folder, tmp_path / "out", ignore_hangup=True)
    run.wait_for(r"\[1/\d+\] loading ")
    run.process.send_signal(signal.SIGHUP)
    assert run.finish() == 0, "\n".join(run.lines)
    assert (tmp_path / "out" / "model.onnx").is_file() and _temporaries(tmp_path) == []


def test_a_reader_that_left_ends_the_program_quietly():
    """`ort-rmsnorm info | head -1`: a standard output whose reader left ends the program with 128 + SIGPIPE, without a
    traceback or a line about the exception on stderr."""
    import os

    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        result = subprocess.run([sys.executable, "-m", "ort_rmsnorm", "info"], stdout=write_end, stderr=subprocess.PIPE,
                                text=True, timeout=300)
    finally:
        os.close(write_end)
    assert result.returncode == 141, result.stderr
    assert result.stderr == ""
