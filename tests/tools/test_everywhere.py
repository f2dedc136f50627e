"""``ort_rmsnorm.everywhere()``: every InferenceSession created inside has the library, symbolic shape inference knows
our ops, and everything is as it was once the last one exits (nested, from several threads, after an exception);
``register()`` is idempotent."""

from __future__ import annotations

import threading

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference

import ort_rmsnorm
from ort_rmsnorm import runtime, tooling

NOT_REGISTERED = "is not a registered function/op"


def _session(path, *args, **kwargs) -> ort.InferenceSession:
    return ort.InferenceSession(str(path), *args, providers=["CPUExecutionProvider"], **kwargs)


def _outputs(session: ort.InferenceSession, pair) -> np.ndarray:
    return session.run(None, pair.feeds())[0]


def _plain():
    return ort.InferenceSession.__init__, SymbolicShapeInference.__init__


def test_sessions_inside_have_the_library_and_nothing_is_left_after(llama_models):
    pair = llama_models["float"]
    before = _plain()
    with pytest.raises(Exception, match=NOT_REGISTERED):
        _session(pair.fused)
    expected = _outputs(runtime.make_session(str(pair.fused)), pair)
    with ort_rmsnorm.everywhere():
        np.testing.assert_array_equal(_outputs(_session(pair.fused), pair), expected)  # no options given
        options = ort.SessionOptions()
        np.testing.assert_array_equal(_outputs(_session(pair.fused, options), pair), expected)  # options given
        np.testing.assert_array_equal(_outputs(_session(pair.fused, sess_options=options), pair), expected)  # again
        registered = ort_rmsnorm.session_options()  # already registered: not a second time
        np.testing.assert_array_equal(_outputs(_session(pair.fused, registered), pair), expected)
        _session(pair.unfused)  # a model without our ops is not affected
    assert _plain() == before
    with pytest.raises(Exception, match=NOT_REGISTERED):
        _session(pair.fused)


def test_nested_and_restored_after_an_exception(llama_models):
    pair = llama_models["float"]
    before = _plain()
    with pytest.raises(RuntimeError, match="inside"):
        with ort_rmsnorm.everywhere():
            with ort_rmsnorm.everywhere():
                _session(pair.fused)
            _session(pair.fused)  # the outer one still holds
            raise RuntimeError("inside")
    assert _plain() == before
    with pytest.raises(Exception, match=NOT_REGISTERED):
        _session(pair.fused)


def test_as_a_decorator(llama_models):
    pair = llama_models["float"]

    @ort_rmsnorm.everywhere()
    def open_session():
        return _session(pair.fused)

    open_session()
    open_session()
    assert _plain()[0] is ort.InferenceSession.__dict__["__init__"]
    with pytest.raises(Exception, match=NOT_REGISTERED):
        _session(pair.fused)


def test_threads_entering_and_leaving_at_once(llama_models):
    """Eight threads each enter and leave several times, creating sessions and running them inside; all succeed and
    the originals are back at the end."""
    pair = llama_models["float"]
    expected = _outputs(runtime.make_session(str(pair.fused)), pair)
    before = _plain()
    errors: list[BaseException] = []
    start = threading.Barrier(8)

    def work():
        try:
            start.wait()
            for _ in range(3):
                with ort_rmsnorm.everywhere():
                    np.testing.assert_array_equal(_outputs(_session(pair.fused), pair), expected)
        except BaseException as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    assert _plain() == before


def test_a_later_patch_by_someone_else_is_kept_and_ours_goes_inert(llama_models):
    pair = llama_models["float"]
    original = ort.InferenceSession.__dict__["__init__"]
    calls = []
    with ort_rmsnorm.everywhere():
        ours = ort.InferenceSession.__init__

        def theirs(self, *args, **kwargs):
            calls.append(1)
            ours(self, *args, **kwargs)

        ort.InferenceSession.__init__ = theirs
    try:
        assert ort.InferenceSession.__init__ is theirs  # not overwritten by our restore
        with pytest.raises(Exception, match=NOT_REGISTERED):
            _session(pair.fused)  # ours, still called by theirs, does nothing now
        assert calls
    finally:
        ort.InferenceSession.__init__ = original


def test_register_is_idempotent(llama_models):
    pair = llama_models["float"]
    options = ort_rmsnorm.session_options()
    assert ort_rmsnorm.register(options) is options
    ort_rmsnorm.register(options)
    _session(pair.fused, options)  # onnxruntime: "Domain already set in registry" with the library twice
    again = ort_rmsnorm.session_options(options)
    assert again is options
    _session(pair.fused, again)


# ---- symbolic shape inference ---------------------------------------------------------------------------------


def _dims(info) -> list:
    return [dim.dim_value if dim.HasField("dim_value") else dim.dim_param for dim in info.type.tensor_type.shape.dim]


def test_infer_symbolic_shapes_types_our_outputs(llama):
    model = onnx.load(str(llama.fused))
    model.graph.ClearField("value_info")
    inferred = ort_rmsnorm.infer_symbolic_shapes(model)
    infos = {info.name: info for info in (*inferred.graph.value_info, *inferred.graph.output)}
    ours = [node for node in inferred.graph.node if node.domain == ort_rmsnorm.OP_DOMAIN]
    assert len(ours) == 5
    for node in ours:
        for name in filter(None, node.output):
            assert infos[name].type.tensor_type.elem_type == onnx.TensorProto.FLOAT
            assert _dims(infos[name]) == ["batch", "sequence", 64], name
    assert _plain()[1] is SymbolicShapeInference.__dict__["__init__"]  # nothing left behind


_SYMBOLIC_WITHOUT = """
import onnx, onnx.defs, sys
import ort_rmsnorm
from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference
ort_rmsnorm.register_schemas()  # registered once per process: removed below, they stay away
onnx.defs.deregister_schema('RMSNorm', 1, 'ort_rmsnorm')
onnx.defs.deregister_schema('SkipRMSNorm', 1, 'ort_rmsnorm')
model = onnx.load(sys.argv[1])
try:
    SymbolicShapeInference.infer_shapes(model)
    print('plain: complete')
except Exception as error:
    print('plain:', error)
inferred = ort_rmsnorm.infer_symbolic_shapes(model)
print('ours: complete', len(inferred.graph.value_info))
"""


def test_the_handlers_alone_complete_symbolic_inference(llama_models, tmp_path):
    """Without the ONNX schemas (onnx < 1.19 has no inference functions from Python) symbolic shape inference stops at
    our ops; our handlers complete it. (With the schemas its per-node onnx fallback gets there too.)"""
    import subprocess
    import sys

    completed = subprocess.run([sys.executable, "-c", _SYMBOLIC_WITHOUT, str(llama_models["float"].fused)],
                               capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert completed.returncode == 0, completed.stderr
    lines = completed.stdout.splitlines()
    assert lines[0] == "plain: Incomplete symbolic shape inference"
    assert lines[1].startswith("ours: complete")


def test_add_symbolic_handlers_is_idempotent_and_keeps_other_domains():
    inference = SymbolicShapeInference(2**31 - 1, False, False, 0)
    seen = []
    inference.dispatcher_["RMSNorm"] = seen.append  # someone's handler for an RMSNorm of another domain
    ort_rmsnorm.add_symbolic_handlers(inference)
    handler = inference.dispatcher_["RMSNorm"]
    ort_rmsnorm.add_symbolic_handlers(inference)
    assert inference.dispatcher_["RMSNorm"] is handler
    other = onnx.helper.make_node("RMSNorm", ["x"], ["y"], domain="com.example")
    handler(other)
    assert seen == [other]


def test_everywhere_gives_symbolic_inference_our_handlers(llama_models):
    with ort_rmsnorm.everywhere():
        inference = SymbolicShapeInference(2**31 - 1, False, False, 0)
        assert getattr(inference.dispatcher_["SkipRMSNorm"], "_ort_rmsnorm", False)
    assert "SkipRMSNorm" not in SymbolicShapeInference(2**31 - 1, False, False, 0).dispatcher_


def test_run_tool_refuses_a_missing_module():
    with pytest.raises(ModuleNotFoundError, match="no module named 'onnxruntime.no_such_tool'"):
        tooling.run_tool("onnxruntime.no_such_tool", [])
