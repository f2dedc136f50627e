"""The properties every fuzz case must have, for each target, checked against the generator's ground truth.

- the pass does not raise and leaves its input as it was;
- the output passes onnx.checker (full check; SimplifiedLayerNormalization moved to a private domain for the check,
  as tests/fusion does);
- the report accounts for every generated norm: each fusion replaced one true RMSNorm (never a LayerNorm, never a
  near miss beyond the part docs/fusion.md fuses), with the generated axis, epsilon and placement; every near miss is
  in ``skipped`` with its reason; the number of fused operators in the model is the number of fusions;
- outputs match the original model run in onnxruntime with every optimization off (bfloat16 models, which
  onnxruntime's CPU provider cannot run unfused, are run with bfloat16 emulated in float32: see
  :func:`emulate_bfloat16`);
- the pass is idempotent: fusing the fused model again changes nothing.

``auto`` can always write our ops, so it must fuse what ``custom`` fuses; ``decomposed`` fuses nothing itself (it
writes norm ops back as plain ONNX ops): its property is the round trip, the ``custom`` model written back matches the
original and fusing it again changes nothing.
"""

from __future__ import annotations

import copy

import numpy as np
import onnx
import onnx.inliner
import pytest
from onnx import TensorProto, helper, numpy_helper

import ort_rmsnorm
from fusion.norm_graphs import BFLOAT16, VERSUS_UNFUSED, attribute, check_model, run_fused, run_unfused
from fuzz.graphs import Case, NormTruth
from ort_rmsnorm.contract import TARGETS  # noqa: F401 - every target the pass has (tests/package/test_layers.py)

NORM_OPS = {"RMSNorm", "SkipRMSNorm", "RMSNormalization", "SimplifiedLayerNormalization"} | {
    "SkipSimplifiedLayerNormalization"
}
# Ops onnxruntime's CPU provider runs in bfloat16 (probed on onnxruntime 1.32); a model with any other op touching
# bfloat16 is run emulated.
NATIVE_BFLOAT16 = {"Cast", "Identity", "Reshape", "Transpose", "Shape", "Constant", "If"} | NORM_OPS


# ---- walking models ----------------------------------------------------------------------------------------------


def _subgraphs(graph):
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield attr.g
                yield from _subgraphs(attr.g)


def graph_likes(model: onnx.ModelProto):
    """The main graph, every function, and every If/Loop/Scan body in them."""
    for top in (model.graph, *model.functions):
        yield top
        yield from _subgraphs(top)


def all_nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    return [node for graph in graph_likes(model) for node in graph.node]


# ---- the pass ----------------------------------------------------------------------------------------------------


def upgrade_for(case: Case, target: str) -> bool:
    """The onnx target converts models below opset 23 (otherwise every norm is skipped), except those with
    model-local functions, which onnx's version converter drops (the pass refuses them)."""
    return target == "onnx" and case.plan.opset < 23 and not case.model.functions


# Targets that can write our ops for every norm (auto writes onnxruntime's where its table says so).
WRITES_OURS = ("custom", "auto")


def fuse(model: onnx.ModelProto, target: str, upgrade: bool):
    return ort_rmsnorm.fuse(model, target, allow_opset_upgrade=upgrade)


def check_case(case: Case, target: str) -> None:
    """Every property, for one target."""
    if target == "decomposed":
        check_round_trip(case)
        return
    original = copy.deepcopy(case.model)
    if target == "onnx" and case.plan.opset < 23 and case.model.functions:
        with pytest.raises(ValueError, match="cannot convert a model with model-local functions"):
            fuse(case.model, target, upgrade=True)
    fused, report = fuse(case.model, target, upgrade_for(case, target))
    assert case.model == original, "the pass modified its input"
    check_model(fused, ort_default_ops=target in ("ort", "auto"))
    check_report(case, target, fused, report)
    check_outputs(case, fused, len(report.fusions))
    again, second = fuse(fused, target, upgrade_for(case, target))
    assert second.fusions == [], f"second run fused again: {second.fusions}"
    assert again == fused, "a second run changed the fused model"


def check_round_trip(case: Case) -> None:
    """The ``custom`` model written back as plain ONNX ops: every op of ours converted (or reported), the outputs
    those of the original, and a second run changes nothing."""
    fused, _ = fuse(case.model, "custom", False)
    ours = [node for node in all_nodes(fused) if node.domain == "ort_rmsnorm"]
    back, report = fuse(fused, "decomposed", False)
    left = [node for node in all_nodes(back) if node.domain == "ort_rmsnorm"]
    assert len(report.fusions) == len(ours) - len(left), (len(ours), len(left), report.fusions)
    for node in left:
        assert any(node.name in entry.nodes for entry in report.skipped), f"{node.name} neither converted nor reported"
    check_model(back, ort_default_ops=True)
    check_outputs(case, back, len(ours))
    again, second = fuse(back, "decomposed", False)
    assert second.fusions == [] and again == back, "a second run changed the decomposed model"


# ---- the report against the ground truth -------------------------------------------------------------------------


def has_operator(truth: NormTruth, target: str, opset: int) -> bool:
    """Whether ``target`` has an operator for the norm's input type and epsilon placement (docs/fusion.md, Targets)."""
    if target in WRITES_OURS:
        return True
    if truth.placement == "outside_sqrt":
        return False
    return target != "onnx" or (opset >= 23 and truth.x_dtype != BFLOAT16)


def takes_scale(truth: NormTruth, target: str) -> bool:
    """Whether ``target``'s operator can read the norm's scale: ``onnx`` and ``ort`` need one scale element per
    normalized element, so a scale that broadcasts must be a constant over static dims (it is then expanded)."""
    if target in WRITES_OURS or truth.norm.scale == "none" or not truth.scale_fused:
        return True
    constant = truth.norm.scale != "one_plus_runtime"
    return truth.scale_per_element or (constant and truth.static_normalized)


def expressible(truth: NormTruth, target: str, opset: int) -> bool:
    """Whether ``target``'s operator expresses the whole norm: then it must fuse it. Where it does not, the norm may
    be fused in part or skipped, and must be in the report either way."""
    if target in WRITES_OURS:
        return True
    if not has_operator(truth, target, opset) or not takes_scale(truth, target):
        return False
    if truth.norm.scale != "none" and truth.scale_fused:
        return truth.scale_dtype == truth.x_dtype
    return truth.static_normalized  # a ones scale is added: its dims must be known


def check_report(case: Case, target: str, fused: onnx.ModelProto, report) -> None:
    opset = 23 if upgrade_for(case, target) else case.plan.opset
    # Casts that a neighbouring norm's fusion may take (see Case.absorbable) belong to no block here.
    # A norm's last node may be an Add that the next norm takes as its residual (a bias of X's whole shape).
    adds = {residual.add: residual for residual in case.residuals}
    owner = {name: truth for truth in case.norms for name in truth.nodes if name not in case.absorbable | adds.keys()}
    nodes = {node.name: node for node in all_nodes(fused)}
    generated = {node.name for node in all_nodes(case.model)}
    for graph in graph_likes(fused):
        names = [node.name for node in graph.node]
        assert len(set(names)) == len(names), f"node names repeat in {graph.name}"
    emitted = [node for node in all_nodes(fused) if node.op_type in NORM_OPS]
    assert len(emitted) == len(report.fusions), (
        f"{len(emitted)} fused operators in the model, {len(report.fusions)} fusions in the report"
    )

    fusion_of: dict[str, object] = {}  # norm block -> its fusion
    fusion_with_add: dict[str, object] = {}  # residual Add -> the fusion that took it
    for fusion in report.fusions:
        blocks = {owner[name].block for name in fusion.replaced_nodes if name in owner}
        known = owner.keys() | adds.keys() | case.absorbable
        strangers = [name for name in fusion.replaced_nodes if name not in known]
        if upgrade_for(case, target):  # nodes the version converter added (axes constants) are no strangers
            strangers = [name for name in strangers if name in generated]
        assert len(blocks) == 1 and not strangers, f"{fusion.node} replaced {fusion.replaced_nodes}"
        (truth,) = {owner[name].block: owner[name] for name in fusion.replaced_nodes if name in owner}.values()
        assert truth.fuses, f"{truth.norm.kind} block {truth.block} was fused as {fusion.node}"
        assert truth.block not in fusion_of, f"block {truth.block} fused twice"
        fusion_of[truth.block] = fusion
        for name in fusion.replaced_nodes:
            if name in adds:
                fusion_with_add[name] = fusion
        assert fusion.skip == any(name in adds for name in fusion.replaced_nodes), fusion
        took_cast = any(name in case.absorbable for name in fusion.replaced_nodes)  # X may be the source then
        _check_fusion(truth, fusion, nodes.get(fusion.node), target, took_cast)

    others_may_take = case.absorbable | adds.keys()
    for truth in case.norms:
        _check_norm(truth, fusion_of.get(truth.block), report, owner, nodes, target, opset, others_may_take)
    for residual in case.residuals:
        _check_residual(residual, fusion_with_add.get(residual.add), fusion_of, report, nodes, target, case.absorbable)
    missing = [name for name in case.kept if name not in nodes]
    assert not missing, f"nodes of unrelated ops removed: {missing}"


def _check_residual(residual, fusion, fusion_of: dict, report, nodes: dict, target: str, absorbable: set) -> None:
    """A same-shape Add whose sum a fused norm reads as X fuses with it (custom; ort where its op can), a broadcast
    one never does and is reported; an unfused Add stays."""
    readers = [norm for norm in residual.next_norms if norm.block in fusion_of and norm.x_is_input]
    if fusion is not None:
        # A norm that took the cast after it (and so reads its input before an up-cast) may read the sum too.
        took_cast = [
            norm
            for norm in residual.next_norms
            if norm.block in fusion_of and any(name in absorbable for name in fusion_of[norm.block].replaced_nodes)
        ]
        assert residual.same_shape and any(fusion is fusion_of[norm.block] for norm in readers + took_cast), (
            f"Add {residual.add} fused into {fusion.node}"
        )
        return
    assert residual.add in nodes, f"unfused Add {residual.add} is gone"
    # The fused norms that read the Add (a target may have fused less than the whole norm, e.g. the float32 part).
    reading = [
        fusion_of[norm.block].node
        for norm in residual.next_norms
        if norm.block in fusion_of and residual.add_output in nodes[fusion_of[norm.block].node].input
    ]
    if residual.same_shape and readers and target in WRITES_OURS:
        raise AssertionError(f"residual Add {residual.add} before {reading} not fused")
    if reading and target != "onnx":
        reasons = [entry.reason for entry in report.skipped if residual.add in entry.nodes]
        assert reasons, f"Add {residual.add} before {reading} neither fused nor in the report"
        if not residual.same_shape:
            assert any("is not known to add two tensors of one shape" in reason for reason in reasons), reasons


def _check_fusion(truth: NormTruth, fusion, node: onnx.NodeProto | None, target: str, took_cast: bool) -> None:
    """The fused node's axis and epsilon are the generated ones (not the report's own idea of them)."""
    assert node is not None, f"the report names {fusion.node}, which is not in the model"
    assert fusion.location == truth.location, (fusion.location, truth.location)
    epsilon = truth.epsilon if truth.epsilon is not None else 0.0
    reported = (fusion.axis, fusion.eps_placement, np.float32(fusion.epsilon))  # as the float32 attribute holds it
    assert reported == (truth.axis, truth.placement, np.float32(epsilon)), f"{truth.block}: {reported}"
    if node.op_type == "SkipSimplifiedLayerNormalization":  # its axis is the last one, always
        assert truth.axis == -1
    else:
        assert attribute(node, "axis", -1) == truth.axis
    assert attribute(node, "epsilon", 1e-5) == np.float32(epsilon), f"{node.name}: epsilon, {truth.block}: {epsilon}"
    assert attribute(node, "eps_outside_sqrt", 0) == int(truth.placement == "outside_sqrt"), node.name
    if target in WRITES_OURS and node.domain == "ort_rmsnorm" and truth.scale_fused and not took_cast:
        assert fusion.input_dtype == truth.x_dtype.name, (fusion.input_dtype, truth.x_dtype)
        # auto may first write onnxruntime's op, whose gamma is the scale expanded to the hidden size, and then ours
        # for its residual Add, with that gamma.
        expanded = target == "auto" and fusion.scale.startswith(f"{truth.scale_form}, broadcast to ")
        assert fusion.scale == truth.scale_form or expanded, (fusion.scale, truth.scale_form)


def _check_norm(truth: NormTruth, fusion, report, owner, nodes, target: str, opset: int, others_may_take: set) -> None:
    """A near miss or LayerNorm is reported with its reason and keeps its nodes (but those a neighbouring fusion may
    take); a true norm is fused (where the target expresses it) without leaving anything of its decomposition, with or
    without its scale as generated."""
    entries = [entry for entry in report.skipped if any(owner.get(name) is truth for name in entry.nodes)]
    reasons = [entry.reason for entry in entries]
    # What a fused norm leaves out (a scale varying along batch axes) is reported where the target could have taken
    # it; where it has no operator for the norm's type or cannot read its scale, the report may give that reason.
    target_falls_short = not (has_operator(truth, target, opset) and takes_scale(truth, target))
    if truth.reason is not None and not (truth.fuses and target_falls_short):
        assert any(truth.reason in reason for reason in reasons), f"{truth.block} ({truth.norm.kind}): {reasons}"
    if not truth.fuses:
        assert fusion is None
        gone = [name for name in truth.nodes if name not in nodes and name not in others_may_take]
        assert not gone, f"{truth.norm.kind} block {truth.block} lost {gone}"
        return
    if fusion is None:
        assert not expressible(truth, target, opset), f"{truth.block} not fused: {reasons}"
        assert entries, f"{truth.block} neither fused nor in the report"
        return
    gone = [name for name in truth.core if name in nodes]
    assert not gone, f"{truth.block} fused as {fusion.node}, but {gone} are still there"
    if not truth.scale_fused:
        assert fusion.scale in ("none", "ones (added)") and (truth.scale_mul is None or truth.scale_mul in nodes), (
            f"{truth.block}: the scale must stay"
        )
    elif expressible(truth, target, opset) and truth.scale_mul is not None:
        assert truth.scale_mul not in nodes, f"{truth.block}: the scale was not fused"


# ---- outputs -----------------------------------------------------------------------------------------------------


def _elem_types(graph: onnx.GraphProto, outer: dict) -> dict[str, int]:
    """Element type of every value of ``graph`` (the ops the fuzz models use: elementwise ops, reductions, MatMul,
    Transpose, Reshape take their first input's type; norm ops too)."""
    types = dict(outer)
    types.update({value.name: value.type.tensor_type.elem_type for value in graph.input})
    types.update({tensor.name: tensor.data_type for tensor in graph.initializer})
    for node in graph.node:
        if node.op_type == "Constant":
            produced = [node.attribute[0].t.data_type]
        elif node.op_type == "Cast":
            produced = [attribute(node, "to")]
        elif node.op_type == "CastLike":
            produced = [types[node.input[1]]]
        elif node.op_type == "Shape":
            produced = [TensorProto.INT64]
        elif node.op_type == "If":
            produced = [value.type.tensor_type.elem_type for value in attribute(node, "then_branch").output]
        else:
            produced = [types[node.input[0]]] * len(node.output)
        types.update(zip(node.output, produced))
    return types


def _bfloat16_nodes(graph: onnx.GraphProto, outer: dict):
    types = _elem_types(graph, outer)
    for node in graph.node:
        if any(types.get(name) == TensorProto.BFLOAT16 for name in (*node.input, *node.output) if name):
            yield node
        for sub in (attr.g for attr in node.attribute if attr.type == onnx.AttributeProto.GRAPH):
            yield from _bfloat16_nodes(sub, types)


def needs_emulation(model: onnx.ModelProto) -> bool:
    inlined = onnx.inliner.inline_local_functions(model)
    return any(node.op_type not in NATIVE_BFLOAT16 for node in _bfloat16_nodes(inlined.graph, {}))


def emulate_bfloat16(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model with every bfloat16 value held in float32 and rounded to bfloat16 where it is computed (a Cast to
    bfloat16 and back after the node): each op computes in float32 and rounds its result once, as a bfloat16 kernel
    does. Functions are inlined first."""
    emulated = onnx.inliner.inline_local_functions(model)
    _emulate_graph(emulated.graph, {})
    return emulated


def _to_float32(tensor: onnx.TensorProto) -> None:
    if tensor.data_type == TensorProto.BFLOAT16:
        tensor.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(tensor).astype(np.float32), tensor.name))


def _emulate_graph(graph: onnx.GraphProto, outer: dict) -> None:
    types = _elem_types(graph, outer)
    for value in (*graph.input, *graph.output, *graph.value_info):
        if value.type.tensor_type.elem_type == TensorProto.BFLOAT16:
            value.type.tensor_type.elem_type = TensorProto.FLOAT
    for tensor in graph.initializer:
        _to_float32(tensor)
    nodes = []
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                _emulate_graph(attr.g, types)
            elif attr.type == onnx.AttributeProto.TENSOR:
                _to_float32(attr.t)
        nodes.append(node)
        for index, name in enumerate(node.output):
            if not name or types.get(name) != TensorProto.BFLOAT16:
                continue
            computed = f"{name}/computed"
            node.output[index] = computed
            if node.op_type == "Cast":  # the cast to bfloat16 is the rounding
                rounded = computed
            else:
                rounded = f"{name}/rounded"
                nodes.append(helper.make_node("Cast", [computed], [rounded], to=TensorProto.BFLOAT16))
            nodes.append(helper.make_node("Cast", [rounded], [name], to=TensorProto.FLOAT))
    del graph.node[:]
    graph.node.extend(nodes)


def model_outputs(model: onnx.ModelProto, feeds: dict, fused: bool) -> list[np.ndarray]:
    """The model's outputs in onnxruntime, optimizations off (bfloat16 emulated where onnxruntime cannot run it)."""
    if needs_emulation(model):
        model = emulate_bfloat16(model)
        feeds = {name: array.astype(np.float32) if array.dtype == BFLOAT16 else array for name, array in feeds.items()}
    return run_fused(model, feeds) if fused else run_unfused(model, feeds)


def check_outputs(case: Case, fused: onnx.ModelProto, fusions: int) -> None:
    """Each fused norm may differ from its decomposition by a couple of ulps of the model's narrowest type; these
    differences add up along the chain and travel through MatMuls (relative to the output's scale)."""
    declared = [(value.name, value.type.tensor_type.elem_type) for value in case.model.graph.output]
    assert [(value.name, value.type.tensor_type.elem_type) for value in fused.graph.output] == declared
    narrowest = max(case.dtypes, key=lambda dtype: VERSUS_UNFUSED[dtype][0])
    rtol = VERSUS_UNFUSED[narrowest][0] * (1 + fusions)
    for feeds in case.feeds:
        expected = model_outputs(case.model, feeds, fused=False)
        got = model_outputs(fused, feeds, fused=True)
        for (name, _), want, have in zip(declared, expected, got):
            assert have.shape == want.shape, (name, have.shape, want.shape)
            want64, have64 = want.astype(np.float64), have.astype(np.float64)
            finite = np.abs(want64[np.isfinite(want64)])
            scale = float(finite.max()) if finite.size else 0.0
            np.testing.assert_allclose(have64, want64, rtol=rtol, atol=rtol * scale, err_msg=f"output {name}")
