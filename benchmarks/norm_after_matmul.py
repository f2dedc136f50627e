"""What one residual norm costs in onnxruntime's profiler, alone and where a decoder runs it: after a MatMul.

    python benchmarks/norm_after_matmul.py                 # H = 256, 1024, 4096; prints a markdown table

Three spellings of the same residual norm, each in two one-thread models:

- alone: the norm is the only computation (its inputs stay in the caches between runs);
- after MatMul: eight layers of ``norm -> MatMul(H x F) -> MatMul(F x H)`` with F = 2^22 / H (float32 weights, 32 MiB
  per layer, more than the caches), the norm's X the last MatMul's output and its skip the previous norm's sum.

The spellings: ``ort_rmsnorm.SkipRMSNorm``, onnxruntime's ``SkipSimplifiedLayerNormalization``, and the decomposed
form a dynamo export leaves (``Add``, ``Pow``, ``ReduceMean``, ``Add``, ``Sqrt``, ``Reciprocal``, ``Mul``, ``Mul``).
For each, the median over the runs of each node's ``_kernel_time``, summed over the norm's nodes; for the decomposed
form also its first node alone. A node that runs first on data a MatMul just wrote pays for it, whichever op it is:
the ratio of a one-node norm to the eight-node form is then bounded by that first node's share, not by the kernels.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from ort_rmsnorm.bench.profile import node_medians, profiled_runs
from ort_rmsnorm.contract import MS_DOMAIN, OP_DOMAIN, OP_VERSION, ORT_SKIP_SIMPLIFIED_LAYER_NORM, SKIP_RMSNORM
from ort_rmsnorm.runtime import make_session

SPELLINGS = (SKIP_RMSNORM, ORT_SKIP_SIMPLIFIED_LAYER_NORM, "decomposed")
EPSILON = 1e-5


def _norm_nodes(spelling: str, x: str, skip: str, weight: str, y: str, total: str, tag: str) -> list:
    if spelling == SKIP_RMSNORM:
        return [helper.make_node(SKIP_RMSNORM, [x, skip, weight], [y, total], domain=OP_DOMAIN,
                                 epsilon=EPSILON, name=f"norm{tag}")]
    if spelling == ORT_SKIP_SIMPLIFIED_LAYER_NORM:
        return [helper.make_node(ORT_SKIP_SIMPLIFIED_LAYER_NORM, [x, skip, weight], [y, "", "", total],
                                 domain=MS_DOMAIN, epsilon=EPSILON, name=f"norm{tag}")]
    n = f"norm{tag}"
    return [
        helper.make_node("Add", [x, skip], [total], name=f"{n}/add"),
        helper.make_node("Pow", [total, "two"], [f"{n}/sq"], name=f"{n}/pow"),
        helper.make_node("ReduceMean", [f"{n}/sq", "axes"], [f"{n}/ms"], keepdims=1, name=f"{n}/mean"),
        helper.make_node("Add", [f"{n}/ms", "eps"], [f"{n}/mse"], name=f"{n}/add_eps"),
        helper.make_node("Sqrt", [f"{n}/mse"], [f"{n}/rms"], name=f"{n}/sqrt"),
        helper.make_node("Reciprocal", [f"{n}/rms"], [f"{n}/inv"], name=f"{n}/reciprocal"),
        helper.make_node("Mul", [total, f"{n}/inv"], [f"{n}/xn"], name=f"{n}/mul"),
        helper.make_node("Mul", [f"{n}/xn", weight], [y], name=f"{n}/scale"),
    ]


def build(spelling: str, hidden: int, layers: int, with_matmuls: bool, rng: np.random.Generator) -> onnx.ModelProto:
    inits = []
    if spelling == "decomposed":
        inits += [numpy_helper.from_array(np.array(2.0, np.float32), "two"),
                  numpy_helper.from_array(np.array([-1], np.int64), "axes"),
                  numpy_helper.from_array(np.array(EPSILON, np.float32), "eps")]
    nodes, x, skip = [], "x", "skip"
    for layer in range(layers if with_matmuls else 1):
        weight, y, total = f"w{layer}", f"y{layer}", f"sum{layer}"
        inits.append(numpy_helper.from_array(rng.uniform(0.5, 1.5, hidden).astype(np.float32), weight))
        nodes += _norm_nodes(spelling, x, skip, weight, y, total, str(layer))
        if with_matmuls:
            up, down = f"up{layer}", f"down{layer}"
            inner = (1 << 22) // hidden
            inits.append(numpy_helper.from_array(rng.normal(0, hidden**-0.5, (hidden, inner)).astype(np.float32), up))
            inits.append(numpy_helper.from_array(rng.normal(0, inner**-0.5, (inner, hidden)).astype(np.float32), down))
            nodes += [helper.make_node("MatMul", [y, up], [f"h{layer}"], name=f"up{layer}"),
                      helper.make_node("MatMul", [f"h{layer}", down], [f"out{layer}"], name=f"down{layer}")]
            x, skip = f"out{layer}", total
        else:
            x = y
    shape = [1, 1, hidden]
    graph = helper.make_graph(
        nodes, "norm_after_matmul",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape),
         helper.make_tensor_value_info("skip", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, shape)], inits)
    opsets = [helper.make_opsetid(domain, version)
              for domain, version in (("", 18), (OP_DOMAIN, OP_VERSION), (MS_DOMAIN, 1))]
    return helper.make_model(graph, opset_imports=opsets, ir_version=9)


def profile(model: onnx.ModelProto, hidden: int, runs: int, directory: Path) -> dict[str, float]:
    """Per node name, its `_kernel_time` in us, median over `runs` profiled runs after a warm-up (one thread)."""
    options = ort.SessionOptions()
    options.enable_profiling = True
    options.profile_file_prefix = str(directory / "profile")
    # ORT_ENABLE_BASIC keeps the decomposed form as written (the extended level may fuse parts of it).
    session = make_session(model, optimization=ort.GraphOptimizationLevel.ORT_ENABLE_BASIC, threads=1,
                           options=options)
    rng = np.random.default_rng(1)
    feeds = {name: rng.standard_normal((1, 1, hidden)).astype(np.float32) for name in ("x", "skip")}
    nodes = profiled_runs(session, {"run": feeds}, {"run": runs})["run"]
    return {name: us for (name, _op), us in node_medians(nodes).items()}


def norm_costs(medians: dict[str, float]) -> tuple[float, float]:
    """(us per norm summed over its nodes, us of its first node), averaged over the model's norms."""
    per_norm: dict[str, list[tuple[str, float]]] = {}
    for name, us in medians.items():
        if name.startswith("norm"):
            per_norm.setdefault(name.split("/")[0], []).append((name, us))
    totals = [sum(us for _, us in nodes) for nodes in per_norm.values()]
    firsts = [next(us for name, us in nodes if "/" not in name or name.endswith("/add")) for nodes in per_norm.values()]
    return statistics.mean(totals), statistics.mean(firsts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hidden", default="256,1024,4096", help="comma-separated hidden sizes")
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--runs", type=int, default=200, help="profiled runs per model")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    print("| H | position | SkipRMSNorm us | SkipSimplifiedLayerNormalization us | decomposed us (first node) "
          "| SkipRMSNorm / decomposed |")
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as scratch:
        for hidden in (int(h) for h in args.hidden.split(",")):
            for with_matmuls in (False, True):
                costs = {s: norm_costs(profile(build(s, hidden, args.layers, with_matmuls, rng), hidden, args.runs,
                                                Path(scratch))) for s in SPELLINGS}
                ours, theirs, (decomposed, first) = costs[SKIP_RMSNORM][0], costs[SPELLINGS[1]][0], costs["decomposed"]
                position = "after MatMul" if with_matmuls else "alone"
                print(f"| {hidden} | {position} | {ours:.1f} | {theirs:.1f} | {decomposed:.1f} ({first:.1f}) "
                      f"| {ours / decomposed:.2f} |", flush=True)


if __name__ == "__main__":
    main()
