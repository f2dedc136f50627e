"""The ONNX schemas of our ops: registered by ``register_schemas()`` and by what fuses, verifies or runs tools (never
by ``import ort_rmsnorm`` alone, which neither imports onnx nor hooks other imports); onnx's shape inference types
every value of a fused model whose stored types were removed; the checker validates attributes; a node that breaks
the contract is an error in onnx exactly where onnxruntime refuses it too."""

from __future__ import annotations

import math

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import ort_rmsnorm
from ort_rmsnorm import runtime, schemas
from ort_rmsnorm.contract import DEFAULT_EPSILON, NORMALIZE_FLOAT32_SUM
from tools.tool_models import op_model, our_nodes, run_python

FLOAT, FLOAT16, BFLOAT16 = TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16
needs_inference = pytest.mark.skipif(
    not hasattr(onnx.defs.OpSchema, "set_type_and_shape_inference_function"),
    reason=f"onnx {onnx.__version__} takes no inference function from Python (1.19 does): the schemas have none")
# The (X, scale) pairs the library has kernels for (docs/ops.md).
TYPE_PAIRS = [(FLOAT, FLOAT), (FLOAT16, FLOAT16), (FLOAT16, FLOAT), (BFLOAT16, BFLOAT16), (BFLOAT16, FLOAT)]


def _inferred(model: onnx.ModelProto, strict: bool = True, data_prop: bool = False) -> dict[str, onnx.TypeProto]:
    result = onnx.shape_inference.infer_shapes(model, strict_mode=strict, check_type=True, data_prop=data_prop)
    return {info.name: info.type for info in (*result.graph.value_info, *result.graph.output)}


def _dims(type_proto: onnx.TypeProto) -> list:
    return [dim.dim_value if dim.HasField("dim_value") else dim.dim_param for dim in type_proto.tensor_type.shape.dim]


# ---- registration ---------------------------------------------------------------------------------------------


@needs_inference
def test_registered_with_the_attributes_of_the_contract():
    assert ort_rmsnorm.register_schemas() and ort_rmsnorm.register_schemas()  # idempotent
    assert "with type and shape inference" in schemas.schema_note()
    expected = {"axis": (onnx.defs.OpSchema.AttrType.INT, -1), "epsilon": (onnx.defs.OpSchema.AttrType.FLOAT,
                                                                          DEFAULT_EPSILON),
                "eps_outside_sqrt": (onnx.defs.OpSchema.AttrType.INT, 0)}
    for op, extra in (("RMSNorm", {}), ("SkipRMSNorm", {NORMALIZE_FLOAT32_SUM: (onnx.defs.OpSchema.AttrType.INT, 0)})):
        schema = onnx.defs.get_schema(op, 1, ort_rmsnorm.OP_DOMAIN)
        found = {}
        for name, attribute in schema.attributes.items():
            value = helper.get_attribute_value(attribute.default_value)
            found[name] = (attribute.type, value)
            assert not attribute.required
        assert found.keys() == {**expected, **extra}.keys()
        for name, (kind, default) in {**expected, **extra}.items():
            assert found[name][0] == kind and math.isclose(found[name][1], default, rel_tol=1e-7), name
        constraints = {c.type_param_str: set(c.allowed_type_strs) for c in schema.type_constraints}
        assert constraints == {"T": set(schemas.FLOAT_TYPES), "V": set(schemas.FLOAT_TYPES)}
    skip = onnx.defs.get_schema("SkipRMSNorm", 1, ort_rmsnorm.OP_DOMAIN)
    assert [p.name for p in skip.inputs] == ["X", "skip", "scale", "bias"]
    assert [p.name for p in skip.outputs] == ["Y", "sum"]


_REGISTERED = "import onnx.defs; print(onnx.defs.has('SkipRMSNorm', 'ort_rmsnorm'))"


@pytest.mark.parametrize("first", ["ort_rmsnorm", "onnx"])
def test_importing_the_package_registers_nothing_and_hooks_no_import(first, tmp_path):
    """In either order: onnx keeps its own loader, sys.meta_path is as it was, the schemas wait for
    register_schemas()."""
    code = f"""
import sys
finders = list(sys.meta_path)
import {first}
import {'onnx' if first == 'ort_rmsnorm' else 'ort_rmsnorm'}
import importlib.resources, onnx
import ort_rmsnorm
assert sys.meta_path == finders, (finders, sys.meta_path)
assert 'ort_rmsnorm' not in type(onnx.__loader__).__module__, onnx.__loader__
assert onnx.__spec__.loader is onnx.__loader__
assert importlib.resources.files('onnx').is_dir()
{_REGISTERED}
print(ort_rmsnorm.register_schemas())
{_REGISTERED}
"""
    completed = run_python(code, tmp_path)
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.split() == ["False", "True", "True"]


def test_registering_before_onnx_is_imported_imports_it(tmp_path):
    code = f"import sys, ort_rmsnorm; print(ort_rmsnorm.register_schemas(), 'onnx' in sys.modules); {_REGISTERED}"
    completed = run_python(code, tmp_path)
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.split() == ["True", "True", "True"]


_TINY_MODEL = """
import onnx
from onnx import TensorProto, helper
model = helper.make_model(helper.make_graph(
    [helper.make_node("Relu", ["x"], ["y"])], "tiny",
    [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
    [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])]), opset_imports=[helper.make_opsetid("", 18)])
model.ir_version = 8
onnx.save(model, "model.onnx")
"""

# What registers the schemas: each entry point that may run onnx on our ops, public API and command line.
_REGISTERING_CALLS = {
    "fuse": "ort_rmsnorm.fuse(model)",
    "fuse_file": "ort_rmsnorm.fuse_file('model.onnx', 'fused.onnx')",
    "verify": "from ort_rmsnorm.verify import verify; verify('model.onnx', 'model.onnx')",
    "fuse_folder": "import os, shutil; os.mkdir('in'); shutil.copy('model.onnx', 'in'); "
                   "ort_rmsnorm.fuse_folder('in', 'out')",
    "verify_folder": "import os, shutil; os.mkdir('a'); shutil.copy('model.onnx', 'a'); "
                     "ort_rmsnorm.verify_folder('a', 'a')",
    "everywhere": "with ort_rmsnorm.everywhere(): pass",
    "cli fuse": "from ort_rmsnorm.cli import main; assert main(['fuse', 'model.onnx', 'fused.onnx']) == 0",
    "cli verify": "from ort_rmsnorm.cli import main; assert main(['verify', 'model.onnx', 'model.onnx']) == 0",
}


@pytest.mark.parametrize("call", _REGISTERING_CALLS)
def test_registered_by_what_fuses_verifies_or_runs_tools(call, tmp_path):
    code = f"""
{_TINY_MODEL}
import ort_rmsnorm
{_REGISTERED.replace("print(", "print('before:', ")}
{_REGISTERING_CALLS[call]}
{_REGISTERED.replace("print(", "print('after:', ")}
"""
    completed = run_python(code, tmp_path)
    assert completed.returncode == 0, completed.stderr
    said = [line for line in completed.stdout.splitlines() if line.startswith(("before:", "after:"))]
    assert said == ["before: False", "after: True"], completed.stdout


def test_importing_the_package_does_not_import_onnx(tmp_path):
    completed = run_python("import sys, ort_rmsnorm; print('onnx' in sys.modules, 'onnx.defs' in sys.modules)",
                           tmp_path)
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.split() == ["False", "False"]


@needs_inference
def test_an_onnx_without_python_inference_functions_gets_the_schemas_without_them(tmp_path):
    """onnx 1.18 (the oldest allowed) has register_schema but takes no inference function from Python."""
    code = """
import onnx.defs
del onnx.defs.OpSchema.set_type_and_shape_inference_function
import ort_rmsnorm
from ort_rmsnorm import schemas
print(ort_rmsnorm.register_schemas(), onnx.defs.has('RMSNorm', 'ort_rmsnorm'))
print(schemas.schema_note())
"""
    completed = run_python(code, tmp_path)
    assert completed.returncode == 0, completed.stderr
    lines = completed.stdout.splitlines()
    assert lines[0] == "True True"
    assert "without type inference" in lines[1] and "onnx >= 1.19" in lines[1]


def test_someone_elses_schema_of_the_same_name_is_kept(tmp_path):
    code = """
import onnx, onnx.defs
schema = onnx.defs.OpSchema('RMSNorm', 'ort_rmsnorm', 1, 'theirs',
                            inputs=[onnx.defs.OpSchema.FormalParameter('X', 'tensor(float)')],
                            outputs=[onnx.defs.OpSchema.FormalParameter('Y', 'tensor(float)')])
onnx.defs.register_schema(schema)
import ort_rmsnorm
from ort_rmsnorm import schemas
print(ort_rmsnorm.register_schemas(), onnx.defs.get_schema('RMSNorm', 1, 'ort_rmsnorm').doc)
print(schemas.schema_note())
"""
    completed = run_python(code, tmp_path)
    assert completed.returncode == 0, completed.stderr
    lines = completed.stdout.splitlines()
    assert lines[0] == "False theirs"
    assert "another schema for RMSNorm" in lines[1] and "kept" in lines[1]


def test_info_says_whether_the_schemas_are_registered(tmp_path):
    completed = run_python("from ort_rmsnorm.cli import main; main(['info'])", tmp_path)
    assert completed.returncode == 0, completed.stderr
    (line,) = [line for line in completed.stdout.splitlines() if line.startswith("onnx schemas:")]
    assert "RMSNorm and SkipRMSNorm" in line and "registered" in line


# ---- shape inference on fused models --------------------------------------------------------------------------


@needs_inference
def test_every_value_of_a_fused_model_is_typed_again(llama_models):
    """The demo's fused model with its stored value_info removed (as tools drop it): onnx's strict inference types
    every value again, each exactly as it was stored before (the builder's inference of the unfused model)."""
    fused = onnx.load(str(llama_models["float"].fused))
    stored = {info.name: info.type for info in (*fused.graph.value_info, *fused.graph.output)}
    fused.graph.ClearField("value_info")
    inferred = _inferred(fused, data_prop=True)  # as the builder inferred them (the causal mask's shape)
    outputs = [name for node in fused.graph.node for name in node.output if name]
    assert not [name for name in outputs if name not in inferred], "values left untyped"
    nodes = our_nodes(fused)
    assert sorted(node.op_type for node in nodes) == ["RMSNorm"] + ["SkipRMSNorm"] * 4
    assert sum(1 for node in nodes for name in node.output if name) == 8  # 5 Y, and the sum of all but the last
    for name in outputs:
        if name in stored:
            assert inferred[name] == stored[name], name
    for node in nodes:
        x = inferred.get(node.input[0]) or next(i.type for i in fused.graph.input if i.name == node.input[0])
        for name in node.output:
            assert inferred[name].tensor_type.elem_type == x.tensor_type.elem_type
            assert _dims(inferred[name]) == _dims(x) == ["batch", "sequence", 64]


@needs_inference
def test_int4_fused_model_our_outputs_typed(llama_models):
    """After MatMulNBits (onnxruntime's contrib op, which onnx does not know) onnx's inference stops; our ops are
    typed wherever their inputs are."""
    if "int4" not in llama_models:
        pytest.skip("onnxruntime's int4 quantizer is not available")
    fused = onnx.load(str(llama_models["int4"].fused))
    fused.graph.ClearField("value_info")
    inferred = _inferred(fused)
    first = our_nodes(fused)[0]
    assert first.op_type == "RMSNorm" and _dims(inferred[first.output[0]]) == ["batch", "sequence", 64]


@needs_inference
@pytest.mark.parametrize(("x_type", "scale_type"), TYPE_PAIRS)
@pytest.mark.parametrize("op", ["RMSNorm", "SkipRMSNorm"])
def test_types_and_shapes_of_every_type_pair(op, x_type, scale_type):
    outputs = ("y", "sum") if op == "SkipRMSNorm" else ("y",)
    bias = {"bias_type": x_type, "bias_shape": (8,)} if op == "SkipRMSNorm" else {}
    inferred = _inferred(op_model(op, x_type, scale_type=scale_type, outputs=outputs, **bias))
    for name in outputs:
        assert inferred[name].tensor_type.elem_type == x_type
        assert _dims(inferred[name]) == ["batch", "sequence", 8]
    onnx.checker.check_model(op_model(op, x_type, scale_type=scale_type, outputs=outputs, output_types=True, **bias),
                             full_check=True)


@needs_inference
def test_skip_fills_in_what_x_does_not_say():
    model = op_model("SkipRMSNorm", x_shape=("batch", None, 8), skip_shape=(2, "sequence", None), outputs=("y",))
    assert _dims(_inferred(model)["y"]) == [2, "sequence", 8]


@needs_inference
def test_omitted_and_empty_sum_output():
    for outputs in (("y",), ("y", "")):
        model = op_model("SkipRMSNorm", outputs=outputs)
        assert _dims(_inferred(model)["y"]) == ["batch", "sequence", 8]


def test_unknown_input_type_leaves_the_output_untyped():
    model = op_model("RMSNorm", x_shape=None)
    model.graph.input[0].type.tensor_type.elem_type = TensorProto.UNDEFINED
    inferred = onnx.shape_inference.infer_shapes(model)
    assert inferred.graph.output[0].type.tensor_type.elem_type == TensorProto.UNDEFINED


@needs_inference
@pytest.mark.parametrize(("axis", "scale_shape"),
                         [(-1, (1,)), (-2, (4, 8)), (-2, (4, 1)), (-2, (1, 1, 8)), (0, (2, 4, 8))])
def test_valid_broadcasts(axis, scale_shape):
    model = op_model("RMSNorm", x_shape=(2, 4, 8), scale_type=FLOAT, scale_shape=scale_shape,
                     attributes={"axis": axis})
    assert _dims(_inferred(model)["y"]) == [2, 4, 8]
    runtime.make_session(model)  # onnxruntime takes it too


# ---- errors: exactly where onnxruntime refuses the node too ---------------------------------------------------

# (id, op, op_model arguments, a part of onnx's message)
BAD_NODES = [
    ("axis-out-of-range", "RMSNorm", {"attributes": {"axis": 3}},
     "axis 3 is out of range for X of shape [batch, sequence, 8] (valid: -3 to 2)"),
    ("axis-below-range", "SkipRMSNorm", {"attributes": {"axis": -4}}, "axis -4 is out of range"),
    ("negative-epsilon", "RMSNorm", {"attributes": {"epsilon": -1e-6}},
     "attribute 'epsilon' must be finite and >= 0, got -9.99999997e-07"),
    ("nan-epsilon", "RMSNorm", {"attributes": {"epsilon": float("nan")}}, "attribute 'epsilon' must be finite"),
    ("eps-outside-2", "RMSNorm", {"attributes": {"eps_outside_sqrt": 2}},
     "attribute 'eps_outside_sqrt' must be 0 or 1, got 2"),
    ("float32-sum-3", "SkipRMSNorm", {"attributes": {NORMALIZE_FLOAT32_SUM: 3}},
     "attribute 'normalize_float32_sum' must be 0 or 1, got 3"),
    ("float32-sum-on-rmsnorm", "RMSNorm", {"attributes": {NORMALIZE_FLOAT32_SUM: 1}},
     "attribute 'normalize_float32_sum' is SkipRMSNorm's"),
    ("axis-a-float", "RMSNorm", {"attributes": {"axis": 1.0}}, "attribute 'axis' must be an int, got a float"),
    ("epsilon-an-int", "RMSNorm", {"attributes": {"epsilon": 1}}, "attribute 'epsilon' must be a float, got an int"),
    ("scale-wrong-dim", "RMSNorm", {"scale_type": FLOAT, "scale_shape": (6,)},
     "scale of shape [6] does not broadcast onto the normalized dims [8] of X [batch, sequence, 8]"),
    ("scale-extra-leading", "RMSNorm", {"scale_type": FLOAT, "scale_shape": (2, 1, 8), "x_shape": (4, 8)},
     "scale of shape [2, 1, 8] does not broadcast"),
    ("scale-over-unnormalized", "RMSNorm", {"scale_type": FLOAT, "scale_shape": (3, 8), "x_shape": (2, 3, 8)},
     "scale of shape [3, 8] does not broadcast onto the normalized dims [8]"),
    ("bias-wrong-dim", "SkipRMSNorm", {"bias_type": FLOAT, "bias_shape": (4,)}, "bias of shape [4] does not broadcast"),
    ("skip-other-shape", "SkipRMSNorm", {"x_shape": (2, 3, 8), "skip_shape": (2, 1, 8)},
     "skip of shape [2, 1, 8] must have the shape of X [2, 3, 8]"),
    ("skip-other-rank", "SkipRMSNorm", {"x_shape": (2, 3, 8), "skip_shape": (3, 8)},
     "skip of shape [3, 8] must have the shape of X [2, 3, 8]"),
    ("scalar-x", "RMSNorm", {"x_shape": ()}, "X is a scalar"),
    ("scale-f16-x-bf16", "RMSNorm", {"x_type": BFLOAT16, "scale_type": FLOAT16},
     "scale of type float16 with X of type bfloat16"),
    ("scale-bf16-x-f32", "RMSNorm", {"scale_type": BFLOAT16}, "scale of type bfloat16 with X of type float32"),
    ("bias-f32-x-f16", "SkipRMSNorm",
     {"x_type": FLOAT16, "scale_type": FLOAT16, "bias_type": FLOAT, "bias_shape": (8,)},
     "bias of type float32 must have X's type float16"),
]


def _onnxruntime_error(model: onnx.ModelProto) -> str:
    """onnxruntime's error for the model: at session creation, or else when it runs on inputs of the declared
    shapes (symbolic dims 3). Fails the test when onnxruntime takes it."""
    try:
        session = runtime.make_session(model)
    except Exception as error:  # noqa: BLE001 - whichever onnxruntime raises
        return str(error)
    rng = np.random.default_rng(0)
    feeds = {}
    for value in model.graph.input:
        dims = [dim.dim_value if dim.HasField("dim_value") else 3 for dim in value.type.tensor_type.shape.dim]
        dtype = helper.tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type)
        feeds[value.name] = rng.standard_normal(dims).astype(dtype)
    try:
        runtime.run(session, feeds)
    except Exception as error:  # noqa: BLE001
        return str(error)
    pytest.fail("onnxruntime ran the node that onnx refuses")


@needs_inference
@pytest.mark.parametrize(("op", "arguments", "message"), [case[1:] for case in BAD_NODES],
                         ids=[case[0] for case in BAD_NODES])
def test_a_node_against_the_contract_is_an_error_in_onnx_and_onnxruntime(op, arguments, message):
    model = op_model(op, **arguments)
    for strict in (True, False):  # onnx reports a Python inference function's error in either mode
        with pytest.raises(onnx.shape_inference.InferenceError) as raised:
            onnx.shape_inference.infer_shapes(model, strict_mode=strict)
        assert f"{op}: {message}" in str(raised.value)
    with pytest.raises((onnx.shape_inference.InferenceError, onnx.checker.ValidationError)) as raised:
        onnx.checker.check_model(op_model(op, **arguments, output_types=True), full_check=True)
    if isinstance(raised.value, onnx.shape_inference.InferenceError):
        assert f"{op}: {message}" in str(raised.value)
    else:
        assert "Mismatched attribute type" in str(raised.value) or "Unrecognized attribute" in str(raised.value)
    if op == "SkipRMSNorm" and "bias_type" in arguments and "scale_type" not in arguments \
            and tuple(int(p) for p in ort.__version__.split(".")[:2]) < (1, 24):
        return  # onnxruntime 1.20-1.23 crash on such a node (docs/ops.md); onnx's verdict stands
    error = _onnxruntime_error(model)
    assert f"{op} node 'norm0'" in error or "no kernel def matches node inputs" in error, error


@pytest.mark.parametrize(("attributes", "message"), [
    ({"axis": 1.0}, "Mismatched attribute type"),
    ({"epsilon": "1e-5"}, "Mismatched attribute type"),
    ({"eps_outside_sqrt": [0]}, "Mismatched attribute type"),
    ({NORMALIZE_FLOAT32_SUM: 1}, "Unrecognized attribute: normalize_float32_sum for operator RMSNorm"),
    ({"eps": 1e-6}, "Unrecognized attribute: eps"),
])
def test_checker_validates_attribute_names_and_types(attributes, message):
    model = op_model("RMSNorm", attributes=attributes, output_types=True)
    with pytest.raises(onnx.checker.ValidationError, match=message):
        onnx.checker.check_model(model)


def test_checker_validates_input_types():
    model = op_model("RMSNorm", x_type=TensorProto.DOUBLE, output_types=True)
    with pytest.raises(onnx.shape_inference.InferenceError, match="unsupported type: tensor\\(double\\)"):
        onnx.checker.check_model(model, full_check=True)


def test_checker_accepts_fused_models(llama):
    onnx.checker.check_model(onnx.load(str(llama.fused)), full_check=True)
