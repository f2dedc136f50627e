"""`ort-rmsnorm fuse` on bad input: one clear line on stderr, exit 2, input untouched, no output left behind."""

from __future__ import annotations

import os
import random
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from ort_rmsnorm.model.read import ModelFileError, load_model
from op_models import make_model


def _assert_clean_failure(result, *, expected: list[str], directory: Path, before: set[str]) -> None:
    assert result.returncode == 2, result
    assert "Traceback" not in result.stderr
    # One error line, last; any lines before it are progress lines ("[  0.0s] loading ...").
    *progress, error = result.stderr.strip().splitlines()
    assert error.startswith("ort-rmsnorm fuse: error: "), result.stderr
    assert all(line.startswith("[") for line in progress), result.stderr
    for fragment in expected:
        assert fragment in error, error
    # No output file and no temporary file left in the output directory.
    assert {entry.name for entry in directory.iterdir()} == before


def _corruptions(valid: bytes) -> dict[str, bytes]:
    generator = random.Random(0)
    # Bytes flipped at random mostly land in the weights, which changes values but leaves a valid model (nothing
    # can tell); overwriting the leading field headers breaks the wire format itself.
    return {
        "empty": b"",
        "truncated_10pc": valid[: len(valid) // 10],
        "truncated_half": valid[: len(valid) // 2],
        "truncated_last_byte": valid[:-1],
        "overwritten_header": b"\xff" * 16 + valid[16:],
        "random_bytes": generator.randbytes(4096),
        "text": b"this is a text file, not a model\n" * 20,
        "json": b'{"graph": {"node": []}}',
    }


CORRUPTIONS = list(_corruptions(b"x" * 100))


@pytest.mark.parametrize("kind", CORRUPTIONS)
def test_corrupted_input_is_a_clear_error(cli, digest, small_llama, tmp_path, kind):
    bad = tmp_path / f"{kind}.onnx"
    bad.write_bytes(_corruptions(small_llama.read_bytes())[kind])
    before_hash, before = digest(bad), {entry.name for entry in tmp_path.iterdir()}
    result = cli("fuse", bad, tmp_path / "out.onnx", "--quiet")
    _assert_clean_failure(result, expected=[str(bad)], directory=tmp_path, before=before)
    assert any(word in result.stderr for word in ("not a readable ONNX model", "not an ONNX model", "empty file",
                                                  "invalid ONNX model")), result.stderr
    assert digest(bad) == before_hash


def test_truncations_of_a_model_are_rejected(small_llama, tmp_path):
    """Prefixes of a model file fail to load (in-process, one load per prefix length). The file is nodes, then the
    weights, then the graph's inputs and outputs and the opset imports: a prefix that ends in the tail is the most
    likely to parse, so every length there is tried; the nodes are sampled every 11 bytes, the weights every 997."""
    valid = small_llama.read_bytes()
    weights = sum(len(tensor.raw_data) for tensor in onnx.load(small_llama).graph.initializer)
    head_end, tail_start = len(valid) - weights - 2048, len(valid) - 2048
    lengths = sorted(set(range(1, head_end, 11)) | set(range(head_end, tail_start, 997))
                     | set(range(tail_start, len(valid))))
    bad = tmp_path / "prefix.onnx"
    accepted = []
    for length in lengths:
        bad.write_bytes(valid[:length])
        try:
            load_model(bad)
            accepted.append(length)
        except ModelFileError:
            pass
    assert accepted == []


def test_missing_input(cli, tmp_path):
    result = cli("fuse", tmp_path / "absent.onnx", tmp_path / "out.onnx")
    _assert_clean_failure(result, expected=["absent.onnx", "no such file"], directory=tmp_path, before=set())


def test_directory_as_input(cli, tmp_path):
    """A directory is a model folder (docs/cli.md, "Folders"); one without models is a layout fuse does not know."""
    (tmp_path / "folder.onnx").mkdir()
    result = cli("fuse", tmp_path / "folder.onnx", tmp_path / "out")
    _assert_clean_failure(result, expected=["folder.onnx", "no layout this command knows"], directory=tmp_path,
                          before={"folder.onnx"})


def test_model_rejected_by_the_checker(cli, digest, tmp_path):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])
    graph = helper.make_graph([helper.make_node("Relu", ["undefined"], ["y"], name="relu0")], "g", [x], [y])
    invalid = tmp_path / "invalid.onnx"
    invalid.write_bytes(make_model(graph, [helper.make_opsetid("", 18)]).SerializeToString())
    before_hash = digest(invalid)
    result = cli("fuse", invalid, tmp_path / "out.onnx")
    _assert_clean_failure(result, expected=["invalid.onnx", "invalid ONNX model", "undefined"], directory=tmp_path,
                          before={"invalid.onnx"})
    assert digest(invalid) == before_hash


def _same_file_spellings(model: Path) -> dict[str, Path]:
    symlink = model.with_name("link.onnx")
    symlink.symlink_to(model.name)
    hardlink = model.with_name("hard.onnx")
    os.link(model, hardlink)
    return {
        "same_path": model,
        "other_spelling": model.parent / ".." / model.parent.name / model.name,
        "symlink": symlink,
        "hardlink": hardlink,
    }


@pytest.mark.parametrize("spelling", ["same_path", "other_spelling", "symlink", "hardlink"])
def test_output_equal_to_input_is_refused(cli, digest, small_llama, spelling):
    output = _same_file_spellings(small_llama)[spelling]
    before_hash, before = digest(small_llama), {entry.name for entry in small_llama.parent.iterdir()}
    result = cli("fuse", small_llama, output)
    _assert_clean_failure(result, expected=["refusing to overwrite the input"], directory=small_llama.parent,
                          before=before)
    assert digest(small_llama) == before_hash


def test_output_equal_to_the_input_external_data_is_refused(cli, digest, tmp_path, small_llama):
    onnx.save_model(onnx.load(small_llama), tmp_path / "ext.onnx", save_as_external_data=True, location="weights.bin")
    before_hash, before = digest(tmp_path / "weights.bin"), {entry.name for entry in tmp_path.iterdir()}
    result = cli("fuse", tmp_path / "ext.onnx", tmp_path / "weights.bin")
    _assert_clean_failure(result, expected=["refusing to overwrite the input", "weights.bin"], directory=tmp_path,
                          before=before)
    assert digest(tmp_path / "weights.bin") == before_hash


def test_output_data_file_equal_to_the_input_external_data_is_refused(cli, digest, tmp_path, small_llama):
    """`fuse a.onnx w.onnx` where a.onnx keeps its weights in w.onnx.data: the output's data would replace them."""
    onnx.save_model(onnx.load(small_llama), tmp_path / "a.onnx", save_as_external_data=True, location="w.onnx.data")
    before_hash, before = digest(tmp_path / "w.onnx.data"), {entry.name for entry in tmp_path.iterdir()}
    result = cli("fuse", tmp_path / "a.onnx", tmp_path / "w.onnx", "--quiet")
    _assert_clean_failure(result, expected=["w.onnx.data", "refusing to overwrite the input"], directory=tmp_path,
                          before=before)
    assert digest(tmp_path / "w.onnx.data") == before_hash


def test_missing_external_data_is_a_clear_error(cli, tmp_path, small_llama):
    onnx.save_model(onnx.load(small_llama), tmp_path / "a.onnx", save_as_external_data=True, location="a.data")
    (tmp_path / "a.data").unlink()
    before = {entry.name for entry in tmp_path.iterdir()}
    result = cli("fuse", tmp_path / "a.onnx", tmp_path / "out.onnx")
    _assert_clean_failure(result, expected=["a.data"], directory=tmp_path, before=before)


def test_truncated_external_data_is_a_clear_error(cli, tmp_path, small_llama):
    onnx.save_model(onnx.load(small_llama), tmp_path / "a.onnx", save_as_external_data=True, location="a.data")
    data = tmp_path / "a.data"
    data.write_bytes(data.read_bytes()[: data.stat().st_size // 2])
    before = {entry.name for entry in tmp_path.iterdir()}
    result = cli("fuse", tmp_path / "a.onnx", tmp_path / "out.onnx")
    _assert_clean_failure(result, expected=["a.data", "too short", "truncated"], directory=tmp_path, before=before)


def test_missing_output_directory(cli, small_llama, tmp_path):
    before = {entry.name for entry in tmp_path.iterdir()}
    result = cli("fuse", small_llama, tmp_path / "absent" / "out.onnx", "--quiet")
    _assert_clean_failure(result, expected=["does not exist"], directory=tmp_path, before=before)


def test_report_path_equal_to_input_is_refused(cli, digest, small_llama):
    before_hash, before = digest(small_llama), {entry.name for entry in small_llama.parent.iterdir()}
    result = cli("fuse", small_llama, small_llama.with_name("out.onnx"), "--report", small_llama, "--quiet")
    _assert_clean_failure(result, expected=["refusing to overwrite"], directory=small_llama.parent, before=before)
    assert digest(small_llama) == before_hash


@pytest.mark.parametrize("report", ["absent/report.json", ".", "out.onnx"])
def test_unwritable_report_path_is_refused_before_the_model_is_written(cli, small_llama, tmp_path, report):
    """The model was written first and the report's error came after it, leaving an output behind."""
    before = {entry.name for entry in tmp_path.iterdir()}
    result = cli("fuse", small_llama, tmp_path / "out.onnx", "--report", tmp_path / report, "--quiet")
    expected = {"absent/report.json": "does not exist", ".": "is a directory", "out.onnx": "refusing to overwrite"}
    _assert_clean_failure(result, expected=[expected[report]], directory=tmp_path, before=before)


@pytest.mark.parametrize(
    "arguments, message",
    [
        (["fuse", "in.onnx"], "ort-rmsnorm fuse: error: the following arguments are required: OUT"),
        (["fuse", "in.onnx", "o.onnx", "--target", "nope"], "argument --target: invalid choice: 'nope'"),
        (["frobnicate"], "ort-rmsnorm: error: argument COMMAND: invalid choice: 'frobnicate'"),
        (["fuse", "in.onnx", "o.onnx", "--verify", "--dim", "batch"], "--dim 'batch': expected NAME=VALUE"),
        (["fuse", "in.onnx", "o.onnx", "--dim", "batch=2"], "--dim and --input only set the inputs of --verify"),
        (["fuse", "in.onnx", "o.onnx", "--through-qdq", "--verify"], "--through-qdq drops roundings that IN makes"),
    ],
)
def test_usage_errors_exit_2_with_one_line(cli, tmp_path, arguments, message):
    result = cli(*arguments, cwd=tmp_path)
    assert result.returncode == 2, result
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], result.stderr
    assert not (tmp_path / "o.onnx").exists()


def _simplified_norm_file(tmp_path, functions=()):
    from onnx import numpy_helper

    gamma = numpy_helper.from_array(np.ones(8, np.float32), "gamma")
    node = helper.make_node("SimplifiedLayerNormalization", ["x", "gamma"], ["y"], axis=-1, epsilon=1e-5)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])], [gamma])
    path = tmp_path / "sln.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], functions=list(functions)), path)
    return path


def test_opset_conversion_sets_aside_onnxruntime_ops(cli, tmp_path):
    """onnx's version converter knows no onnxruntime op in the default domain: --convert-opset sets it aside while
    the model is converted, and the norm becomes RMSNormalization."""
    path = _simplified_norm_file(tmp_path)
    result = cli("fuse", path, tmp_path / "out.onnx", "--target", "onnx", "--convert-opset", "--quiet")
    assert result.returncode == 0, result
    assert "1 x SimplifiedLayerNormalization" in result.stdout and "set aside" in result.stdout
    assert [node.op_type for node in onnx.load(tmp_path / "out.onnx").graph.node] == ["RMSNormalization"]


def test_opset_conversion_refused_is_one_line(cli, tmp_path):
    """A model the converter would break (it drops model-local functions): one line naming the file, no
    traceback."""
    function = helper.make_function("local", "Unused", ["a"], ["b"], [helper.make_node("Identity", ["a"], ["b"])],
                                    [helper.make_opsetid("", 18)])
    path = _simplified_norm_file(tmp_path, [function])
    result = cli("fuse", path, tmp_path / "out.onnx", "--target", "onnx", "--convert-opset", "--quiet")
    _assert_clean_failure(result, expected=[f"{path}: onnx's version converter cannot convert a model with "
                                            "model-local functions"],
                          directory=tmp_path, before={"sln.onnx"})