"""genai_config.json read with bounds and edited with the smallest change: its size and nesting capped, its keys taken
literally, a non-object where an object is needed refused, and the fused folder's config the input's text with only
the members `fuse` adds inserted (checked independently: the result parses to the intended object, and removing the
inserted members gives back the input byte for byte)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from deploy.conftest import run_cli
from ort_rmsnorm import folders

LIBRARY = "libort_rmsnorm.so"
# What fuse inserts after an object's last member: a comma and the member, spaced as the object's members are.
INSERTED = re.compile(r'\s*,\s*"custom_ops_library"\s*:\s*"libort_rmsnorm\.so"')


def _with_library(config: dict, *sections: tuple) -> dict:
    expected = json.loads(json.dumps(config))
    for section in sections:
        node = expected
        for key in section:
            node = node[key]
        node.setdefault("session_options", {})["custom_ops_library"] = LIBRARY
    return expected


@pytest.fixture
def genai_folder(onnx_genai_folder) -> Path:
    """The genai-layout folder (decoder, embedding without options, vision with its own)."""
    return onnx_genai_folder


def _write(folder: Path, text: str | bytes) -> None:
    path = folder / "genai_config.json"
    path.write_bytes(text if isinstance(text, bytes) else text.encode("utf-8"))


def _fused_config(folder: Path, out: Path) -> bytes:
    folders.fuse_folder(folder, out)
    return (out / "genai_config.json").read_bytes()


# --- the smallest change ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("style", ["indent 4", "indent 2, CRLF", "tabs", "compact", "odd spacing and escapes"])
def test_only_the_library_members_are_inserted(genai_folder, tmp_path, style):
    config = json.loads((genai_folder / "genai_config.json").read_text())
    config["model"]["note"] = "caf\u00e9 \u2603 \"quoted\" \\ slash"
    text = {
        "indent 4": json.dumps(config, indent=4),
        "indent 2, CRLF": json.dumps(config, indent=2).replace("\n", "\r\n") + "\r\n",
        "tabs": json.dumps(config, indent="\t", ensure_ascii=False),
        "compact": json.dumps(config, separators=(",", ":")),
        "odd spacing and escapes": json.dumps(config, indent=3, separators=(" ,", " :  ")) + "\n\n",
    }[style]
    _write(genai_folder, text)
    fused = _fused_config(genai_folder, tmp_path / "out").decode("utf-8")
    assert json.loads(fused) == _with_library(config, ("model", "decoder"), ("model", "vision"))
    assert INSERTED.sub("", fused) == text  # every other byte as it was
    assert len(INSERTED.findall(fused)) == 2
    if "\n" in text:  # each member on its own line, indented as its neighbours
        assert all(",\r\n" in match if "\r\n" in text else ",\n" in match for match in INSERTED.findall(fused))


def test_options_made_where_a_section_has_none(tmp_path, genai_folder):
    config = json.loads((genai_folder / "genai_config.json").read_text())
    del config["model"]["decoder"]["session_options"]
    text = json.dumps(config, indent=4)
    _write(genai_folder, text)
    fused = _fused_config(genai_folder, tmp_path / "out").decode("utf-8")
    assert json.loads(fused) == _with_library(config, ("model", "decoder"), ("model", "vision"))
    added = ',\n            "session_options": {"custom_ops_library": "libort_rmsnorm.so"}'
    assert fused.count(added) == 1
    assert INSERTED.sub("", fused.replace(added, "")) == text


def test_a_large_config_is_edited_not_rewritten(tmp_path, genai_folder):
    """A 3 MB config (a long list in it): the output is the input plus the inserted members, not a re-serialization
    (an indent=4 rewrite of a compact list would be several times larger)."""
    config = json.loads((genai_folder / "genai_config.json").read_text())
    config["search"]["stop_token_ids"] = list(range(400_000))
    text = json.dumps(config, separators=(",", ":"))
    assert len(text) > 2_500_000
    _write(genai_folder, text)
    fused = _fused_config(genai_folder, tmp_path / "out")
    assert len(fused) - len(text) == sum(len(match) for match in INSERTED.findall(fused.decode()))
    assert INSERTED.sub("", fused.decode()) == text


def test_a_key_present_twice_is_edited_where_json_reads_it(tmp_path, genai_folder):
    config = json.loads((genai_folder / "genai_config.json").read_text())
    decoder = json.dumps(config["model"]["decoder"])
    text = json.dumps(config).replace('"decoder": ', f'"decoder": {decoder}, "decoder": ', 1)
    _write(genai_folder, text)
    fused = _fused_config(genai_folder, tmp_path / "out").decode()
    assert json.loads(fused) == _with_library(config, ("model", "decoder"), ("model", "vision"))
    assert INSERTED.sub("", fused) == text


@pytest.mark.parametrize("text, path, key, value", [
    ('{}', (), "a", 1),
    ('{ }', (), "a", [1, 2]),
    ('{"x": {"y": [ {"z": {}} ]}}', ("x", "y", 0, "z"), "a", "b"),
    ('{\n  "a.b": {\n    "c": 1\n  },\n  "[0]": {}\n}\n', ("a.b",), "d", None),
    ('{"a": 1, "a": {"k": 2}}', ("a",), "n", True),
])
def test_insert_member(text, path, key, value):
    from ort_rmsnorm.folders import genai_config

    new_text, offset, inserted = genai_config.insert_member(text, path, key, value)
    assert new_text == text[:offset] + inserted + text[offset:]
    expected = json.loads(text)
    node = expected
    for part in path:
        node = node[part]
    node[key] = value
    assert json.loads(new_text) == expected


def test_path_text():
    from ort_rmsnorm.folders import genai_config

    assert genai_config.path_text(("model", "decoder", "pipeline", 0)) == "model.decoder.pipeline[0]"
    assert genai_config.path_text(("model", "vision.x", "[0]")) == 'model["vision.x"]["[0]"]'


# --- keys taken literally -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("key", ["vision.x", "[0]", "vision[0].session_options", 'a"b'])
def test_section_keys_are_taken_literally(tmp_path, genai_folder, key):
    from ort_rmsnorm.folders.genai_config import path_text

    config = json.loads((genai_folder / "genai_config.json").read_text())
    config["model"][key] = config["model"].pop("vision")
    _write(genai_folder, json.dumps(config, indent=4))
    out = tmp_path / "out"
    report = folders.fuse_folder(genai_folder, out)
    assert json.loads((out / "genai_config.json").read_text()) == _with_library(config, ("model", "decoder"),
                                                                             ("model", key))
    assert f"{path_text(('model', key))}.session_options.custom_ops_library" in " ".join(
        report.config_changes)
    verification = folders.verify_folder(genai_folder, out, dims={"sequence": 3})
    assert verification.ok, verification.describe()


# --- what is refused ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("value, kind", [('"x"', "a string"), ("[]", "a list"), ("null", "null"), ("3", "a number")])
def test_session_options_that_are_not_an_object(tmp_path, genai_folder, value, kind):
    config = json.loads((genai_folder / "genai_config.json").read_text())
    text = json.dumps(config).replace('"session_options": {"log_id": "vision", "provider_options": []}',
                                      f'"session_options": {value}')
    assert text != json.dumps(config)
    _write(genai_folder, text)
    with pytest.raises(folders.FolderError, match=re.escape(f"model.vision.session_options is {kind}, not an object")):
        folders.fuse_folder(genai_folder, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_decoder_that_is_not_an_object(tmp_path, genai_folder):
    config = json.loads((genai_folder / "genai_config.json").read_text())
    config["model"]["decoder"] = ["model.onnx"]
    config["model"]["embedding"]["filename"] = "embedding.onnx"
    _write(genai_folder, json.dumps(config))
    with pytest.raises(folders.FolderError, match=r"model.decoder is a list, where onnxruntime-genai reads the session "
                                                  "options"):
        folders.fuse_folder(genai_folder, tmp_path / "out")


def test_nesting_is_bounded(tmp_path, genai_folder):
    depth = 100_000
    _write(genai_folder, '{"model": {"decoder": {"filename": "model.onnx"}}, "x": ' + "[" * depth + "]" * depth + "}")
    result = run_cli("fuse", genai_folder, tmp_path / "out")
    assert result.returncode == 2 and "Traceback" not in result.stderr and "RecursionError" not in result.stderr
    assert "genai_config.json: nested deeper than the 64 levels this command reads" in result.stderr
    _write(genai_folder, '{"model": {"decoder": {"filename": "model.onnx"}}, "x": ' + "[" * 70 + "]" * 70 + "}")
    with pytest.raises(folders.FolderError, match="nested deeper than the 64 levels"):
        folders.fuse_folder(genai_folder, tmp_path / "out")


def test_size_is_capped(tmp_path, genai_folder):
    path = genai_folder / "genai_config.json"
    with open(path, "r+b") as file:
        file.truncate(64 * 2**20 + 1)  # sparse; over the cap, which is checked before the file is parsed
    with pytest.raises(folders.FolderError,
                       match=r"genai_config.json: over 64 MiB, far more than an onnxruntime-genai config holds"):
        folders.fuse_folder(genai_folder, tmp_path / "out")


@pytest.mark.parametrize("data, message", [
    (b"\xef\xbb\xbf{}", "Unexpected UTF-8 BOM"),
    (b'{"model": "caf\xe9"}', "not UTF-8 text (invalid continuation byte at byte 14)"),
])
def test_encoding(tmp_path, genai_folder, data, message):
    _write(genai_folder, data)
    with pytest.raises(folders.FolderError, match=re.escape(message)):
        folders.fuse_folder(genai_folder, tmp_path / "out")


def test_nul_in_a_filename_is_refused(tmp_path, genai_folder):
    config = json.loads((genai_folder / "genai_config.json").read_text())
    config["model"]["decoder"]["filename"] = "model.onnx\u0000.onnx"
    _write(genai_folder, json.dumps(config))
    with pytest.raises(folders.FolderError, match="not a file name inside the folder"):
        folders.fuse_folder(genai_folder, tmp_path / "out")


def test_unchanged_config_is_copied_byte_for_byte(tmp_path, genai_folder):
    text = (genai_folder / "genai_config.json").read_bytes().replace(b"\n", b"\r\n")
    _write(genai_folder, text)
    folders.fuse_folder(genai_folder, tmp_path / "out", target="ort")
    assert (tmp_path / "out" / "genai_config.json").read_bytes() == text
    shutil.rmtree(tmp_path / "out")
