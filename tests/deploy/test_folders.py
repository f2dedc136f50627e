"""`ort-rmsnorm fuse IN_DIR OUT_DIR` and `verify IN_DIR OUT_DIR` on folders made with onnx.helper (no genai needed).

Every command runs from the session's empty working directory, not the models' folder: external data must resolve
against each model's own folder.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import numpy as np
import onnx
import pytest

import ort_rmsnorm
from deploy.conftest import run_cli, tree_digest
from deploy.genai_folders import simplified_norm_model
from ort_rmsnorm import durable, folders
from ort_rmsnorm.model.write import save_model
from ort_rmsnorm.builders.genai import norm_ops

LIBRARY = Path(ort_rmsnorm.get_library_path()).name
MANIFEST = folders.MANIFEST


def _config(folder: Path) -> dict:
    return json.loads((folder / "genai_config.json").read_text())


def _domains(path: Path) -> set[str]:
    return {node.domain for node in onnx.load(str(path), load_external_data=False).graph.node}


def _leftovers(parent: Path) -> list[str]:
    return sorted(name for name in os.listdir(parent) if name.startswith("."))


# --- genai folders ------------------------------------------------------------------------------------------------


def test_genai_folder_is_fused_whole(onnx_genai_folder, tmp_path):
    before = tree_digest(onnx_genai_folder)
    out = tmp_path / "out"
    result = run_cli("fuse", onnx_genai_folder, out, "--report", tmp_path / "report.json")
    assert result.returncode == 0, result.stderr
    assert tree_digest(onnx_genai_folder) == before  # the input is only read

    # Each model the config names is fused; the others and every other file are copied byte for byte.
    after = tree_digest(out)
    assert set(after) == set(before) | {LIBRARY, MANIFEST}
    for copied in ("unnamed.onnx", "tokenizer.json", "processor_config.json", "extras/notes.txt"):
        assert after[copied] == before[copied], copied
    assert norm_ops(out / "model.onnx") == {"ort_rmsnorm.RMSNorm": 1, "ort_rmsnorm.SkipRMSNorm": 4}
    for name in ("embedding.onnx", "vision.onnx"):
        assert norm_ops(out / name) == {"ort_rmsnorm.RMSNorm": 1}, name
    assert norm_ops(out / "unnamed.onnx") == {"SimplifiedLayerNormalization": 1}
    # External data stays external, next to each model under its name.
    assert (out / "model.onnx.data").is_file() and (out / "vision.onnx.data").is_file()
    assert not (out / "embedding.onnx.data").exists()
    assert after[LIBRARY] == tree_digest(Path(ort_rmsnorm.get_library_path()).parent)[LIBRARY]

    # The decoder's options serve the decoder and the embedding (which has none of its own); vision has its own.
    config, original = _config(out), _config(onnx_genai_folder)
    assert config["model"]["decoder"]["session_options"]["custom_ops_library"] == LIBRARY
    assert config["model"]["vision"]["session_options"]["custom_ops_library"] == LIBRARY
    assert "session_options" not in config["model"]["embedding"]
    for section in ("decoder", "vision"):
        del config["model"][section]["session_options"]["custom_ops_library"]
    assert config == original  # nothing else changed

    assert "model.decoder.session_options.custom_ops_library" in result.stdout
    assert "model.vision.session_options.custom_ops_library" in result.stdout
    for name in ("model.onnx", "embedding.onnx", "vision.onnx"):
        assert f"{name}:" in result.stdout and f"fusing {name}" in result.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["kind"] == folders.KIND_GENAI and report["library"] == LIBRARY
    assert set(report["models"]) == {"model.onnx", "embedding.onnx", "vision.onnx"}
    assert len(report["models"]["model.onnx"]["fusions"]) == 5
    assert report["models"]["vision.onnx"]["fusions"][0]["converted_from"] == "SimplifiedLayerNormalization"
    assert report["models"]["vision.onnx"]["external_data"] == "vision.onnx.data"
    assert "unnamed.onnx" in report["copied"]

    verified = run_cli("verify", onnx_genai_folder, out, "--dim", "sequence=6")
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert "verify: all of 3 models match" in verified.stdout


def test_fuse_then_verify_in_one_command(onnx_genai_folder, tmp_path):
    result = run_cli("fuse", onnx_genai_folder, tmp_path / "out", "--verify", "--quiet")
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stderr == ""
    assert "verify: all of 3 models match" in result.stdout


def test_python_api(onnx_genai_folder, tmp_path):
    lines: list[str] = []
    report = ort_rmsnorm.fuse_folder(onnx_genai_folder, tmp_path / "out", progress=lines.append)
    assert [result.path for result in report.models] == ["model.onnx", "embedding.onnx", "vision.onnx"]
    assert all(result.uses_library for result in report.models)
    assert any("loading vision.onnx" in line for line in lines)
    assert "vision.onnx:" in report.summary()
    verification = ort_rmsnorm.verify_folder(onnx_genai_folder, tmp_path / "out")
    assert verification.ok, verification.describe()


@pytest.mark.parametrize("target", ["ort", "onnx"])
def test_targets_without_library(onnx_genai_folder, tmp_path, target):
    """The built-in targets need no library: none is copied and the config is the input's, byte for byte."""
    out = tmp_path / "out"
    result = run_cli("fuse", onnx_genai_folder, out, "--target", target)
    assert result.returncode == 0, result.stderr
    assert not (out / LIBRARY).exists()
    assert (out / "genai_config.json").read_bytes() == (onnx_genai_folder / "genai_config.json").read_bytes()
    for name in ("model.onnx", "embedding.onnx", "vision.onnx"):
        assert ort_rmsnorm.OP_DOMAIN not in _domains(out / name), name


def test_opset_conversion_failure_names_the_model(onnx_genai_folder, tmp_path):
    """onnx's version converter drops model-local functions, so a model with one is refused: the error names the
    model of the folder it failed on, and nothing is written."""
    path = onnx_genai_folder / "embedding.onnx"
    model = onnx.load(path)
    model.functions.append(onnx.helper.make_function("local", "Twice", ["a"], ["b"],
                                                     [onnx.helper.make_node("Add", ["a", "a"], ["b"])],
                                                     [onnx.helper.make_opsetid("", 17)]))
    model.opset_import.append(onnx.helper.make_opsetid("local", 1))
    onnx.save(model, path)
    result = run_cli("fuse", onnx_genai_folder, tmp_path / "out", "--target", "onnx", "--convert-opset")
    assert result.returncode == 2, result
    assert ("embedding.onnx: onnx's version converter cannot convert a model with model-local functions "
            "(local::Twice)") in result.stderr, result.stderr
    assert not (tmp_path / "out").exists() and _leftovers(tmp_path) == []


def test_opset_conversion_sets_onnxruntime_ops_aside(onnx_genai_folder, tmp_path):
    """onnx's version converter knows no SimplifiedLayerNormalization (onnxruntime's, in the default domain): the
    folder converts with those set aside, each converted after or reported."""
    result = run_cli("fuse", onnx_genai_folder, tmp_path / "out", "--target", "onnx", "--convert-opset")
    assert result.returncode == 0, result
    assert "set aside while it converted the model" in result.stdout, result.stdout


def test_nothing_fused_copies_no_library(tmp_path):
    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "genai_config.json").write_text(json.dumps({"model": {"decoder": {"filename": "model.onnx"}}}))
    model = simplified_norm_model(0)
    del model.graph.node[0]  # the MatMul alone: no norm
    model.graph.node[0].input[0] = "x"
    save_model(model, folder / "model.onnx")
    report = folders.fuse_folder(folder, tmp_path / "out")
    assert report.library is None and not report.config_changes
    assert not (tmp_path / "out" / LIBRARY).exists()


def test_existing_library_key(onnx_genai_folder, tmp_path):
    config = _config(onnx_genai_folder)
    config["model"]["vision"]["session_options"]["custom_ops_library"] = LIBRARY
    (onnx_genai_folder / "genai_config.json").write_text(json.dumps(config))
    report = folders.fuse_folder(onnx_genai_folder, tmp_path / "out")
    assert report.config_changes == [f'model.decoder.session_options.custom_ops_library = "{LIBRARY}"']

    config["model"]["vision"]["session_options"]["custom_ops_library"] = "libother_ops.so"
    (onnx_genai_folder / "genai_config.json").write_text(json.dumps(config))
    result = run_cli("fuse", onnx_genai_folder, tmp_path / "out2")
    assert result.returncode == 2
    assert "model.vision.session_options.custom_ops_library is already 'libother_ops.so'" in result.stderr
    assert not (tmp_path / "out2").exists() and _leftovers(tmp_path) == []


def test_pipeline_and_shared_data(tmp_path):
    """Pipeline stages are fused (their own options where they have them); a data file the config names is kept."""
    folder = tmp_path / "in"
    folder.mkdir()
    onnx.save_model(simplified_norm_model(0), str(folder / "stage0.onnx"), save_as_external_data=True,
                    location="shared.bin", size_threshold=1024)
    save_model(simplified_norm_model(1), folder / "stage1.onnx")
    shared = (folder / "shared.bin").read_bytes()
    pipeline = [{"model_id": "stage0", "filename": "stage0.onnx"},
                {"model_id": "stage1", "filename": "stage1.onnx", "session_options": {"log_id": "stage1"}}]
    config = {"model": {"decoder": {"session_options": {}, "pipeline": pipeline,
                                    "shared_initializers": [{"name": "w", "data_file": "shared.bin"}]}}}
    (folder / "genai_config.json").write_text(json.dumps(config))
    report = folders.fuse_folder(folder, tmp_path / "out")
    assert [result.path for result in report.models] == ["stage0.onnx", "stage1.onnx"]
    assert sorted(report.config_changes) == [
        f'model.decoder.pipeline[1].session_options.custom_ops_library = "{LIBRARY}"',
        f'model.decoder.session_options.custom_ops_library = "{LIBRARY}"',
    ]
    assert (tmp_path / "out" / "shared.bin").read_bytes() == shared
    assert report.models[0].external_data == "stage0.onnx.data"


# --- other folders ------------------------------------------------------------------------------------------------


def test_onnx_folder(onnx_folder, tmp_path):
    before = tree_digest(onnx_folder)
    out = tmp_path / "out"
    result = run_cli("fuse", onnx_folder, out)
    assert result.returncode == 0, result.stderr
    assert tree_digest(onnx_folder) == before
    after = tree_digest(out)
    assert set(after) == set(before) | {LIBRARY, MANIFEST}
    assert after["config.json"] == before["config.json"]
    assert norm_ops(out / "decoder_model_merged.onnx") == {"ort_rmsnorm.RMSNorm": 1, "ort_rmsnorm.SkipRMSNorm": 2}
    assert norm_ops(out / "onnx" / "encoder_model.onnx") == {"ort_rmsnorm.RMSNorm": 1}
    assert not (out / "genai_config.json").exists()
    assert "3 models" in result.stdout.splitlines()[0]

    verified = run_cli("verify", onnx_folder, out)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert "verify: all of 3 models match" in verified.stdout


def test_external_data_under_another_name(tmp_path):
    """A data file named otherwise (optimum's model.onnx_data) is replaced by the fused model's own."""
    folder = tmp_path / "in"
    folder.mkdir()
    model = simplified_norm_model(0)
    onnx.save_model(model, str(folder / "model.onnx"), save_as_external_data=True, location="model.onnx_data",
                    size_threshold=1024)
    report = folders.fuse_folder(folder, tmp_path / "out")
    assert report.models[0].external_data == "model.onnx.data"
    assert sorted(os.listdir(tmp_path / "out")) == sorted([LIBRARY, MANIFEST, "model.onnx", "model.onnx.data"])
    assert folders.verify_folder(folder, tmp_path / "out").ok


# --- the output folder --------------------------------------------------------------------------------------------


def test_existing_output_folder(onnx_folder, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    assert run_cli("fuse", onnx_folder, out).returncode == 0  # an empty folder is taken
    (out / "model.onnx").unlink()  # a folder fuse wrote, one file removed since: still its own
    before = tree_digest(out)
    result = run_cli("fuse", onnx_folder, out)
    assert result.returncode == 2
    assert "exists and is not empty" in result.stderr and "--replace" in result.stderr
    assert tree_digest(out) == before

    replaced = run_cli("fuse", onnx_folder, out, "--replace")
    assert replaced.returncode == 0, replaced.stderr
    assert (out / "model.onnx").is_file()
    assert _leftovers(tmp_path) == []


def test_failure_leaves_nothing(onnx_folder, tmp_path):
    """A model that cannot be read stops the command before anything is written; an existing output is kept."""
    (onnx_folder / "onnx" / "broken.onnx").write_bytes(b"not a model")
    out = tmp_path / "out"
    result = run_cli("fuse", onnx_folder, out)
    assert result.returncode == 2 and "broken.onnx" in result.stderr
    assert not out.exists() and _leftovers(tmp_path) == []

    (onnx_folder / "onnx" / "broken.onnx").rename(tmp_path / "broken.onnx")
    assert run_cli("fuse", onnx_folder, out).returncode == 0
    (tmp_path / "broken.onnx").rename(onnx_folder / "onnx" / "broken.onnx")
    before = tree_digest(out)
    assert run_cli("fuse", onnx_folder, out, "--replace").returncode == 2
    assert tree_digest(out) == before and _leftovers(tmp_path) == []


def test_interrupted_write_leaves_nothing(onnx_folder, tmp_path, monkeypatch):
    def fail(*_args, **_kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(folders.fuse, "_publish", fail)
    with pytest.raises(KeyboardInterrupt):
        folders.fuse_folder(onnx_folder, tmp_path / "out")
    assert not (tmp_path / "out").exists() and _leftovers(tmp_path) == []


def test_replace_without_exchange(onnx_folder, tmp_path, monkeypatch):
    """Where the system cannot swap two folders in one step, the old one is moved aside first, then removed."""
    monkeypatch.setattr(durable, "exchange", lambda _first, _second: False)
    out = tmp_path / "out"
    folders.fuse_folder(onnx_folder, out)
    (onnx_folder / "config.json").unlink()
    report = folders.fuse_folder(onnx_folder, out, replace=True)
    assert not (out / "config.json").exists() and (out / "model.onnx").is_file()
    assert report.notes == [] and _leftovers(tmp_path) == []


@pytest.mark.parametrize("where", ["same", "inside", "parent", "same, spelled with .."])
def test_output_may_not_touch_the_input(onnx_folder, where):
    out = {"same": onnx_folder, "inside": onnx_folder / "fused", "parent": onnx_folder.parent,
           "same, spelled with ..": onnx_folder / "onnx" / ".."}[where]
    before = tree_digest(onnx_folder)
    with pytest.raises(folders.FolderError, match="input folder"):
        folders.fuse_folder(onnx_folder, out, replace=True)
    assert tree_digest(onnx_folder) == before


def test_output_may_not_touch_the_input_on_the_command_line(onnx_folder):
    result = run_cli("fuse", onnx_folder, onnx_folder / "fused")
    assert result.returncode == 2 and "may not be the input folder" in result.stderr
    assert not (onnx_folder / "fused").exists()


def test_report_may_not_go_into_the_folders(onnx_folder, tmp_path):
    result = run_cli("fuse", onnx_folder, tmp_path / "out", "--report", tmp_path / "out" / "report.json")
    assert result.returncode == 2 and "--report" in result.stderr
    assert not (tmp_path / "out").exists()


def test_replace_is_for_folders(tmp_path):
    save_model(simplified_norm_model(0), tmp_path / "model.onnx")
    result = run_cli("fuse", tmp_path / "model.onnx", tmp_path / "fused.onnx", "--replace")
    assert result.returncode == 2 and "--replace is for folders" in result.stderr


# --- layouts it does not know -------------------------------------------------------------------------------------


def _genai_folder_with(tmp_path: Path, config_text: str) -> Path:
    folder = tmp_path / "in"
    folder.mkdir()
    save_model(simplified_norm_model(0), folder / "model.onnx")
    (folder / "genai_config.json").write_text(config_text)
    return folder


@pytest.mark.parametrize("config_text, message", [
    ("{not json", "genai_config.json: not valid JSON"),
    ('{"search": {}}', 'no "model" object'),
    ('{"model": {"decoder": {"hidden_size": 8}}}', "names no .onnx file"),
    ('{"model": {"decoder": {"filename": "missing.onnx"}}}', "model.decoder.filename is 'missing.onnx', but"),
    ('{"model": {"decoder": {"filename": "../model.onnx"}}}', "not a file name inside the folder"),
    ('{"model": {"decoder": {"filename": "/etc/model.onnx"}}}', "not a file name inside the folder"),
])
def test_bad_genai_config(tmp_path, config_text, message):
    folder = _genai_folder_with(tmp_path, config_text)
    with pytest.raises(folders.FolderError, match=re.escape(message)):
        folders.fuse_folder(folder, tmp_path / "out")
    assert not (tmp_path / "out").exists() and _leftovers(tmp_path) == []


def test_bad_genai_config_on_the_command_line(tmp_path):
    folder = _genai_folder_with(tmp_path, '{"model": {"decoder": {"filename": "missing.onnx"}}}')
    result = run_cli("fuse", folder, tmp_path / "out")
    assert result.returncode == 2
    assert result.stderr.startswith("ort-rmsnorm fuse: error: ") and result.stderr.count("\n") == 1, result.stderr
    assert "missing.onnx" in result.stderr


def test_unknown_layout(tmp_path):
    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "weights.safetensors").write_bytes(b"\0")
    result = run_cli("fuse", folder, tmp_path / "out")
    assert result.returncode == 2
    assert "no layout this command knows" in result.stderr
    assert run_cli("verify", folder, tmp_path).returncode == 2


# --- verify -------------------------------------------------------------------------------------------------------


def test_verify_finds_a_changed_model(onnx_folder, tmp_path):
    out = tmp_path / "out"
    folders.fuse_folder(onnx_folder, out)
    model = onnx.load(str(out / "model.onnx"))
    for tensor in model.graph.initializer:
        if tensor.name == "weight":
            tensor.CopyFrom(onnx.numpy_helper.from_array(2 * onnx.numpy_helper.to_array(tensor), "weight"))
    onnx.save_model(model, str(out / "model.onnx"))
    result = run_cli("verify", onnx_folder, out)
    assert result.returncode == 1
    assert "MISMATCH" in result.stdout and "verify: 2 of 3 models match" in result.stdout


def test_verify_finds_a_missing_model_and_library(onnx_genai_folder, tmp_path):
    out = tmp_path / "out"
    folders.fuse_folder(onnx_genai_folder, out)
    (out / LIBRARY).unlink()
    (out / "embedding.onnx").unlink()
    result = run_cli("verify", onnx_genai_folder, out)
    assert result.returncode == 1
    assert "embedding.onnx: no such file in the fused folder" in result.stdout
    assert f"custom_ops_library is '{LIBRARY}', which is not a file in" in result.stdout


def test_verify_options_per_model(onnx_genai_folder, tmp_path):
    """--dim and --input go to the models that have them; a name no model has is an error."""
    out = tmp_path / "out"
    folders.fuse_folder(onnx_genai_folder, out)
    np.save(tmp_path / "x.npy", np.ones((2, 5, 64), np.float32))
    ok = run_cli("verify", onnx_genai_folder, out, "--input", f"x={tmp_path / 'x.npy'}", "--dim", "sequence=5")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "x float32 [2, 5, 64]" in ok.stdout and "input_ids int64 [2, 5]" in ok.stdout
    bad = run_cli("verify", onnx_genai_folder, out, "--dim", "nonexistent=3")
    assert bad.returncode == 2 and "--dim nonexistent: no model of" in bad.stderr
