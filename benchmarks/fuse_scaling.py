"""How `ort-rmsnorm fuse`'s cost grows with the model: CPU seconds per 10k nodes at several sizes of three models.

    python benchmarks/fuse_scaling.py                      # every shape, the sizes below (several minutes)
    python benchmarks/fuse_scaling.py --shape functions --sizes 25,100,1000
    python benchmarks/fuse_scaling.py --shape norms --sizes 10000,200000
    python benchmarks/fuse_scaling.py --shape llama --sizes 250,1250

- ``norms``: a chain of decomposed RMSNorms (Pow, ReduceMean, Add, Sqrt, Div, Mul by a weight of its own), each
  normalizing the previous one's output; a size is a node count (rounded to whole norms of 6 nodes).
- ``llama``: the package's Llama-style decoder (``ort_rmsnorm.builders.llama``, hidden size 16) with as many layers as the
  size (40 nodes and two norms each: what exporters write, residual adds included);
- ``functions``: model-local functions, each holding a decomposed RMSNorm and calling the next, in chains of
  ``--chain`` functions (default 100) that the main graph calls in turn; a size is the number of functions (8 nodes
  each). onnx's checker refuses calls nested much deeper than 200.

Each size runs `ort_rmsnorm.fusion.fuse_file` (read, check, fuse, write: what `fuse IN.onnx OUT.onnx` does) in a
process of its own and reports its CPU time (this process's, so that other work on a shared machine counts less
than in wall time), split into load / fuse / save, the peak resident memory and the fusions, then the ratio of the
largest size's seconds per 10k nodes to the smallest's: 1 for a cost linear in the model's size. Not a test: the
figures are in docs/benchmarks.md ("Cost of fusing large models").
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

DEFAULT_SIZES = {"norms": [10_000, 50_000, 100_000, 200_000], "llama": [250, 1250, 2500, 5000],
                 "functions": [25, 100, 250, 1000]}
HIDDEN = 16


def norm_chain(nodes: int) -> onnx.ModelProto:
    """About ``nodes`` nodes: a chain of decomposed RMSNorms, each with its own weight."""
    initializers = [numpy_helper.from_array(np.float32(2.0), "two"), numpy_helper.from_array(np.float32(1e-6), "eps"),
                    numpy_helper.from_array(np.array([-1], np.int64), "axes")]
    graph_nodes, x = [], "x"
    for index in range(max(1, nodes // 6)):
        p = f"norm{index}."
        initializers.append(numpy_helper.from_array(np.full(HIDDEN, 1 + index % 7, np.float32), p + "weight"))
        graph_nodes += [
            helper.make_node("Pow", [x, "two"], [p + "sq"], name=p + "pow"),
            helper.make_node("ReduceMean", [p + "sq", "axes"], [p + "ms"], name=p + "mean"),
            helper.make_node("Add", [p + "ms", "eps"], [p + "shifted"], name=p + "add"),
            helper.make_node("Sqrt", [p + "shifted"], [p + "rms"], name=p + "sqrt"),
            helper.make_node("Div", [x, p + "rms"], [p + "normalized"], name=p + "div"),
            helper.make_node("Mul", [p + "normalized", p + "weight"], [p + "y"], name=p + "scale"),
        ]
        x = p + "y"
    graph = helper.make_graph(graph_nodes, "norms",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", HIDDEN])],
                              [helper.make_tensor_value_info(x, TensorProto.FLOAT, ["B", HIDDEN])], initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=9)


def llama(layers: int) -> onnx.ModelProto:
    """A Llama-style decoder of ``layers`` layers, hidden size 16 (about 40 nodes a layer)."""
    from ort_rmsnorm.builders.llama import LlamaConfig, build_llama_onnx

    return build_llama_onnx(LlamaConfig(vocab_size=64, hidden_size=HIDDEN, intermediate_size=2 * HIDDEN,
                                        num_layers=layers, num_heads=2))


def function_chain(count: int, chain: int = 100) -> onnx.ModelProto:
    """``count`` model-local functions, each a decomposed RMSNorm that then calls the next, in chains of ``chain``
    functions that the main graph calls one after the other (onnx's checker refuses calls nested much deeper than
    200)."""
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("local", 1)]
    functions = []
    for index in range(count):
        last = index + 1 == count or (index + 1) % chain == 0
        body = [
            helper.make_node("Constant", [], ["two"], value=numpy_helper.from_array(np.float32(2.0))),
            helper.make_node("Constant", [], ["eps"], value=numpy_helper.from_array(np.float32(1e-6))),
            helper.make_node("Pow", ["x", "two"], ["sq"]),
            helper.make_node("ReduceMean", ["sq"], ["ms"], axes=[-1]),
            helper.make_node("Add", ["ms", "eps"], ["shifted"]),
            helper.make_node("Sqrt", ["shifted"], ["rms"]),
            helper.make_node("Div", ["x", "rms"], ["normalized"]),
            helper.make_node("Identity", ["normalized"], ["y"]) if last
            else helper.make_node(f"Norm{index + 1}", ["normalized"], ["y"], domain="local"),
        ]
        functions.append(helper.make_function("local", f"Norm{index}", ["x"], ["y"], body, opsets))
    calls, x = [], "x"
    for head in range(0, count, chain):
        calls.append(helper.make_node(f"Norm{head}", [x], [f"chain{head}"], domain="local", name=f"call{head}"))
        x = f"chain{head}"
    graph = helper.make_graph(calls, "functions",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", HIDDEN])],
                              [helper.make_tensor_value_info(x, TensorProto.FLOAT, ["B", HIDDEN])])
    return helper.make_model(graph, opset_imports=opsets, functions=functions, ir_version=9)


_CHILD = """
import json, resource, sys, time
from ort_rmsnorm.fusion import ModelFile
import ort_rmsnorm.rewrites  # imported before the clock starts: its import (onnxscript) is no cost of the model
source, destination = sys.argv[1], sys.argv[2]
times = {}
start = time.process_time()
loaded = ModelFile.load(source)
times["load"] = time.process_time() - start
report = loaded.fuse()
times["fuse"] = time.process_time() - start - times["load"]
loaded.save(destination)
times["save"] = time.process_time() - start - times["load"] - times["fuse"]
times["total"] = time.process_time() - start
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({"times": times, "peak_mib": peak, "fusions": len(report.fusions)}))
"""


def measure(model: onnx.ModelProto, folder: Path) -> dict:
    source, destination = folder / "model.onnx", folder / "fused.onnx"
    onnx.save(model, source)
    # From the model's folder: `python -c` puts the working directory first on sys.path, and a checkout's
    # ort_rmsnorm/ (without the pass and the library) would shadow the installed package.
    completed = subprocess.run([sys.executable, "-c", _CHILD, str(source), str(destination)], capture_output=True,
                               cwd=folder, text=True)
    if completed.returncode != 0:
        sys.exit(f"fuse_scaling: the run failed:\n{completed.stderr}")
    return json.loads(completed.stdout.strip().splitlines()[-1])


def node_count(model: onnx.ModelProto) -> int:
    return len(model.graph.node) + sum(len(function.node) for function in model.functions)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=["norms", "llama", "functions", "all"], default="all")
    parser.add_argument("--sizes", help="comma-separated sizes for one --shape (default: %s)" % DEFAULT_SIZES)
    parser.add_argument("--chain", type=int, default=100, help="functions: functions per chain (default 100)")
    args = parser.parse_args()
    shapes = ["norms", "llama", "functions"] if args.shape == "all" else [args.shape]
    for shape in shapes:
        sizes = [int(size) for size in args.sizes.split(",")] if args.sizes else DEFAULT_SIZES[shape]
        print(f"{shape}:")
        print(f"  {'size':>8} {'nodes':>8} {'fusions':>8} {'load s':>8} {'fuse s':>8} {'save s':>8} {'total s':>8} "
              f"{'s/10k nodes':>12} {'peak MiB':>9}")
        per_10k = []
        for size in sizes:
            model = {"norms": norm_chain, "llama": llama}[shape](size) if shape != "functions" \
                else function_chain(size, args.chain)
            with tempfile.TemporaryDirectory() as folder:
                result = measure(model, Path(folder))
            nodes, times = node_count(model), result["times"]
            per_10k.append(times["total"] / nodes * 10_000)
            print(f"  {size:>8} {nodes:>8} {result['fusions']:>8} {times['load']:>8.2f} {times['fuse']:>8.2f} "
                  f"{times['save']:>8.2f} {times['total']:>8.2f} {per_10k[-1]:>12.2f} {result['peak_mib']:>9.0f}",
                  flush=True)
        print(f"  largest / smallest, seconds per 10k nodes: {per_10k[-1] / per_10k[0]:.2f}")


if __name__ == "__main__":
    main()
