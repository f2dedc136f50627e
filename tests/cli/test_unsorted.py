"""Models onnxruntime loads although onnx.checker does not: nodes out of topological order (onnxruntime's own float16
converter writes such), sorted before fusing and said so; a graph that has no order stays refused with the reason."""

from __future__ import annotations

import onnx
from onnx import TensorProto, helper

from ort_rmsnorm.model.read import load_model


def _reversed_nodes(source, destination) -> None:
    model = onnx.load(source)
    nodes = list(model.graph.node)[::-1]
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    onnx.save(model, destination)


def test_unsorted_model_is_sorted_fused_and_verified(cli, digest, small_llama_file, small_llama_config, tmp_path):
    unsorted = tmp_path / "unsorted.onnx"
    _reversed_nodes(small_llama_file, unsorted)
    before = digest(unsorted)
    result = cli("fuse", unsorted, tmp_path / "fused.onnx", "--verify", "--quiet")
    assert result.returncode == 0, result
    assert f"{small_llama_config.norm_count} fused" in result.stdout
    assert "note: unsorted.onnx: its nodes were not in topological order" in result.stdout
    assert "verify: all of 1 outputs match" in result.stdout
    assert digest(unsorted) == before
    onnx.checker.check_model(tmp_path / "fused.onnx")

    notes: list[str] = []
    load_model(unsorted, notes)
    assert len(notes) == 1 and "sorted before fusing" in notes[0]


def test_a_cycle_is_refused_with_the_reason(cli, tmp_path):
    nodes = [helper.make_node("Relu", ["b"], ["a"], name="first"), helper.make_node("Relu", ["a"], ["b"], name="second"),
             helper.make_node("Add", ["x", "a"], ["y"], name="out")]
    graph = helper.make_graph(nodes, "cycle", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    path = tmp_path / "cycle.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), path)
    result = cli("fuse", path, tmp_path / "out.onnx")
    assert result.returncode == 2, result
    assert f"{path}: invalid ONNX model:" in result.stderr and "topologically sorted" in result.stderr
    assert "sorting its nodes failed" in result.stderr
    assert not (tmp_path / "out.onnx").exists()
