"""`ort-rmsnorm fuse` under faults, in file form (IN.onnx OUT.onnx, with and without external data) and folder form
(IN_DIR OUT_DIR): a full file system, a read-only one, the output's folder removed mid-run, SIGKILL and Ctrl-C at
moments spread over the write, two runs writing the same output at once, a new run after killed ones.

Every case checks that the input is byte for byte as before, that the output is either absent or byte for byte the
output of a clean run, that a clean failure (an error, Ctrl-C) leaves no temporary, and that the exit status and the
one-line message are those of docs/cli.md ("Exit status and errors"). A SIGKILLed run may leave its temporary
(``.OUT.tmp-*``): the next run works regardless, names it in a note and leaves it (docs/cli.md says why).
The file-system cases mount small tmpfs file systems, and skip, saying why, where that is not possible (not root).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from cli.conftest import run_cli, sha256
from deploy.conftest import tree_digest
from deploy.genai_folders import write_onnx_folder
from ort_rmsnorm.model.write import data_file_name, save_model
from ort_rmsnorm.builders.llama import LlamaConfig, build_llama_onnx

# 8 MiB of float32 weights: writing them takes long enough (about 0.1 s here) for kills to land inside the write.
KILL_LLAMA = LlamaConfig(vocab_size=1024, hidden_size=256, intermediate_size=640, num_layers=2, num_heads=4)
# Moments of the kills after the "writing" progress line, as fractions of a clean run's time from that line to its
# exit (past 1: after the output is complete, or during the interpreter's exit).
KILL_FRACTIONS = (0.0, 0.2, 0.5, 0.8)
KINDS = ("inline", "external", "folder")
ERROR_LINE = re.compile(r"^ort-rmsnorm fuse: error: \S.*$")
WRITING_LINE = re.compile(r"^\[\s*[\d.]+s\] (\[\d+/\d+\] )?writing ")

pytestmark = pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs POSIX signals (SIGKILL)")


class Fuse:
    """`ort-rmsnorm fuse SOURCE OUT ...` running in a subprocess, its stderr read as it comes."""

    def __init__(self, source: Path, out: Path, *extra: str):
        self.process = subprocess.Popen([sys.executable, "-m", "ort_rmsnorm.cli", "fuse", str(source), str(out),
                                         *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.lines: list[str] = []
        self.stdout = ""
        self.writing = threading.Event()
        self.writing_at = 0.0
        self.readers = [threading.Thread(target=self._read_stderr, daemon=True),
                        threading.Thread(target=self._read_stdout, daemon=True)]
        for reader in self.readers:
            reader.start()

    def _read_stderr(self):
        for line in self.process.stderr:
            if WRITING_LINE.match(line) and not self.writing.is_set():
                self.writing_at = time.monotonic()
                self.writing.set()
            self.lines.append(line.rstrip("\n"))

    def _read_stdout(self):
        self.stdout = self.process.stdout.read()

    @property
    def stderr(self) -> str:
        return "\n".join(self.lines)

    def wait_for_writing(self, timeout: float = 120) -> None:
        """Returns once the run has started writing its output (or has ended)."""
        deadline = time.monotonic() + timeout
        while not self.writing.wait(0.05):
            assert self.process.poll() is None or self.writing.is_set(), f"ended before writing:\n{self.stderr}"
            assert time.monotonic() < deadline, f"no 'writing' line after {timeout} s:\n{self.stderr}"

    def finish(self, timeout: float = 300) -> int:
        returncode = self.process.wait(timeout)
        for reader in self.readers:
            reader.join(timeout)
        return returncode


def _output_name(kind: str) -> str:
    return "out" if kind == "folder" else "out.onnx"


def _output_digest(kind: str, out: Path) -> dict[str, str]:
    """sha256 by name of what the output is: the folder's files, or OUT.onnx and OUT.onnx.data where present."""
    if kind == "folder":
        return tree_digest(out) if out.is_dir() else {}
    return {path.name: sha256(path) for path in (out, out.with_name(data_file_name(out))) if path.exists()}


def _temporaries(out: Path) -> list[Path]:
    return sorted(out.parent.glob(f".{out.name}.*"))


def _check_outcome(kind: str, out: Path, clean: dict[str, str]) -> str:
    """The output is absent or the clean run's, byte for byte; returns which."""
    got = _output_digest(kind, out)
    if not got:
        return "absent"
    if kind == "folder" or out.name in got:
        assert got == clean, f"{out}: neither absent nor the clean run's output"
        return "complete"
    # No model: a data file may stand alone (moved in before the model), and is then the complete one.
    assert all(clean[name] == digest for name, digest in got.items()), f"{out}: a partial data file"
    return "absent (data file only)"


def _check_error(result_stderr: str, *fragments: str) -> None:
    """The documented failure: one error line (after any progress lines), naming the problem; no traceback."""
    assert "Traceback" not in result_stderr, result_stderr
    last = result_stderr.strip().splitlines()[-1]
    assert ERROR_LINE.match(last), result_stderr
    assert any(fragment in last for fragment in fragments), result_stderr


@dataclasses.dataclass
class Clean:
    digest: dict[str, str]
    write_s: float  # from the "writing" line to the exit


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> dict[str, Path]:
    """A model with its weights inline, the same with external data, and a folder of models (one with external
    data), each in a folder of its own."""
    root = tmp_path_factory.mktemp("fault_inputs")
    proto = build_llama_onnx(KILL_LLAMA)
    for kind in ("inline", "external", "other"):
        (root / kind).mkdir()
        model = build_llama_onnx(KILL_LLAMA, seed=1) if kind == "other" else proto
        save_model(model, root / kind / "model.onnx", external_data=kind != "inline")
    return {"inline": root / "inline" / "model.onnx", "external": root / "external" / "model.onnx",
            "other": root / "other" / "model.onnx",  # "external" with other weights
            "folder": write_onnx_folder(root / "folder" / "model")}


@pytest.fixture(scope="module")
def clean(inputs, tmp_path_factory) -> dict[str, Clean]:
    """Each input's clean output, written by a run nothing disturbs."""
    root = tmp_path_factory.mktemp("fault_clean")
    runs = {}
    for kind, source in inputs.items():
        out = root / kind / _output_name(kind)
        out.parent.mkdir()
        run = Fuse(source, out)
        run.wait_for_writing()
        assert run.finish() == 0, run.stderr
        write_s = time.monotonic() - run.writing_at
        assert not _temporaries(out)
        runs[kind] = Clean(_output_digest(kind, out), write_s)
    return runs


def _input_digest(source: Path) -> dict[str, str]:
    return tree_digest(source if source.is_dir() else source.parent)


# --- kills --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_sigkill_while_writing_then_a_new_run(kind, inputs, clean, tmp_path):
    source, out = inputs[kind], tmp_path / _output_name(kind)
    before = _input_digest(source)
    replace = ["--replace"] if kind == "folder" else []  # a complete folder from an earlier run is replaced
    outcomes = []
    for fraction in KILL_FRACTIONS:
        run = Fuse(source, out, *replace)
        run.wait_for_writing()
        time.sleep(fraction * clean[kind].write_s)
        run.process.send_signal(signal.SIGKILL)
        returncode = run.finish()
        assert returncode in (0, -signal.SIGKILL), run.stderr
        outcomes.append((fraction, returncode, _check_outcome(kind, out, clean[kind].digest)))
        assert _input_digest(source) == before
    print(f"{kind}: (fraction of the write, exit status, output) {outcomes}")
    # Whatever the kills left, a new run writes the complete output; it names the killed runs' temporaries in a
    # note and leaves them (it cannot tell them from a running run's).
    leftovers = _temporaries(out)
    result = run_cli("fuse", source, out, *replace)
    assert result.returncode == 0, (outcomes, result.stderr)
    assert _output_digest(kind, out) == clean[kind].digest
    for leftover in leftovers:
        assert f"note: {leftover}: a temporary left by an interrupted run" in result.stderr
        assert leftover.exists()
    assert _temporaries(out) == leftovers
    assert _input_digest(source) == before


@pytest.mark.parametrize("kind", KINDS)
def test_ctrl_c_while_writing_leaves_no_partial_output_and_no_temporary(kind, inputs, clean, tmp_path):
    source, out = inputs[kind], tmp_path / _output_name(kind)
    before = _input_digest(source)
    run = Fuse(source, out)
    run.wait_for_writing()
    time.sleep(0.3 * clean[kind].write_s)
    run.process.send_signal(signal.SIGINT)
    returncode = run.finish()
    outcome = _check_outcome(kind, out, clean[kind].digest)
    if returncode == 130:
        assert run.stderr.strip().splitlines()[-1] == "ort-rmsnorm fuse: interrupted", run.stderr
        assert outcome == "absent"
    else:
        # The signal came after the output was complete: before the command returned (0), or while the interpreter
        # exits, which then ends by the signal (a shell's status 130 again).
        assert returncode in (0, -signal.SIGINT), run.stderr
        assert outcome == "complete", (returncode, run.stderr)
    assert not _temporaries(out)
    assert _input_digest(source) == before


# --- the output's file system -------------------------------------------------------------------------------------


@contextlib.contextmanager
def _tmpfs(path: Path, size_bytes: int, *, read_only: bool = False):
    """A tmpfs of ``size_bytes`` mounted at ``path`` (made here) for the block; skips the test where it cannot."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    if shutil.which("mount") is None:
        pytest.skip("no mount command")
    path.mkdir()
    options = f"size={size_bytes}" + (",ro" if read_only else "")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], capture_output=True,
                             text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=True)


def _clean_size(kind: str, clean: dict[str, Clean], inputs: dict[str, Path]) -> int:
    source = inputs[kind]
    files = [p for p in source.rglob("*") if p.is_file()] if source.is_dir() else [source]
    return sum(p.stat().st_size for p in files)


@pytest.mark.parametrize("kind", KINDS)
def test_full_file_system(kind, inputs, clean, tmp_path):
    source = inputs[kind]
    before = _input_digest(source)
    # Room for a third of the output: the write fails part-way, in the model or its data.
    with _tmpfs(tmp_path / "small", _clean_size(kind, clean, inputs) // 3) as mount:
        out = mount / _output_name(kind)
        result = run_cli("fuse", source, out)
        assert result.returncode == 2, result.stderr
        _check_error(result.stderr, "No space left on device")
        assert str(mount) in result.stderr.splitlines()[-1]
        assert list(mount.iterdir()) == []  # no output, no temporary
    assert _input_digest(source) == before


@pytest.mark.parametrize("kind", KINDS)
def test_read_only_output_folder(kind, inputs, tmp_path):
    source = inputs[kind]
    before = _input_digest(source)
    with _tmpfs(tmp_path / "read_only", 1 << 20, read_only=True) as mount:
        result = run_cli("fuse", source, mount / _output_name(kind))
        assert result.returncode == 2, result.stderr
        _check_error(result.stderr, "Read-only file system")
        assert list(mount.iterdir()) == []
    assert _input_digest(source) == before


@pytest.mark.parametrize("kind", KINDS)
def test_output_folder_removed_while_writing(kind, inputs, clean, tmp_path):
    source = inputs[kind]
    before = _input_digest(source)
    folder = tmp_path / "vanishing"
    folder.mkdir()
    run = Fuse(source, folder / _output_name(kind))
    run.wait_for_writing()
    time.sleep(0.3 * clean[kind].write_s)
    while folder.exists():  # the run may add files while it is removed
        shutil.rmtree(folder, ignore_errors=True)
    returncode = run.finish()
    # Written before the removal (then removed with it), or failed with the documented error; never made again.
    assert returncode in (0, 2), run.stderr
    if returncode == 2:
        _check_error(run.stderr, "No such file or directory", "lost")
    assert not folder.exists()
    assert _input_digest(source) == before


# --- two runs, one output -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ("inline", "external"))
def test_two_runs_writing_the_same_file_at_once(kind, inputs, clean, tmp_path):
    source, out = inputs[kind], tmp_path / "out.onnx"
    before = _input_digest(source)
    runs = [Fuse(source, out), Fuse(source, out)]
    for run in runs:
        assert run.finish() == 0, run.stderr
    # Each replaced the output with a complete one: the last one's, never one's model with the other's data.
    assert _output_digest(kind, out) == clean[kind].digest
    assert not _temporaries(out)
    assert _input_digest(source) == before


def test_two_runs_of_different_models_writing_the_same_file_at_once(inputs, clean, tmp_path):
    out = tmp_path / "out.onnx"
    assert clean["external"].digest != clean["other"].digest
    before = {kind: _input_digest(inputs[kind]) for kind in ("external", "other")}
    runs = [Fuse(inputs["external"], out), Fuse(inputs["other"], out)]
    for run in runs:
        assert run.finish() == 0, run.stderr
    # The model and data of whichever run renamed its pair last: never one's model next to the other's data.
    assert _output_digest("external", out) in (clean["external"].digest, clean["other"].digest)
    assert not _temporaries(out)
    assert {kind: _input_digest(inputs[kind]) for kind in ("external", "other")} == before


def test_two_runs_writing_the_same_folder_at_once(inputs, clean, tmp_path):
    source, out = inputs["folder"], tmp_path / "out"
    before = _input_digest(source)
    runs = [Fuse(source, out), Fuse(source, out)]
    returncodes = [run.finish() for run in runs]
    # Without --replace, the folder the first one published is not replaced by the second, which says so.
    assert sorted(returncodes) == [0, 2], [run.stderr for run in runs]
    refused = runs[returncodes.index(2)]
    _check_error(refused.stderr, "exists and is not empty", "written by another process")
    assert _output_digest("folder", out) == clean["folder"].digest
    assert not _temporaries(out)
    assert _input_digest(source) == before


def test_two_runs_replacing_the_same_folder_at_once(inputs, clean, tmp_path):
    source, out = inputs["folder"], tmp_path / "out"
    before = _input_digest(source)
    assert run_cli("fuse", source, out).returncode == 0
    runs = [Fuse(source, out, "--replace"), Fuse(source, out, "--replace")]
    for run in runs:
        assert run.finish() == 0, run.stderr
    assert _output_digest("folder", out) == clean["folder"].digest
    assert not _temporaries(out)
    assert _input_digest(source) == before
