"""Random models for fuzzing the fusion pass: a :class:`Plan` (plain data whose repr is Python that rebuilds it) and
the builder that turns it into an ONNX model together with the ground truth of every part.

A plan is a chain of blocks applied to a stream value (the main input): decomposed norms (true RMSNorms, LayerNorms
and near misses, spelled with :func:`fusion.norm_graphs.add_norm`), residual Adds, unrelated ops, ``If`` nodes and
model-local functions whose bodies are chains too, and side chains on inputs of their own. The ground truth comes
from what the generator meant to build (the block's ``kind``), never from the graph.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Optional, Union

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from fusion.norm_graphs import DTYPES, ONNX_TYPES, GraphBuilder, Spelling, _reduce, add_norm
from op_models import make_model
from reference import random_array

FLOAT32 = np.dtype(np.float32)
# Run-time sizes of the symbolic dims (static dims are their own size).
RUN_SIZES = {"B": 2, "S": 3, "T": 5}

# Near misses: kind -> fragment of the reason the report must give. "scale_varies" is fused without its scale.
NEAR_MISS_REASONS = {
    "exponent": "is not 2 (not a mean square)",
    "keepdims0": "keepdims=0 on",
    "eps_input": "epsilon is not a constant scalar",
    "eps_negative": "is not finite and >= 0",
    "scale_varies": "varies along non-normalized axes",
    "side_use": "intermediate",  # "... is also used by ..." or "... is a graph output"
    "wrong_count": "is not a mean over the",
    "numerator": "with c != 1 is not the inverse of the rms",
    "inverse_exponent": "with p != -0.5 is not the inverse of the rms",
    "non_trailing": "is not over the trailing axes",
    "sum_not_static": "are not static: cannot check that the sum is divided by their count",
    "layernorm": "the input is x - mean(x) over the normalized axes: a LayerNorm, not an RMSNorm",
}
TRUE_KINDS = ("rms", "centered_other")  # centered over other axes than the normalized ones: still an RMSNorm
PARTIAL_KINDS = ("scale_varies",)  # the norm fuses, the scale Mul stays
# Decomposition ops whose nodes must all be gone where a norm is fused.
CORE_OPS = {"ReduceMean", "ReduceSum", "ReduceSumSquare", "Sqrt", "Reciprocal"}


# ---- the plan ----------------------------------------------------------------------------------------------------


def _compact_repr(obj) -> str:
    """``Name(field=value, ...)`` with only the fields that differ from their defaults: Python that rebuilds it."""
    fields = []
    for field in dataclasses.fields(obj):
        value = getattr(obj, field.name)
        if value != field.default:
            fields.append(f"{field.name}={_compact_repr(value) if dataclasses.is_dataclass(value) else repr(value)}")
    return f"{type(obj).__name__}({', '.join(fields)})"


class _Printable:
    def __repr__(self) -> str:
        return _compact_repr(self)

    def _repr_pretty_(self, printer, cycle) -> None:  # how hypothesis prints a falsifying example
        printer.text(repr(self))


@dataclasses.dataclass(frozen=True, repr=False)
class Norm(_Printable):
    """A decomposed norm of the stream: its rms part as ``spelling`` says (run_shape is filled in by the builder),
    and around it the casts and scale."""

    kind: str = "rms"  # TRUE_KINDS, or a key of NEAR_MISS_REASONS
    spelling: Spelling = Spelling()
    upcast: bool = False  # Hugging Face: cast to float32 before the square
    separate_casts: bool = False  # TorchScript: one cast for the square, another for the division
    cast_back: bool = True  # with upcast: cast the normalized value back before the scale
    scale: str = "tensor"  # none | tensor | one_plus | one_plus_runtime | cast
    scale_shape: Optional[tuple] = None  # default: the normalized dims
    gemma: bool = False  # with upcast: scale in float32, then cast back (needs cast_back)
    island: Optional[str] = None  # float32 stream: cast to this type before, back to float32 after
    eps_form: str = "spelled"  # spelled (spelling.eps) | ones1 | ones2 (shape of ones) | cast | graph_input
    center_axes: Optional[tuple] = None  # x - ReduceMean(x, center_axes) feeds the norm
    bias: bool = False  # + a bias after the scale (LayerNorm style)
    side_use: Optional[tuple] = None  # (index of an intermediate, "node" | "output"): used outside the norm
    commute: int = 0  # bit j: swap the operands of the block's j-th Mul/Add


@dataclasses.dataclass(frozen=True, repr=False)
class Residual(_Printable):
    """Add(stream, other): ``earlier`` a value of the same shape and type in scope, ``input`` a new graph input of that
    shape, ``bias`` a broadcast constant (not a residual)."""

    operand: str = "earlier"
    index: int = 0
    expose: bool = False  # the sum is also a graph output
    commute: int = 0


@dataclasses.dataclass(frozen=True, repr=False)
class Op(_Printable):
    """An unrelated op: matmul | gelu_sigmoid | gelu_tanh | gelu_erf | swiglu | transpose | reshape."""

    op: str = "gelu_sigmoid"
    param: int = 0


@dataclasses.dataclass(frozen=True, repr=False)
class Parallel(_Printable):
    """Two norms of the stream, added (a parallel block; the sum is a same-shape Add before the next norm)."""

    first: Norm = Norm()
    second: Norm = Norm()
    commute: int = 0


@dataclasses.dataclass(frozen=True, repr=False)
class IfElse(_Printable):
    """``If(cond)`` whose branches are chains on the stream (shape and type preserving)."""

    then: tuple = ()
    orelse: tuple = ()


@dataclasses.dataclass(frozen=True, repr=False)
class Call(_Printable):
    """A model-local function whose body is a chain (shape and type preserving), called ``calls`` times in a row."""

    body: tuple = ()
    calls: int = 1


@dataclasses.dataclass(frozen=True, repr=False)
class SideChain(_Printable):
    """A chain on a graph input of its own (static shapes for the keepdims=0 cases), to a graph output."""

    shape: tuple = (1, 8)
    blocks: tuple = ()


Block = Union[Norm, Parallel, Residual, Op, IfElse, Call, SideChain]


@dataclasses.dataclass(frozen=True, repr=False)
class Plan(_Printable):
    dtype: str = "float32"
    opset: int = 18
    shape: tuple = ("B", "S", 8)
    blocks: tuple = ()
    seed: int = 0
    shared_constants: bool = False  # equal initializers merged into one (as exporters deduplicate them)


# ---- ground truth ------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class NormTruth:
    """What a Norm block is and what fusing it must give."""

    block: str
    norm: Norm
    location: str
    nodes: list[str]
    core: list[str]  # the decomposition (ops of CORE_OPS): gone where the norm is fused
    scale_mul: Optional[str]
    axis: int  # -k
    epsilon: Optional[float]  # as the graph stores it (in the compute type); None: no epsilon
    placement: str  # inside_sqrt | outside_sqrt | none
    x_dtype: np.dtype  # the fused op's X
    x_is_input: bool  # X is the value the block reads (so a residual Add before it can fuse)
    static_normalized: bool
    scale_per_element: bool  # the scale's shape, as the graph states it, ends in the normalized dims (no broadcast)
    scale_dtype: Optional[np.dtype]
    scale_form: str  # what the report's ``scale`` says for a full fusion
    fuses: bool  # the norm is fused (with the custom target)
    scale_fused: bool  # ... and its scale Mul with it
    reason: Optional[str]  # a fragment of the reason the report must give (near misses, parts left out)


@dataclasses.dataclass
class ResidualTruth:
    """An Add before a norm: fused into the norm's skip op where it adds two tensors of one shape."""

    block: str
    location: str
    add: str
    add_output: str
    same_shape: bool
    next_norms: list = dataclasses.field(default_factory=list)  # the Norm blocks reading the sum


@dataclasses.dataclass
class Case:
    """A built model, its inputs (one feed per value of ``cond`` when it has If nodes), and the ground truth."""

    plan: Plan
    model: onnx.ModelProto
    feeds: list[dict]
    norms: list[NormTruth]
    residuals: list[ResidualTruth]
    kept: list[str]  # nodes that must survive every target (unrelated ops, bias Adds)
    # Casts a neighbouring norm's fusion may take: those that change no value (looked through by the norm after
    # them, or ending the norm before them) and casts of a norm's output (a norm may end in a cast: Gemma).
    absorbable: set[str]
    dtypes: set  # every float type the model computes in

    def __repr__(self) -> str:
        return f"build({self.plan!r})"

    def _repr_pretty_(self, printer, cycle) -> None:
        printer.text(repr(self))


# ---- the builder -------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Value:
    name: str
    dtype: np.dtype
    shape: tuple  # dims: int or symbol
    is_input: bool = False  # a graph input (not computed by the model)


@dataclasses.dataclass
class Scope:
    """Where blocks are built: the main graph, a branch, a function body or a side chain."""

    prefix: str
    location: str
    constants: str  # "initializer" (main graph) or "constant" (branches, functions)
    nodes: list
    values: list[Value]  # same-scope values a residual Add may read (outer ones too, in branches)
    main: bool  # may add graph inputs and outputs (branches read main graph inputs from the outer scope)
    inputs_visible: bool  # graph inputs are in scope (not in function bodies)
    norm_outputs: set = dataclasses.field(default_factory=set)  # outputs of Norm blocks built here
    pending_residual: Optional[ResidualTruth] = None  # the Add the next block here reads, when it is the last block
    counter: itertools.count = dataclasses.field(default_factory=itertools.count)


def run_shape(shape: tuple) -> tuple:
    return tuple(dim if isinstance(dim, int) else RUN_SIZES[dim] for dim in shape)


class Builder:
    """Builds a plan block by block (the hypothesis strategies draw each block from the state after the previous)."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.blocks: list[Block] = []
        self.rng = np.random.default_rng(plan.seed)
        self.inputs: list[onnx.ValueInfoProto] = []
        self.outputs: list[onnx.ValueInfoProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.functions: list[onnx.FunctionProto] = []
        self.feeds: dict[str, np.ndarray] = {}
        self.norms: list[NormTruth] = []
        self.residuals: list[ResidualTruth] = []
        self.kept: list[str] = []
        self.absorbable: set[str] = set()
        self.dtypes = {DTYPES[plan.dtype]}
        self.has_if = False
        self._ifs = itertools.count()
        self._calls = itertools.count()
        self._sides = itertools.count()
        self.main = Scope("", "main graph", "initializer", [], [], main=True, inputs_visible=True)
        self.stream = self._graph_input("x", DTYPES[plan.dtype], tuple(plan.shape))
        self.main.values.append(self.stream)

    def append(self, block: Block) -> None:
        self.blocks.append(block)
        if isinstance(block, SideChain):
            self._side_chain(block)
        else:
            self.stream = self._block(self.main, block, self.stream)

    def finish(self) -> Case:
        self._graph_output(self.stream)
        graph = helper.make_graph(self.main.nodes, "fuzz", self.inputs, self.outputs, self.initializers)
        opsets = [helper.make_opsetid("", self.plan.opset)]
        if self.functions:
            opsets.append(helper.make_opsetid("local", 1))
        model = make_model(graph, opsets, functions=self.functions)
        if self.plan.shared_constants:
            _share_initializers(model.graph)
        _declare_output_shapes(model)
        feeds = [dict(self.feeds)]
        if self.has_if:
            feeds = [{**self.feeds, "cond": np.array(flag)} for flag in (True, False)]
        plan = dataclasses.replace(self.plan, blocks=tuple(self.blocks))
        return Case(plan, model, feeds, self.norms, self.residuals, self.kept, self.absorbable, self.dtypes)

    # ---- graph inputs and outputs ----

    def _graph_input(self, name: str, dtype: np.dtype, shape: tuple, feed: np.ndarray | None = None) -> Value:
        self.inputs.append(helper.make_tensor_value_info(name, ONNX_TYPES[dtype], list(shape)))
        self.feeds[name] = feed if feed is not None else random_array(self.rng, run_shape(shape), dtype)
        return Value(name, dtype, shape, is_input=True)

    def _graph_output(self, value: Value) -> None:
        """A graph output; ``value.shape`` None: taken from shape inference when the model is complete."""
        if any(output.name == value.name for output in self.outputs):
            return
        shape = list(value.shape) if value.shape is not None else None
        self.outputs.append(helper.make_tensor_value_info(value.name, ONNX_TYPES[value.dtype], shape))

    # ---- blocks ----

    def _block(self, scope: Scope, block: Block, x: Value) -> Value:
        index = next(scope.counter)
        prefix = f"{scope.prefix}b{index}/"
        pending, scope.pending_residual = scope.pending_residual, None
        if isinstance(block, (Norm, Parallel)):
            build_norm = self._norm if isinstance(block, Norm) else self._parallel
            out = build_norm(scope, prefix, block, x)
            if pending is not None:
                assert pending.add_output == x.name, f"{prefix}: reads {x.name}, not the sum of {pending.add}"
                pending.next_norms = [norm for norm in self.norms if f"{norm.block}/".startswith(prefix)]
        elif isinstance(block, Residual):
            out = self._residual(scope, prefix, block, x)
        elif isinstance(block, Op):
            out = self._op(scope, prefix, block, x)
        elif isinstance(block, IfElse):
            out = self._if(scope, block, x)
        elif isinstance(block, Call):
            out = self._call(scope, block, x)
        else:
            raise TypeError(f"block {block!r} cannot be built in {scope.location}")
        scope.values.append(out)
        return out

    def _chain(self, scope: Scope, blocks, x: Value) -> Value:
        for block in blocks:
            x = self._block(scope, block, x)
        return x

    def _builder(self, scope: Scope, prefix: str) -> GraphBuilder:
        return GraphBuilder(self.plan.opset, prefix=prefix, constants=scope.constants)

    def _merge(self, scope: Scope, g: GraphBuilder, commute: int) -> list[str]:
        """Adds the block's nodes to the scope, first swapping the operands of the Mul/Add nodes ``commute`` picks."""
        commutative = [node for node in g.nodes if node.op_type in ("Mul", "Add")]
        for bit, node in enumerate(commutative):
            if commute >> bit & 1:
                node.input[0], node.input[1] = node.input[1], node.input[0]
        scope.nodes.extend(g.nodes)
        self.initializers.extend(g.initializers)
        return [node.name for node in g.nodes]

    def _norm(self, scope: Scope, prefix: str, norm: Norm, x: Value) -> Value:
        g = self._builder(scope, prefix)
        exact_casts = []

        def cast(value: str, source_dtype: np.dtype, target_dtype: np.dtype) -> str:
            out = g.op("Cast", value, to=ONNX_TYPES[target_dtype])
            if source_dtype == target_dtype or target_dtype == FLOAT32:  # changes no value
                exact_casts.append(g.nodes[-1].name)
            return out

        stream_dtype = x.dtype
        source, dtype = x.name, stream_dtype
        if norm.island:
            dtype = DTYPES[norm.island]
            source = cast(source, stream_dtype, dtype)
        self.dtypes.add(dtype)
        compute = FLOAT32 if norm.upcast else dtype
        statistic_input = cast(source, dtype, FLOAT32) if norm.upcast else source
        divided = cast(source, dtype, FLOAT32) if norm.separate_casts else None
        if norm.center_axes is not None:
            mean = _reduce(g, "ReduceMean", statistic_input, Spelling(axes=norm.center_axes))
            statistic_input = g.op("Sub", statistic_input, mean)
        rank = len(x.shape)
        spelling = dataclasses.replace(norm.spelling, run_shape=run_shape(x.shape))
        epsilon_value = self._epsilon(g, prefix, norm, compute)
        if epsilon_value is not None:
            spelling = dataclasses.replace(spelling, eps="input")
        first_core = len(g.nodes)
        y, _ = add_norm(g, statistic_input, spelling, compute, divided)
        decomposition = g.nodes[first_core:]
        if epsilon_value is not None:
            for node in decomposition:
                node.input[:] = [epsilon_value if name == "eps_input" else name for name in node.input]
        if norm.side_use is not None:
            self._side_use(g, decomposition, norm.side_use, compute)
        out_dtype = FLOAT32 if norm.upcast and not norm.cast_back else dtype
        if norm.upcast and norm.cast_back and not norm.gemma:
            y = cast(y, FLOAT32, dtype)
        scale_dtype = FLOAT32 if norm.gemma else out_dtype
        normalized_dims = tuple(run_shape(x.shape)[rank - spelling.normalized :])
        scale_shape = tuple(norm.scale_shape) if norm.scale_shape is not None else normalized_dims
        scale_mul = None
        if norm.scale != "none":
            scale = self._scale(g, prefix, norm.scale, scale_shape, scale_dtype)
            y = g.op("Mul", y, scale)
            scale_mul = g.nodes[-1].name
            if norm.bias:
                y = g.op("Add", y, g.constant((self.rng.random(scale_shape) - 0.5).astype(scale_dtype)))
        if norm.gemma:
            y = cast(y, FLOAT32, dtype)
        if norm.island:
            y = cast(y, out_dtype, stream_dtype)
            out_dtype = stream_dtype
        names = self._merge(scope, g, norm.commute)
        last = g.nodes[-1]
        if norm.bias and (last.op_type, last.output[0]) == ("Add", y) and scale_shape == x.shape:
            # A bias of X's whole shape, added last: two tensors of one shape, a residual add to the next norm.
            self._add_truth(scope, prefix, last.name, y, same_shape=True)
        # Casts another norm's fusion may take: one that changes no value (a neighbouring norm looks through it, or
        # ends in it), and a cast of the output of the norm right before (a norm may end in a cast: Gemma).
        self.absorbable.update(exact_casts)
        if x.name in scope.norm_outputs:
            self.absorbable.update(node.name for node in g.nodes if node.op_type == "Cast" and node.input[0] == x.name)
        scope.norm_outputs.add(y)
        fuses = norm.kind in TRUE_KINDS or norm.kind in PARTIAL_KINDS
        centered = norm.center_axes is not None
        # Centered in float32 and cast back before the scale: X (the float32 Sub) is not of the output's type, so
        # only the norm up to the cast fuses (docs/fusion.md, Types).
        rounded_away = norm.upcast and norm.cast_back and not norm.gemma and centered and dtype != FLOAT32
        scale_fused = fuses and norm.kind not in PARTIAL_KINDS and not rounded_away
        # The fused op's output has X's type: where the fused part ends in float32 (no cast back, or Gemma's scale
        # left out), X is the float32 up-cast.
        ends_in_float32 = norm.upcast and dtype != FLOAT32 and (not norm.cast_back or (norm.gemma and not scale_fused))
        x_dtype = compute if centered else (FLOAT32 if ends_in_float32 else dtype)
        reason = NEAR_MISS_REASONS.get(norm.kind)
        scale_then_bias = norm.scale != "none" and norm.bias  # the cast after the bias ends no norm match
        cast_ends_a_match = norm.upcast and norm.cast_back and not (norm.gemma and scale_then_bias)
        if fuses and centered and dtype != FLOAT32 and cast_ends_a_match:
            reason = f"the output is {dtype.name} but the input is float32"
        has_eps = norm.spelling.eps != "none" or epsilon_value is not None
        self.norms.append(
            NormTruth(
                block=prefix.rstrip("/"),
                norm=norm,
                location=scope.location,
                nodes=names,
                core=[node.name for node in decomposition if node.op_type in CORE_OPS],
                scale_mul=scale_mul,
                axis=-spelling.normalized,
                epsilon=float(np.asarray(norm.spelling.epsilon, compute)) if has_eps else None,
                placement="none" if not has_eps else ("outside_sqrt" if spelling.eps == "outside" else "inside_sqrt"),
                x_dtype=x_dtype,
                x_is_input=not (ends_in_float32 or norm.island or centered),
                static_normalized=all(isinstance(dim, int) for dim in x.shape[rank - spelling.normalized :]),
                scale_per_element=tuple(scale_shape[-spelling.normalized :]) == tuple(x.shape[rank - spelling.normalized :])
                and len(scale_shape) >= spelling.normalized,
                scale_dtype=scale_dtype if norm.scale != "none" else None,
                scale_form={
                    "none": "none",
                    "tensor": "tensor",
                    "one_plus": "folded 1+w",
                    "one_plus_runtime": "1+w",
                    "cast": "cast tensor",
                }[norm.scale],
                fuses=fuses,
                scale_fused=scale_fused,
                reason=reason,
            )
        )
        return Value(y, out_dtype, x.shape)

    def _epsilon(self, g: GraphBuilder, prefix: str, norm: Norm, compute: np.dtype) -> str | None:
        """Epsilon spelled otherwise than add_norm does: a constant of ones-shape, a Cast of a float64 constant, or a
        graph input (not a constant: a near miss). None: as the spelling says."""
        epsilon = norm.spelling.epsilon
        if norm.eps_form == "spelled":
            return None
        if norm.eps_form in ("ones1", "ones2"):
            return g.constant(np.full((1,) * int(norm.eps_form[-1]), epsilon, compute))
        if norm.eps_form == "cast":
            return g.op("Cast", g.constant(np.array(epsilon, np.float64)), to=ONNX_TYPES[compute])
        return self._graph_input(f"{prefix}eps", compute, (), np.array(epsilon, compute)).name

    def _side_use(self, g: GraphBuilder, decomposition, pick: tuple, dtype: np.dtype) -> None:
        """An intermediate of the norm is also read by a Neg (to a graph output), or is a graph output itself."""
        intermediates = [node for node in decomposition if node.op_type not in ("Constant", "Cast", "CastLike")][:-1]
        index, how = pick
        value = intermediates[index % len(intermediates)].output[0]
        if how == "node":
            value = g.op("Neg", value)
        self._graph_output(Value(value, dtype, None))

    def _scale(self, g: GraphBuilder, prefix: str, form: str, shape: tuple, dtype: np.dtype) -> str:
        weights = (self.rng.random(shape) + 0.5).astype(np.float32)
        if form == "tensor":
            return g.constant(weights.astype(dtype))
        if form == "cast":
            stored = weights.astype(np.float16 if dtype != np.float16 else np.float32)
            return g.op("Cast", g.constant(stored), to=ONNX_TYPES[dtype])
        w = weights.astype(dtype) - np.ones((), dtype)  # 1 + w gives the weights back (rounded)
        if form == "one_plus":
            w_name = g.constant(w)
        else:
            w_name = self._graph_input(f"{prefix}w", dtype, shape, w).name
        return g.op("Add", g.constant(np.array(1.0, dtype)), w_name)

    def _parallel(self, scope: Scope, prefix: str, parallel: Parallel, x: Value) -> Value:
        first = self._norm(scope, f"{prefix}a/", parallel.first, x)
        second = self._norm(scope, f"{prefix}b/", parallel.second, x)
        g = self._builder(scope, prefix)
        total = g.op("Add", first.name, second.name)
        self._add_truth(scope, prefix, self._merge(scope, g, parallel.commute)[-1], total, same_shape=True)
        return Value(total, first.dtype, x.shape)

    def _add_truth(self, scope: Scope, prefix: str, add: str, total: str, same_shape: bool) -> None:
        """Records an Add (the block's last node) that the next norm may take as its residual."""
        truth = ResidualTruth(prefix.rstrip("/"), scope.location, add, total, same_shape)
        self.residuals.append(truth)
        scope.pending_residual = truth
        if not same_shape:
            self.kept.append(add)

    def _residual(self, scope: Scope, prefix: str, residual: Residual, x: Value) -> Value:
        g = self._builder(scope, prefix)
        same_shape = True
        if residual.operand == "bias":
            last = x.shape[-1] if isinstance(x.shape[-1], int) else 1
            other = g.constant((self.rng.random((last,)) - 0.5).astype(x.dtype))
            same_shape = False
        elif residual.operand == "input" and scope.inputs_visible:
            other = self._graph_input(f"{prefix}r", x.dtype, x.shape).name
        else:
            candidates = [value for value in scope.values if value.dtype == x.dtype and value.shape == x.shape]
            other = candidates[residual.index % len(candidates)].name
        total = g.op("Add", x.name, other)
        self._add_truth(scope, prefix, self._merge(scope, g, residual.commute)[-1], total, same_shape)
        out = Value(total, x.dtype, x.shape)
        if residual.expose and scope.main:
            self._graph_output(out)
        return out

    def _op(self, scope: Scope, prefix: str, op: Op, x: Value) -> Value:
        g = self._builder(scope, prefix)
        dtype, shape = x.dtype, x.shape

        def const(value) -> str:
            return g.constant(np.array(value, dtype))

        if op.op == "matmul":
            hidden = shape[-1]
            width = (hidden, 4, 8, 16)[op.param % 4]
            y = g.op("MatMul", x.name, g.constant(self._weights(hidden, width, dtype)))
            shape = shape[:-1] + (width,)
        elif op.op == "gelu_sigmoid":
            y = g.op("Mul", x.name, g.op("Sigmoid", g.op("Mul", x.name, const(1.702))))
        elif op.op == "gelu_tanh":
            cubic = g.op("Add", x.name, g.op("Mul", const(0.044715), g.op("Pow", x.name, const(3.0))))
            tanh = g.op("Tanh", g.op("Mul", const(0.7978845608), cubic))
            y = g.op("Mul", g.op("Mul", const(0.5), x.name), g.op("Add", const(1.0), tanh))
        elif op.op == "gelu_erf":
            erf = g.op("Erf", g.op("Div", x.name, const(1.4142135)))
            y = g.op("Mul", g.op("Mul", const(0.5), x.name), g.op("Add", const(1.0), erf))
        elif op.op == "swiglu":  # the stream read by two MatMuls (as gate and up projections are)
            hidden = shape[-1]
            gate, up = (g.constant(self._weights(hidden, hidden, dtype)) for _ in range(2))
            gated = g.op("MatMul", x.name, gate)
            y = g.op("Mul", g.op("Mul", gated, g.op("Sigmoid", gated)), g.op("MatMul", x.name, up))
        elif op.op == "transpose":
            perms = [perm for perm in itertools.permutations(range(len(shape))) if list(perm) != sorted(perm)]
            perm = perms[op.param % len(perms)]
            y = g.op("Transpose", x.name, perm=list(perm))
            shape = tuple(shape[axis] for axis in perm)
        elif op.op == "reshape":
            shape, target = reshaped(shape, op.param)
            y = g.op("Reshape", x.name, g.constant(np.array(target, np.int64)))
        else:
            raise ValueError(f"unknown op {op.op}")
        self.kept.extend(self._merge(scope, g, 0))
        return Value(y, dtype, shape)

    def _weights(self, rows: int, columns: int, dtype: np.dtype) -> np.ndarray:
        return (self.rng.standard_normal((rows, columns)) / np.sqrt(rows)).astype(dtype)

    def _subscope(self, prefix: str, location: str, outer: list[Value], inputs_visible: bool) -> Scope:
        return Scope(prefix, location, "constant", [], list(outer), main=False, inputs_visible=inputs_visible)

    def _subgraph(self, scope: Scope, blocks, x: Value, name: str) -> onnx.GraphProto:
        out = self._chain(scope, blocks, x)
        if out.name == x.name:  # an empty chain: the output must be produced here
            scope.nodes.append(helper.make_node("Identity", [x.name], [f"{scope.prefix}y"], name=f"{scope.prefix}id"))
            out = Value(f"{scope.prefix}y", out.dtype, out.shape)
        output = helper.make_tensor_value_info(out.name, ONNX_TYPES[out.dtype], list(out.shape))
        return helper.make_graph(scope.nodes, name, [], [output])

    def _if(self, scope: Scope, block: IfElse, x: Value) -> Value:
        index = next(self._ifs)
        name = f"if{index}"
        if "cond" not in self.feeds:
            self.inputs.append(helper.make_tensor_value_info("cond", TensorProto.BOOL, []))
            self.feeds["cond"] = np.array(True)
        self.has_if = True
        branches = {}
        for attr, suffix, blocks in (("then_branch", "t", block.then), ("else_branch", "e", block.orelse)):
            sub = self._subscope(f"{name}{suffix}/", f"If '{name}'.{attr}", scope.values, inputs_visible=True)
            branches[attr] = self._subgraph(sub, blocks, x, f"{name}_{attr}")
        scope.nodes.append(helper.make_node("If", ["cond"], [f"{name}/y"], name=name, **branches))
        return Value(f"{name}/y", x.dtype, x.shape)

    def _call(self, scope: Scope, block: Call, x: Value) -> Value:
        index = next(self._calls)
        name = f"F{index}"
        argument = Value(f"f{index}/x", x.dtype, x.shape)
        sub = self._subscope(f"f{index}/", f"function 'local::{name}'", [argument], inputs_visible=False)
        body = self._subgraph(sub, block.body, argument, name)
        self.functions.append(
            helper.make_function(
                "local",
                name,
                [argument.name],
                [body.output[0].name],
                list(body.node),
                [helper.make_opsetid("", self.plan.opset)],
            )
        )
        value = x
        for call in range(block.calls):
            out = f"call{index}_{call}/y"
            scope.nodes.append(helper.make_node(name, [value.name], [out], domain="local", name=f"call{index}_{call}"))
            value = Value(out, x.dtype, x.shape)
        return value

    def _side_chain(self, side: SideChain) -> None:
        index = next(self._sides)
        start = self._graph_input(f"side{index}", self.stream.dtype, tuple(side.shape))
        scope = Scope(
            f"s{index}/", "main graph", "initializer", self.main.nodes, [start], main=True, inputs_visible=True
        )
        self._graph_output(self._chain(scope, side.blocks, start))


def _share_initializers(graph: onnx.GraphProto) -> None:
    """One initializer for each distinct tensor (type, shape, bytes), read by every node that read a copy of it."""
    first: dict[tuple, str] = {}
    renamed: dict[str, str] = {}
    kept = []
    for tensor in graph.initializer:
        key = (tensor.data_type, tuple(tensor.dims), numpy_helper.to_array(tensor).tobytes())
        if key in first:
            renamed[tensor.name] = first[key]
        else:
            first[key] = tensor.name
            kept.append(tensor)
    del graph.initializer[:]
    graph.initializer.extend(kept)
    for node in graph.node:
        node.input[:] = [renamed.get(name, name) for name in node.input]


def _declare_output_shapes(model: onnx.ModelProto) -> None:
    """Graph outputs need a shape (onnx.checker): those declared without one get the inferred one."""
    undeclared = [output for output in model.graph.output if not output.type.tensor_type.HasField("shape")]
    if undeclared:
        inferred = {output.name: output for output in onnx.shape_inference.infer_shapes(model).graph.output}
        for output in undeclared:
            output.type.tensor_type.shape.CopyFrom(inferred[output.name].type.tensor_type.shape)


def reshaped(shape: tuple, param: int) -> tuple[tuple, list[int]]:
    """(new shape, Reshape's shape operand) of a Reshape block: split the last (static, even) dim in two, or merge the
    last two static dims. The leading dims are copied (0), so symbolic dims stay the same symbols."""
    last = shape[-1]
    split = isinstance(last, int) and last % 2 == 0 and last > 2 and len(shape) < 4
    merge = len(shape) > 2 and all(isinstance(dim, int) for dim in shape[-2:])
    if split and (param % 2 == 0 or not merge):
        return shape[:-1] + (2, last // 2), [0] * (len(shape) - 1) + [2, last // 2]
    if merge:
        return shape[:-2] + (shape[-2] * shape[-1],), [0] * (len(shape) - 2) + [shape[-2] * shape[-1]]
    raise ValueError(f"no reshape for shape {shape}")


def can_reshape(shape: tuple) -> bool:
    try:
        reshaped(shape, 0)
    except ValueError:
        return False
    return True


def build(plan: Plan) -> Case:
    builder = Builder(plan)
    for block in plan.blocks:
        builder.append(block)
    return builder.finish()
