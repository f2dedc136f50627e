"""What an output path may be: nothing yet, or a regular file. A device, a FIFO, a socket, a directory where a file is
meant, or a symbolic link (to /dev/null, to /proc/self/fd/1, to a file) is never renamed over, unlinked or written
through: refused in one line (exit 2), left as it was. ``--report -`` and ``--report /dev/stdout`` print the report.
An OUT of the wrong kind (a folder for a model, a .onnx file for a folder) and a missing IN are refused at once.
A report that cannot be written leaves no output either.

No test here touches the system's /dev: the special files are made in the test's folder (a FIFO, a socket, links
to /dev/null and /proc/self/fd/1, which are only read), and /dev/stdout is named only with stdout captured."""

from __future__ import annotations

import errno
import json
import os
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from cli.conftest import one_line_error, run_cli
from ort_rmsnorm import cli, durable, folders, fusion
from ort_rmsnorm.model.read import ModelFileError
from ort_rmsnorm.model.write import save_model, write_text_atomically


def _identity(path: Path) -> tuple:
    """What is at ``path`` itself (not following a link): its kind, inode and, for a link, where it leads."""
    status = os.lstat(path)
    return (stat.S_IFMT(status.st_mode), status.st_ino, os.readlink(path) if os.path.islink(path) else None)


def _special(tmp_path: Path, kind: str) -> Path:
    path = tmp_path / f"special-{kind}"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "socket":
        server = socket.socket(socket.AF_UNIX)
        server.bind(str(path))
        server.close()  # the socket file stays
    elif kind == "directory":
        path.mkdir()
    elif kind == "link to a character device":
        path.symlink_to("/dev/null")
    elif kind == "link to the standard output":
        path.symlink_to("/proc/self/fd/1")
    elif kind == "link to a regular file":
        (tmp_path / "elsewhere.json").write_text("{}")
        path.symlink_to(tmp_path / "elsewhere.json")
    elif kind == "link to nothing":
        path.symlink_to(tmp_path / "absent")
    return path


KINDS = ["fifo", "socket", "directory", "link to a character device", "link to the standard output",
         "link to a regular file", "link to nothing"]
SAID = {"fifo": "a FIFO", "socket": "a socket", "directory": "a directory",
        "link to a character device": "a symbolic link to a character device",
        "link to the standard output": "a symbolic link to", "link to a regular file": "a symbolic link to a regular",
        "link to nothing": "a symbolic link to nothing"}


@pytest.fixture(scope="module")
def model_file(tmp_path_factory) -> Path:
    from deploy.genai_folders import simplified_norm_model

    path = tmp_path_factory.mktemp("model") / "m.onnx"
    save_model(simplified_norm_model(1), path)
    return path


def _temporaries(folder: Path) -> list[str]:
    return sorted(name for name in os.listdir(folder) if name.startswith("."))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("option", ["OUT", "--report"])
def test_special_output_is_refused_and_left_alone(model_file, tmp_path, kind, option):
    special = _special(tmp_path, kind)
    before = _identity(special)
    args = [special, "--quiet"] if option == "OUT" else [tmp_path / "o.onnx", "--quiet", "--report", special]
    line = one_line_error(run_cli("fuse", model_file, *args), str(special), SAID[kind])
    assert "renamed into place" in line
    assert _identity(special) == before
    assert not (tmp_path / "o.onnx").exists() and _temporaries(tmp_path) == []
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)


@pytest.mark.parametrize("kind", ["fifo", "link to a character device", "directory"])
def test_special_output_refused_by_the_api(model_file, tmp_path, kind):
    special = _special(tmp_path, kind)
    before = _identity(special)
    with pytest.raises(ModelFileError, match="renamed into place"):
        fusion.fuse_file(model_file, special)
    with pytest.raises(ModelFileError, match="renamed into place"):
        fusion.fuse_file(model_file, tmp_path / "o.onnx", report_path=special)
    with pytest.raises(ModelFileError, match="renamed into place"):
        write_text_atomically(special, "{}")
    assert _identity(special) == before and not (tmp_path / "o.onnx").exists()


def test_a_special_file_appearing_before_the_rename_is_not_replaced(tmp_path):
    """The kind is checked again just before each rename: what a path names may change while a run works."""
    target = tmp_path / "out.json"

    def write(temporary: Path) -> None:
        temporary.write_text("{}")
        os.mkfifo(target)

    with pytest.raises(durable.NotAFileError):
        durable.write_file(target, write)
    assert stat.S_ISFIFO(os.lstat(target).st_mode) and _temporaries(tmp_path) == []


def test_special_data_file_is_refused(tmp_path):
    """OUT.onnx.data too: a model with external data writes it next to OUT."""
    from deploy.genai_folders import simplified_norm_model

    model = tmp_path / "ext.onnx"
    save_model(simplified_norm_model(1), model, external_data=True)
    os.mkfifo(tmp_path / "o.onnx.data")
    one_line_error(run_cli("fuse", model, tmp_path / "o.onnx", "--quiet"), "o.onnx.data", "a FIFO")
    assert not (tmp_path / "o.onnx").exists() and stat.S_ISFIFO(os.lstat(tmp_path / "o.onnx.data").st_mode)


@pytest.mark.parametrize("spelling", ["-", "/dev/stdout"])
def test_report_to_stdout(model_file, tmp_path, spelling):
    """Printed on stdout as the file would hold it (stdout captured here: a pipe), the other lines on stderr."""
    out = tmp_path / "o.onnx"
    result = subprocess.run([sys.executable, "-m", "ort_rmsnorm.cli", "fuse", str(model_file), str(out), "--quiet",
                             "--report", spelling], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    printed = json.loads(result.stdout)
    fusion.fuse_file(model_file, tmp_path / "again.onnx", report_path=tmp_path / "r.json")
    assert printed == json.loads((tmp_path / "r.json").read_text())
    assert len(printed["fusions"]) == 1 and f"wrote {out}" in result.stderr
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode) and os.path.islink("/dev/stdout")


def test_folder_report_to_stdout(tmp_path):
    from deploy.genai_folders import write_onnx_folder

    folder = write_onnx_folder(tmp_path / "in")
    result = run_cli("fuse", folder, tmp_path / "out", "--quiet", "--report", "-")
    assert result.returncode == 0, result.stderr
    printed = json.loads(result.stdout)
    assert {"model.onnx", "decoder_model_merged.onnx"} <= set(printed["models"]), printed["models"]
    assert printed["destination"] == str(tmp_path / "out") and "wrote" in result.stderr


# --- the kind OUT names -------------------------------------------------------------------------------------------


def test_a_folder_out_for_a_model_is_refused(model_file, tmp_path):
    for out in (f"{tmp_path / 'new-folder'}/", str(tmp_path) + "/.", "."):
        one_line_error(run_cli("fuse", model_file, out, "--quiet", cwd=tmp_path), out,
                        "IN is a model file", "names a folder")
    assert os.listdir(tmp_path) == []


def test_a_onnx_file_out_for_a_folder_is_refused(tmp_path):
    from deploy.genai_folders import write_onnx_folder

    folder = write_onnx_folder(tmp_path / "in")
    for name in ("fused.onnx", "FUSED.ONNX"):
        one_line_error(run_cli("fuse", folder, tmp_path / name, "--quiet"), "IN is a folder", "names a .onnx file")
        assert not (tmp_path / name).exists()


def test_a_missing_input_is_said_before_any_import(tmp_path):
    """Said before onnx, onnx_ir or the pass is imported (seconds), as a missing output folder is."""
    code = ("import sys\nfrom ort_rmsnorm import cli\n"
            f"status = cli.main(['fuse', {str(tmp_path / 'absent.onnx')!r}, {str(tmp_path / 'o.onnx')!r}])\n"
            "print(status, sorted(name for name in ('onnx', 'onnx_ir', 'onnxscript', 'onnxruntime') "
            "if name in sys.modules))\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.stdout.split() == ["2", "[]"], result
    assert "absent.onnx: no such file or folder" in result.stderr
    verify = run_cli("verify", tmp_path / "absent.onnx", tmp_path / "other.onnx")
    one_line_error(verify, "absent.onnx: no such file or folder")


# --- a report that cannot be written: no output ---------------------------------------------------------------------


def _failing_on(monkeypatch, function: str, name: str) -> None:
    """``durable.<function>`` raising ENOSPC for the file ``name`` (a report with no room left)."""
    original = getattr(durable, function)

    def fail(*args):
        paths = [arg for arg in args if isinstance(arg, Path)]
        if any(path.name == name for path in paths):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(paths[-1]))
        return original(*args)

    monkeypatch.setattr(durable, function, fail)


@pytest.mark.parametrize("stage", ["stage_file", "commit_file"])
@pytest.mark.parametrize("external_data", [False, True])
def test_report_failure_leaves_no_model(tmp_path, monkeypatch, capsys, stage, external_data):
    from deploy.genai_folders import simplified_norm_model

    model = tmp_path / "in" / "m.onnx"
    model.parent.mkdir()
    save_model(simplified_norm_model(1), model, external_data=external_data)
    out = tmp_path / "out"
    out.mkdir()
    _failing_on(monkeypatch, stage, "r.json")
    status = cli.main(["fuse", str(model), str(out / "o.onnx"), "--quiet", "--report", str(out / "r.json")])
    error = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and len(error) == 1 and "r.json" in error[0] and "No space left" in error[0], error
    assert os.listdir(out) == []


@pytest.mark.parametrize("stage", ["stage_file", "commit_file"])
def test_folder_report_failure_leaves_no_folder(tmp_path, monkeypatch, capsys, stage):
    from deploy.genai_folders import write_onnx_folder

    folder = write_onnx_folder(tmp_path / "in")
    _failing_on(monkeypatch, stage, "r.json")
    status = cli.main(["fuse", str(folder), str(tmp_path / "out"), "--quiet", "--report", str(tmp_path / "r.json")])
    error = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and len(error) == 1 and "r.json" in error[0], error
    assert sorted(os.listdir(tmp_path)) == ["in"]
    with pytest.raises(ModelFileError):
        folders.fuse_folder(folder, tmp_path / "out2", report_path=tmp_path / "r.json")
    assert sorted(os.listdir(tmp_path)) == ["in"]
