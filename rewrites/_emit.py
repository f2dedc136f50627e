"""What the targets share for writing ops: the opset versions a graph imports, the scale as an input of the emitted
node, and a residual norm's sum as Adds."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from ._facts import NotFusable
from ._specs import Scale, SkipSpec


def scale_input(op, scale: Scale | None, node_name: str) -> ir.Value | None:
    """The scale as an input of the emitted node: the graph's value, or a new Constant."""
    if scale is None:
        return None
    if scale.value is not None:
        return scale.value
    return op.Constant(value=ir.tensor(scale.constant, name=f"{node_name}/scale"), _outputs=[f"{node_name}/scale"])


def expand_scale(array: np.ndarray, dims: tuple[int, ...]) -> np.ndarray:
    """A constant scale that broadcasts onto ``dims`` (right-aligned; dims beyond them are 1), with one element per
    element of ``dims``."""
    return np.broadcast_to(array.reshape(array.shape[max(0, array.ndim - len(dims)) :]), dims).copy()


def _imported_version(domain: str, graph_like: ir.Graph | ir.Function, model: ir.Model) -> int | None:
    if isinstance(graph_like, ir.Function) and domain in graph_like.opset_imports:
        return graph_like.opset_imports[domain]
    return model.opset_imports.get(domain)


def require_domain_version(domain: str, version: int, graph_like, model: ir.Model) -> None:
    """The rewriter cannot emit a second version of a domain the model already imports."""
    for imports in (model.opset_imports, graph_like.opset_imports):
        if imports.get(domain, version) != version:
            raise NotFusable(
                f"the model imports domain '{domain}' version {imports[domain]}; the pass emits version {version}"
            )


def default_opset(graph_like: ir.Graph | ir.Function, model: ir.Model) -> int:
    version = _imported_version("", graph_like, model)
    return version if version is not None else _imported_version("ai.onnx", graph_like, model) or 0


def emit_sum(op, spec: SkipSpec) -> tuple[ir.Value, ir.Value]:
    """(the value the norm reads, the ``sum`` output) as Adds: ``(x + skip) + bias``, each addition rounded to
    float32, then rounded to the type. For a 16-bit type the Adds are float32 ones between explicit Casts: onnxruntime
    has no 16-bit Add on the CPU, and the float32 one it puts in for a float16 Add loses that Add's rounding when a
    Cast to float32 follows (it removes the Cast pair it made)."""
    if spec.dtype == ir.DataType.FLOAT:
        total = op.Add(spec.x, spec.skip)
        if spec.bias is not None:
            total = op.Add(total, spec.bias)
        return total, total
    to_float = int(ir.DataType.FLOAT)
    wide = op.Add(op.Cast(spec.x, to=to_float), op.Cast(spec.skip, to=to_float))
    if spec.bias is not None:
        wide = op.Add(wide, op.Cast(spec.bias, to=to_float))
    total = op.Cast(wide, to=int(spec.dtype))
    return (wide if spec.float32_sum else total), total
