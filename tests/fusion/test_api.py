"""The public API: ``ort_rmsnorm.fuse`` on a ModelProto / onnx_ir.Model / path, ``fuse_model`` in place on a model
with external data (whose weights the pass never reads), the rules composed with onnxscript's rewriter, the report,
and errors."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import onnx
import onnx_ir as ir
import onnxscript.rewriter
import pytest
from onnx import TensorProto, helper

import ort_rmsnorm
from ort_rmsnorm.model.read import ModelFileError
from fusion.norm_graphs import (
    Spelling,
    assert_close_after_layers,
    assert_close_to_unfused,
    assert_matches_float64,
    fused_nodes,
    norm_model,
    run_fused,
    run_unfused,
)
from fusion.test_residual import llama_block
from ort_rmsnorm.fusion import fuse_model, rules
from reference import random_array


def test_import_stays_cheap():
    """The pass (onnxscript) is imported on first use: after a file's checks, which fail fast without it."""
    code = (
        "import sys, ort_rmsnorm; "
        "assert not {'onnxscript', 'onnx_ir', 'ort_rmsnorm.fusion'} & set(sys.modules), sorted(sys.modules); "
        "assert callable(ort_rmsnorm.fuse) and callable(ort_rmsnorm.fuse_file) and 'onnxscript' not in sys.modules; "
        "assert callable(ort_rmsnorm.fusion.fuse_model) and 'onnxscript' in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_ir_model_in_ir_model_out_input_untouched():
    case = norm_model(Spelling())
    model = ir.serde.deserialize_model(case.model)
    before = ir.serde.serialize_model(model)
    fused, report = ort_rmsnorm.fuse(model)
    assert isinstance(fused, ir.Model) and fused is not model
    assert ir.serde.serialize_model(model) == before
    assert [node.op_type for node in fused.graph].count("RMSNorm") == 1 and len(report.fusions) == 1


def test_path_in_model_proto_out(tmp_path):
    case = norm_model(Spelling())
    path = tmp_path / "model.onnx"
    copy = onnx.ModelProto()
    copy.CopyFrom(case.model)  # onnx.save with external data rewrites the proto it saves
    onnx.save(copy, path, save_as_external_data=True, size_threshold=0)
    fused, report = ort_rmsnorm.fuse(path)
    assert isinstance(fused, onnx.ModelProto) and len(report.fusions) == 1
    assert all(tensor.data_location == onnx.TensorProto.DEFAULT for tensor in fused.graph.initializer)  # loaded
    assert_close_to_unfused(run_fused(fused, case.feeds)[0], run_unfused(case.model, case.feeds)[0])


def test_bad_path_is_an_error_naming_the_file(tmp_path):
    """As `ort-rmsnorm fuse` reports it (it was protobuf's DecodeError, which names no file)."""
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a model")
    with pytest.raises(ModelFileError, match=r"bad\.onnx: not a readable ONNX model"):
        ort_rmsnorm.fuse(bad)
    with pytest.raises(ModelFileError, match=r"absent\.onnx: no such file"):
        ort_rmsnorm.fuse(tmp_path / "absent.onnx")


def test_fuse_model_in_place_never_reads_the_weights(tmp_path, monkeypatch, rng):
    """All tensors external; the pass (with its shape inference) loads none of the weights over 1 KB (the MatMul
    matrices; onnx_ir's shape inference reads initializers under 1 KB), and the saved model keeps them external."""
    model = llama_block(hidden=64)
    source = tmp_path / "llama.onnx"
    onnx.save(llama_block(hidden=64), source, save_as_external_data=True, location="llama.data", size_threshold=0)
    loaded = ir.load(source)
    read: list[tuple[str, int]] = []
    original_load = ir.ExternalTensor._load  # noqa: SLF001 - the one place onnx_ir reads external data

    def recording_load(tensor):
        read.append((tensor.name, tensor.nbytes))
        return original_load(tensor)

    monkeypatch.setattr(ir.ExternalTensor, "_load", recording_load)
    report = fuse_model(loaded)
    monkeypatch.undo()

    assert len(report.fusions) == 5 and report.skipped == []
    assert [name for name, size in read if size > 1024] == [] and read  # small constants only
    out = tmp_path / "fused.onnx"
    ir.save(loaded, out, external_data="fused.data")
    saved = onnx.load(out, load_external_data=False)
    matrices = [tensor for tensor in saved.graph.initializer if len(tensor.dims) == 2]
    assert len(matrices) == 4 and all(tensor.data_location == TensorProto.EXTERNAL for tensor in matrices)
    feeds = {"x": random_array(rng, (2, 3, 64), np.float32)}
    assert_close_after_layers(run_fused(onnx.load(out), feeds)[0], run_unfused(model, feeds)[0])


def test_rules_compose_with_onnxscript_rewriter(rng):
    case = norm_model(Spelling(dtype="float16", upcast=True))
    model = ir.serde.deserialize_model(case.model)
    onnx_ir_shape_inference = ir.passes.common.ShapeInferencePass()
    onnx_ir_shape_inference(model)
    rewritten = onnxscript.rewriter.rewrite(model, pattern_rewrite_rules=rules("custom"))
    proto = ir.serde.serialize_model(rewritten)
    assert len(fused_nodes(proto, "RMSNorm")) == 1 and not fused_nodes(proto, "ReduceMean")
    assert_close_to_unfused(run_fused(proto, case.feeds)[0], run_unfused(case.model, case.feeds)[0])


def test_report_json_and_summary():
    case = norm_model(Spelling(scale_shape=(3, 8), shape=(2, 3, 8)))  # the scale varies along rows: not absorbed
    _, report = ort_rmsnorm.fuse(case.model)
    data = json.loads(report.to_json())
    assert data["target"] == "custom" and data["notes"] == []
    (fusion,) = data["fusions"]
    assert set(fusion) == {
        "op_type",
        "target",
        "node",
        "replaced_nodes",
        "location",
        "axis",
        "epsilon",
        "eps_placement",
        "scale",
        "input_dtype",
        "scale_dtype",
        "skip",
        "rule",
        "converted_from",
        "roundings",
        "choice",
        "derivation",
    }
    assert (fusion["op_type"], fusion["location"], fusion["scale"], fusion["skip"], fusion["converted_from"]) == (
        "ort_rmsnorm.RMSNorm",
        "main graph",
        "none",
        False,
        None,
    )
    assert fusion["roundings"] == []  # a float32 norm: the graph rounds nowhere the fused op does not
    (skipped,) = data["skipped"]
    assert set(skipped) == {"location", "nodes", "reason", "rule", "fused_as"} and skipped["fused_as"] == fusion["node"]
    summary = report.summary()
    assert summary.splitlines()[0] == "RMSNorm fusion (target custom): 1 fused, 1 skipped"
    assert "1 x main graph" in summary and "varies along non-normalized axes" in summary


def test_bad_arguments():
    case = norm_model(Spelling())
    with pytest.raises(ValueError, match="unknown fusion target 'tensorrt'"):
        ort_rmsnorm.fuse(case.model, "tensorrt")
    with pytest.raises(TypeError, match="not bytes"):
        ort_rmsnorm.fuse(case.model.SerializeToString())


def test_other_version_of_our_domain_is_not_mixed():
    case = norm_model(Spelling())
    case.model.opset_import.append(helper.make_opsetid("ort_rmsnorm", 2))
    case.model.graph.node.append(helper.make_node("Future", ["x"], ["future"], name="future", domain="ort_rmsnorm"))
    case.model.graph.output.append(helper.make_tensor_value_info("future", TensorProto.FLOAT, None))
    fused, report = ort_rmsnorm.fuse(case.model)
    assert report.fusions == [] and fused.graph.node == case.model.graph.node
    assert "imports domain 'ort_rmsnorm' version 2" in report.skipped[0].reason


def test_an_unused_import_of_our_domain_is_dropped():
    """onnxruntime writes ``ort_rmsnorm`` 1000 into every model it saves in a process that registered the library."""
    case = norm_model(Spelling())
    case.model.opset_import.append(helper.make_opsetid("ort_rmsnorm", 1000))
    fused, report = ort_rmsnorm.fuse(case.model)
    assert len(report.fusions) == 1 and not report.skipped, report.summary()
    assert {(o.domain, o.version) for o in fused.opset_import if o.domain == "ort_rmsnorm"} == {("ort_rmsnorm", 1)}
    assert report.notes == ["the model imported domain 'ort_rmsnorm' version 1000, which no node uses (onnxruntime "
                            "writes such an import into the models it saves in a process that registered the "
                            "library): dropped"]
    assert_matches_float64(case, run_fused(fused, case.feeds)[0])


def test_everything_else_is_left_as_it_was():
    """Unnamed nodes stay unnamed, absent optional outputs stay absent, value_info is added only for the fused
    node's output (onnxscript's rewriter would rename and annotate; the pass undoes that)."""
    case = norm_model(Spelling())
    model = case.model
    for node in model.graph.node:
        node.ClearField("name")
    model.graph.node.append(helper.make_node("Dropout", ["x"], ["dropped", ""]))
    model.graph.output.append(helper.make_tensor_value_info("dropped", TensorProto.FLOAT, ["B", "S", 8]))
    fused, _ = ort_rmsnorm.fuse(model)
    (norm,) = fused_nodes(fused, "RMSNorm")
    others = [_as_written(node) for node in fused.graph.node if node is not norm]
    assert [
        _as_written(node) for node in model.graph.node if node.op_type in ("Identity", "Shape", "Dropout")
    ] == others
    assert [node.name for node in fused.graph.node if node is not norm] == ["", "", ""]
    weights = {tensor.name for tensor in fused.graph.initializer}  # onnx_ir writes value_info for initializers
    assert [(info.name, info.type) for info in fused.graph.value_info if info.name not in weights] == [
        (norm.output[0], helper.make_tensor_type_proto(TensorProto.FLOAT, ["B", "S", 8]))
    ]
    assert norm.name == "RMSNorm"  # named after the op when the nodes it replaces have no names


def _as_written(node: onnx.NodeProto) -> tuple:
    """A node as its fields say (a trailing absent output, which onnx_ir does not write back, counts as absent)."""
    outputs = list(node.output)
    while outputs and not outputs[-1]:
        outputs.pop()
    return node.op_type, node.domain, node.name, list(node.input), outputs, list(node.attribute)
