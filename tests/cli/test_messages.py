"""Messages that say what really happened: a model nested beyond protobuf's depth limit is named as such (not as a
corrupted file), and names from a model are printed with control characters escaped, on one line."""

from __future__ import annotations

import onnx
from onnx import TensorProto, helper

from cli.conftest import run_cli
from deploy.genai_folders import simplified_norm_model


def _nested_if(depth: int) -> onnx.ModelProto:
    """A model whose If's then-branch holds an If, ``depth`` levels deep (each level is 3 protobuf messages: graph,
    node, attribute)."""
    output = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])
    body = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "leaf", [], [output])
    for level in range(depth):
        leaf = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], f"else{level}", [], [output])
        body = helper.make_graph([helper.make_node("If", ["c"], ["y"], then_branch=body, else_branch=leaf)],
                                 f"level{level}", [], [output])
    body.input.extend([helper.make_tensor_value_info("c", TensorProto.BOOL, []),
                       helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])])
    return helper.make_model(body, opset_imports=[helper.make_opsetid("", 17)])


def test_if_bodies_nested_beyond_protobufs_limit(tmp_path):
    path = tmp_path / "deep.onnx"
    path.write_bytes(_nested_if(32).SerializeToString())
    result = run_cli("fuse", path, tmp_path / "out.onnx")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    error = result.stderr.strip().splitlines()[-1]
    assert "nest deeper than protobuf's parser allows (100 levels" in error
    assert "If, Loop or Scan body" in error and "corrupted" not in error
    assert not (tmp_path / "out.onnx").exists()


def test_a_nul_in_a_tensor_name_is_printed_escaped(tmp_path):
    """A tensor named with NUL and an escape sequence, whose external data is too short: the error names it
    escaped, on one line."""
    model = simplified_norm_model(0)
    name = "w\x00eight\x1b[2J"
    for tensor in model.graph.initializer:
        if tensor.name == "weight":
            tensor.name = name
    for node in model.graph.node:
        node.input[:] = [name if value == "weight" else value for value in node.input]
    onnx.save_model(model, str(tmp_path / "model.onnx"), save_as_external_data=True, location="model.onnx.data",
                    size_threshold=1024)
    with open(tmp_path / "model.onnx.data", "r+b") as file:
        file.truncate(100)
    result = run_cli("fuse", tmp_path / "model.onnx", tmp_path / "out.onnx", "--quiet")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "\x00" not in result.stderr and "\x1b" not in result.stderr
    assert result.stderr.count("\n") == 1
    assert "w\\x00eight\\x1b[2J" in result.stderr


def test_printable():
    from ort_rmsnorm.command_line import printable

    assert printable("plain caf\u00e9 \u2603") == "plain caf\u00e9 \u2603"
    assert printable("a\x00b\nc\td\x7f\x85") == "a\\x00b\\nc\\td\\x7f\\x85"
    assert printable("file\udcff.onnx") == "file\\udcff.onnx"  # an undecodable byte of a file name
    assert printable("abc\u202edcba") == "abc\\u202edcba"  # a right-to-left override
