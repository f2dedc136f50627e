"""A folder's trust boundary: `fuse IN_DIR OUT_DIR` reads only regular files inside IN_DIR (links out of it only with
--follow-symlinks), and `--replace` replaces only a folder that `fuse` wrote.

Each case builds a tiny folder (one 64-wide norm model, a few small files) and checks what is refused, that the
message names each entry and the problem, that nothing outside the folder reached the output, and that a refusal
leaves no output and no temporary. Most cases call `fuse_folder`; the command line is checked where its message or
option is the point.
"""

from __future__ import annotations

import json
import os
import socket
import stat
from pathlib import Path

import pytest

from deploy.conftest import run_cli, tree_digest
from deploy.genai_folders import genai_config, simplified_norm_model
from ort_rmsnorm import durable, folders
from ort_rmsnorm.model.write import save_model

SECRET = "token=do-not-copy-me"


def _leftovers(parent: Path) -> list[str]:
    return sorted(name for name in os.listdir(parent) if name.startswith("."))


def _model_folder(root: Path, name: str = "in", *, external_data: bool = False) -> Path:
    """A plain folder of one model (``model.onnx``) and a config file."""
    folder = root / name
    folder.mkdir()
    save_model(simplified_norm_model(0), folder / "model.onnx", external_data=external_data)
    (folder / "config.json").write_text('{"model_type": "llama"}\n')
    return folder


def _outside(root: Path) -> Path:
    """A folder beside the input, holding what must never reach the output."""
    outside = root / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text(SECRET)
    save_model(simplified_norm_model(7), outside / "other.onnx")
    return outside


def _refused(folder: Path, out: Path, *fragments: str, **options) -> str:
    with pytest.raises(folders.FolderError) as raised:
        folders.fuse_folder(folder, out, **options)
    message = str(raised.value)
    for fragment in fragments:
        assert fragment in message, message
    assert "\n" not in message
    assert not out.exists() and _leftovers(out.parent) == []
    return message


def _no_secret(out: Path) -> None:
    for path in out.rglob("*"):
        assert not path.is_symlink(), path
        if path.is_file():
            assert SECRET.encode() not in path.read_bytes(), path


# --- links out, special files, loops ------------------------------------------------------------------------------


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="no /proc")
def test_link_to_the_process_environment_is_refused(tmp_path):
    folder = _model_folder(tmp_path)
    (folder / "tokenizer_config.json").symlink_to("/proc/self/environ")
    for follow in (False, True):  # not a file on disk: refused even where links out are allowed
        _refused(folder, tmp_path / "out", "tokenizer_config.json: a symbolic link to /proc/", "environ",
                 follow_symlinks=follow)


def test_link_to_a_folder_outside_is_not_walked(tmp_path):
    folder, outside = _model_folder(tmp_path), _outside(tmp_path)
    (folder / "extras").mkdir()
    (folder / "extras" / "shared").symlink_to(outside)
    message = _refused(folder, tmp_path / "out", f"extras/shared: a symbolic link to a folder {outside}, outside the "
                                                 "folder", "--follow-symlinks")
    assert "other.onnx" not in message  # not walked: nothing inside it was looked at

    report = folders.fuse_folder(folder, tmp_path / "out", follow_symlinks=True)
    assert sorted(result.path for result in report.models) == ["extras/shared/other.onnx", "model.onnx"]
    assert (tmp_path / "out" / "extras" / "shared" / "secret.txt").read_text() == SECRET  # allowed: copied as a file


@pytest.mark.parametrize("target", ["..", "../.."])
def test_link_to_a_folder_holding_the_folder_is_a_loop(tmp_path, target):
    folder = _model_folder(tmp_path)
    (tmp_path / "earlier-out").mkdir()
    (folder / "extras").mkdir()
    (folder / "extras" / "parent").symlink_to(target)
    for follow in (False, True):
        _refused(folder, tmp_path / "out", "extras/parent: a symbolic link to ", "a folder that contains it (a loop)",
                 follow_symlinks=follow)


def test_models_reached_through_links_out_of_a_folder_of_onnx_files(tmp_path):
    folder, outside = _model_folder(tmp_path), _outside(tmp_path)
    (folder / "decoder.onnx").symlink_to(outside / "other.onnx")
    _refused(folder, tmp_path / "out", f"decoder.onnx: a symbolic link to {outside / 'other.onnx'}, outside the folder",
             "--follow-symlinks")
    report = folders.fuse_folder(folder, tmp_path / "out", follow_symlinks=True)
    assert sorted(result.path for result in report.models) == ["decoder.onnx", "model.onnx"]
    assert not (tmp_path / "out" / "decoder.onnx").is_symlink()


def test_genai_filename_linking_out_of_the_folder(tmp_path):
    folder, outside = tmp_path / "in", _outside(tmp_path)
    folder.mkdir()
    (folder / "genai_config.json").write_text(json.dumps(genai_config(), indent=4))
    (folder / "model.onnx").symlink_to(outside / "other.onnx")
    _refused(folder, tmp_path / "out", "model.onnx: a symbolic link to", "outside the folder", "--follow-symlinks")
    report = folders.fuse_folder(folder, tmp_path / "out", follow_symlinks=True)
    assert [result.path for result in report.models] == ["model.onnx"]


def test_links_inside_the_folder_are_followed(tmp_path):
    folder = _model_folder(tmp_path)
    (folder / "sub").mkdir()
    (folder / "sub" / "notes.txt").write_text("notes")
    (folder / "alias.json").symlink_to("config.json")
    (folder / "sub" / "up.json").symlink_to("../config.json")
    report = folders.fuse_folder(folder, tmp_path / "out")
    out = tmp_path / "out"
    assert sorted(report.copied) == ["alias.json", "config.json", "sub/notes.txt", "sub/up.json"]
    for name in ("alias.json", "sub/up.json"):
        assert not (out / name).is_symlink() and (out / name).read_text() == '{"model_type": "llama"}\n'


def test_a_folder_is_read_once(tmp_path):
    """A link to a folder the walk reads anyway would copy it twice (and links to links, exponentially often)."""
    folder = _model_folder(tmp_path)
    (folder / "sub").mkdir()
    (folder / "sub" / "notes.txt").write_text("notes")
    (folder / "alias").symlink_to("sub")
    _refused(folder, tmp_path / "out", "the folder", "again, already read as", "a folder is read once")


def test_device_files_fifos_and_sockets_are_refused(tmp_path):
    folder = _model_folder(tmp_path)
    os.mkfifo(folder / "pipe")
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(folder / "socket"))
    (folder / "null").symlink_to("/dev/null")
    try:
        for follow in (False, True):
            message = _refused(folder, tmp_path / "out", "refusing to read 3 entries",
                               "pipe: a FIFO, not a regular file", "socket: a socket, not a regular file",
                               follow_symlinks=follow)
            assert "null: a symbolic link to /dev/null" in message
    finally:
        listener.close()


def test_link_loops_are_loops(tmp_path):
    folder = _model_folder(tmp_path)
    (folder / "a.json").symlink_to("b.json")
    (folder / "b.json").symlink_to("a.json")
    (folder / "gone.json").symlink_to("missing.json")
    message = _refused(folder, tmp_path / "out", "a.json: a symbolic link loop", "b.json: a symbolic link loop",
                       "gone.json: a symbolic link to missing.json, which does not exist")
    assert "a.json: a symbolic link to" not in message


def test_genai_filename_that_is_a_link_loop(tmp_path):
    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "genai_config.json").write_text(json.dumps(genai_config()))
    (folder / "model.onnx").symlink_to("model.onnx")
    result = run_cli("fuse", folder, tmp_path / "out")
    assert result.returncode == 2
    assert "model.onnx: a symbolic link loop" in result.stderr and "does not exist" not in result.stderr


def test_hugging_face_snapshot(tmp_path):
    """A cache snapshot is a folder of links into ../../blobs/: refused by default, with a message naming the option;
    fused with it, into a folder of regular files, and verified against the snapshot."""
    cache = tmp_path / "models--org--tiny"
    blobs, snapshot = cache / "blobs", cache / "snapshots" / "0123abcd"
    blobs.mkdir(parents=True)
    snapshot.mkdir(parents=True)
    staging = tmp_path / "download"
    staging.mkdir()
    save_model(simplified_norm_model(3), staging / "model.onnx", external_data=True)
    (staging / "tokenizer.json").write_text('{"model": {}}\n')
    for index, name in enumerate(("model.onnx", "model.onnx.data", "tokenizer.json")):
        (staging / name).rename(blobs / f"blob{index}")
        (snapshot / name).symlink_to(f"../../blobs/blob{index}")
    before = tree_digest(cache)

    refused = run_cli("fuse", snapshot, tmp_path / "out")
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    error = refused.stderr.strip().splitlines()[-1]
    assert "model.onnx: a symbolic link to" in error and "tokenizer.json: a symbolic link to" in error
    assert "--follow-symlinks" in error and "Hugging Face" in error
    assert not (tmp_path / "out").exists()

    fused = run_cli("fuse", snapshot, tmp_path / "out", "--follow-symlinks")
    assert fused.returncode == 0, fused.stderr
    out = tmp_path / "out"
    assert sorted(os.listdir(out)) == sorted(["libort_rmsnorm.so", folders.MANIFEST, "model.onnx", "model.onnx.data",
                                              "tokenizer.json"])
    assert not any(path.is_symlink() for path in out.iterdir())
    assert tree_digest(cache) == before
    assert folders.verify_folder(snapshot, out, follow_symlinks=True).ok
    assert run_cli("verify", snapshot, out).returncode == 2  # verify reads the folder under the same rule


def test_a_file_swapped_after_the_walk_is_not_read(tmp_path):
    """Between the walk and the copy, a file replaced by a link out of the folder: the copy refuses it."""
    from ort_rmsnorm.folders.contents import read_contents

    folder, outside = _model_folder(tmp_path), _outside(tmp_path)
    found = read_contents(folder)
    (folder / "config.json").unlink()
    (folder / "config.json").symlink_to(outside / "secret.txt")
    with pytest.raises(folders.FolderError, match="config.json: changed while the folder was read"):
        found.copy("config.json", tmp_path / "copy.json")
    assert not (tmp_path / "copy.json").exists()


def test_one_line_on_the_command_line(tmp_path):
    folder = _model_folder(tmp_path)
    os.mkfifo(folder / "pipe")
    result = run_cli("fuse", folder, tmp_path / "out")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("ort-rmsnorm fuse: error: ")
    assert "pipe: a FIFO, not a regular file" in result.stderr


# --- --replace ----------------------------------------------------------------------------------------------------


def test_replace_refuses_a_folder_fuse_did_not_write(tmp_path):
    folder = _model_folder(tmp_path)
    documents = tmp_path / "mydocs"
    (documents / "sub").mkdir(parents=True)
    (documents / "thesis.tex").write_text("\\documentclass{article}")
    (documents / "sub" / "photo.jpg").write_bytes(b"\xff\xd8\xff")
    before = tree_digest(documents)
    result = run_cli("fuse", folder, documents, "--replace")
    assert result.returncode == 2
    error = result.stderr.strip().splitlines()[-1]
    assert f"{documents}: not a folder ort-rmsnorm fuse wrote (no valid {folders.MANIFEST} in it)" in error
    assert tree_digest(documents) == before and _leftovers(tmp_path) == []


def test_replace_refuses_what_was_added_or_changed(tmp_path):
    folder, out = _model_folder(tmp_path), tmp_path / "out"
    folders.fuse_folder(folder, out)
    listed = json.loads((out / folders.MANIFEST).read_text())
    assert listed["written_by"] == "ort-rmsnorm fuse" and listed["format"] == 1
    assert listed["files"] == {relative: (out / relative).stat().st_size for relative in tree_digest(out)
                               if relative != folders.MANIFEST}

    (out / "notes.md").write_text("mine")
    (out / "drafts").mkdir()
    with pytest.raises(folders.FolderError, match=r"holds 2 entries fuse did not write \(drafts/, notes.md\)"):
        folders.fuse_folder(folder, out, replace=True)
    (out / "notes.md").unlink()
    (out / "drafts").rmdir()
    with open(out / "config.json", "a") as file:
        file.write("edited\n")
    with pytest.raises(folders.FolderError, match=r"1 file changed since \(config.json\)"):
        folders.fuse_folder(folder, out, replace=True)
    (out / "config.json").unlink()
    (out / "config.json").symlink_to(folder / "config.json")
    with pytest.raises(folders.FolderError, match=r"1 entry fuse did not write \(config.json\)"):
        folders.fuse_folder(folder, out, replace=True)
    (out / "config.json").unlink()  # a file it wrote, removed since: the folder is still its own
    folders.fuse_folder(folder, out, replace=True)
    assert (out / "config.json").read_text() == '{"model_type": "llama"}\n'
    assert _leftovers(tmp_path) == []


@pytest.mark.parametrize("listed", ["../victim.txt", "/tmp/victim.txt", "sub/../../victim.txt"])
def test_a_manifest_naming_paths_outside_is_not_followed(tmp_path, listed):
    from ort_rmsnorm.folders import manifest

    folder, out = _model_folder(tmp_path), tmp_path / "out"
    folders.fuse_folder(folder, out)
    (tmp_path / "victim.txt").write_text("keep me")
    data = json.loads((out / folders.MANIFEST).read_text())
    data["files"][listed] = 7
    (out / folders.MANIFEST).write_text(json.dumps(data))
    with pytest.raises(folders.FolderError, match="no valid"):
        folders.fuse_folder(folder, out, replace=True)
    manifest.discard(out)  # nothing listed is trusted: nothing removed
    assert (tmp_path / "victim.txt").read_text() == "keep me" and (out / "model.onnx").is_file()


@pytest.mark.parametrize("exchange", [True, False])
def test_files_added_while_replacing_are_kept(tmp_path, monkeypatch, exchange):
    """A file added to the old folder after the checks (a race) is not removed with it: it is kept aside, and the
    report says where."""
    folder, out = _model_folder(tmp_path), tmp_path / "out"
    folders.fuse_folder(folder, out)
    if not exchange:
        monkeypatch.setattr(durable, "exchange", lambda _first, _second: False)
    publish = durable.publish_folder

    def racing_publish(staging, destination, **options):
        (destination / "added.txt").write_text("added meanwhile")
        return publish(staging, destination, **options)

    monkeypatch.setattr(durable, "publish_folder", racing_publish)
    report = folders.fuse_folder(folder, out, replace=True)
    assert not (out / "added.txt").exists() and (out / folders.MANIFEST).is_file()
    kept = _leftovers(tmp_path)
    assert len(kept) == 1 and kept[0].startswith(".out.kept-")
    assert os.listdir(tmp_path / kept[0] / "folder") == ["added.txt"]  # only what fuse had not written
    assert any(kept[0] in note and "kept" in note for note in report.notes)


# --- what the output folder itself may be -------------------------------------------------------------------------


def test_the_current_directory_as_output(tmp_path):
    folder = _model_folder(tmp_path)
    here = tmp_path / "here"
    here.mkdir()
    result = run_cli("fuse", folder, ".", cwd=here)
    assert result.returncode == 2
    assert "ort-rmsnorm fuse: error: .: the output folder is the current directory" in result.stderr
    assert "another process" not in result.stderr
    assert os.listdir(here) == [] and _leftovers(tmp_path) == []


def test_a_folder_named_like_the_library(tmp_path):
    folder = _model_folder(tmp_path)
    (folder / "libort_rmsnorm.so").mkdir()
    (folder / "libort_rmsnorm.so" / "readme.txt").write_text("not a library")
    message = _refused(folder, tmp_path / "out", "libort_rmsnorm.so: a folder of the input has the library's name")
    assert "another process" not in message
    report = folders.fuse_folder(folder, tmp_path / "ort", target="ort")  # no library needed: copied as it is
    assert "libort_rmsnorm.so/readme.txt" in report.copied


def test_a_file_named_like_the_library_is_replaced_and_said(tmp_path):
    folder = _model_folder(tmp_path)
    (folder / "libort_rmsnorm.so").write_bytes(b"an older build")
    report = folders.fuse_folder(folder, tmp_path / "out")
    assert (tmp_path / "out" / "libort_rmsnorm.so").read_bytes() != b"an older build"
    assert "libort_rmsnorm.so" not in report.copied
    assert any("replaced by this package's library" in note for note in report.notes)


def test_an_input_file_where_the_output_needs_the_name(tmp_path):
    """optimum names its data model.onnx_data; a file that happens to be called model.onnx.data is not that data and
    would be overwritten by the fused model's."""
    folder = tmp_path / "in"
    folder.mkdir()
    import onnx

    onnx.save_model(simplified_norm_model(0), str(folder / "model.onnx"), save_as_external_data=True,
                    location="model.onnx_data", size_threshold=1024)
    (folder / "model.onnx.data").write_text("something else")
    _refused(folder, tmp_path / "out", "model.onnx.data: the output folder needs this name for the external data of "
                                       "the fused model.onnx")


def test_names_are_printed_escaped(tmp_path):
    folder = _model_folder(tmp_path)
    os.mkfifo(folder / "evil\x1b[2J\nname")
    result = run_cli("fuse", folder, tmp_path / "out")
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "\x1b" not in result.stderr
    assert "evil\\x1b[2J\\nname: a FIFO" in result.stderr


def test_entries_refused_are_capped_in_the_message(tmp_path):
    folder = _model_folder(tmp_path)
    for index in range(25):
        os.mkfifo(folder / f"pipe{index:02d}")
    message = _refused(folder, tmp_path / "out", "refusing to read 25 entries", "; and 15 more")
    assert message.count("a FIFO") == 10


def test_modes_of_copied_files_are_kept(tmp_path):
    folder = _model_folder(tmp_path)
    (folder / "run.sh").write_text("#!/bin/sh\n")
    (folder / "run.sh").chmod(0o750)
    folders.fuse_folder(folder, tmp_path / "out")
    assert stat.S_IMODE((tmp_path / "out" / "run.sh").stat().st_mode) == 0o750
