"""What one norm node costs per call inside a graph, one row (decode), next to the floor of the custom-op call path.

    cmake -S . -B build/kernel-tests -DORT_RMSNORM_BUILD_TESTS=ON -DORT_RMSNORM_CUDA=OFF
    cmake --build build/kernel-tests --target ort_rmsnorm_call_floor
    python benchmarks/per_call.py --floor-library build/kernel-tests/libort_rmsnorm_call_floor.so

These are warm calls, one after the other; where a decoder runs a norm (cold, right after a MatMul) is measured by
benchmarks/cold_call.py, which also writes the ``auto`` target's shipped table.

Each model is a chain of ``--chain`` stages on a [1, H] input, a stage being the contender followed by a ``Max``
with a constant (a cheap elementwise op, as a real graph has next; ``Max`` has float16 kernels on the CPU, where
onnxruntime would put Casts around a float16 ``Mul``; a stage's outputs feed the next stage, so onnxruntime allocates
and frees intermediates as in a model). The chain of ``Max``s alone is timed too, and each contender's
cost per stage is its chain's time minus that one's, divided by the stage count: the node's kernel plus
onnxruntime's per-node work for it. One intra-op thread, the calling thread's CPU time, io-binding, the models'
runs interleaved, medians over ``--repetitions``.

Contenders (the ``Skip`` ones take X and skip, write Y and the sum, and chain the sum as the next skip):

- ``ReadXAllocate``, ``ReadXSkipAllocate`` (benchmarks/call_floor_op.cc): custom ops that read their tensor inputs'
  dims through the C API and allocate their outputs, nothing else: what any custom op of RMSNorm's or SkipRMSNorm's
  signature must do per call;
- ``Max``: onnxruntime's built-in Max of X and skip: a built-in op's call path with a trivial kernel;
- ``RMSNorm``, ``SkipRMSNorm`` (this package's library, or ``--library``), and onnxruntime's
  ``SimplifiedLayerNormalization`` and ``SkipSimplifiedLayerNormalization``;
- with ``--compare-library PATH``, our two ops from another build of the library too, side by side.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from ort_rmsnorm import get_library_path
from ort_rmsnorm.contract import MS_DOMAIN, OP_DOMAIN, OP_VERSION, ORT_SIMPLIFIED_LAYER_NORM, \
    ORT_SKIP_SIMPLIFIED_LAYER_NORM, RMSNORM, SKIP_RMSNORM

FLOOR_DOMAIN = "ort_rmsnorm_call_floor"
EPSILON = 1e-5
DTYPES = {"float32": (TensorProto.FLOAT, np.float32), "float16": (TensorProto.FLOAT16, np.float16)}


def _stage(kind: str, x: str, skip: str, y: str, total: str) -> tuple[list[onnx.NodeProto], str]:
    """The contender's node(s) on X (and skip) writing y (and total); returns them and the next stage's skip."""
    if kind == "Max":
        return [helper.make_node("Max", [x, skip], [y])], skip
    if kind == "ReadXAllocate":
        return [helper.make_node(kind, [x, "scale"], [y], domain=FLOOR_DOMAIN)], skip
    if kind == "ReadXSkipAllocate":
        return [helper.make_node(kind, [x, skip, "scale"], [y, total], domain=FLOOR_DOMAIN)], total
    if kind == RMSNORM:
        return [helper.make_node(RMSNORM, [x, "scale"], [y], domain=OP_DOMAIN, epsilon=EPSILON)], skip
    if kind == SKIP_RMSNORM:
        node = helper.make_node(SKIP_RMSNORM, [x, skip, "scale"], [y, total], domain=OP_DOMAIN, epsilon=EPSILON)
        return [node], total
    if kind == ORT_SIMPLIFIED_LAYER_NORM:
        return [helper.make_node(kind, [x, "scale"], [y], epsilon=EPSILON, axis=-1, stash_type=1)], skip
    if kind == ORT_SKIP_SIMPLIFIED_LAYER_NORM:
        node = helper.make_node(kind, [x, skip, "scale"], [y, "", "", total], domain=MS_DOMAIN, epsilon=EPSILON)
        return [node], total
    raise ValueError(kind)


def chain(kind: str, hidden: int, dtype: str, stages: int) -> onnx.ModelProto:
    elem, np_type = DTYPES[dtype]
    rng = np.random.default_rng(0)
    initializers = [numpy_helper.from_array((1 + rng.standard_normal(hidden) / 8).astype(np_type), "scale"),
                    numpy_helper.from_array(np.array(-1000, np_type), "low")]
    nodes, x, skip = [], "x", "skip"
    for i in range(stages):
        if kind == "none":  # the baseline: the stage is the Max alone
            y, next_skip = x, skip
        else:
            y = f"y{i}"
            stage_nodes, next_skip = _stage(kind, x, skip, y, f"sum{i}")
            nodes += stage_nodes
        nodes.append(helper.make_node("Max", [y, "low"], [f"x{i + 1}"]))
        x, skip = f"x{i + 1}", next_skip
    value = lambda name: helper.make_tensor_value_info(name, elem, [1, hidden])  # noqa: E731
    outputs = [value(x)] + ([value(skip)] if skip != "skip" else [])
    graph = helper.make_graph(nodes, f"{kind}_chain", [value("x"), value("skip")], outputs, initializers)
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid(OP_DOMAIN, OP_VERSION),
              helper.make_opsetid(MS_DOMAIN, 1), helper.make_opsetid(FLOOR_DOMAIN, 1)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=9)


class Runner:
    def __init__(self, label: str, model: onnx.ModelProto, libraries: list[str], feeds: dict[str, np.ndarray]):
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        options.log_severity_level = 3  # the unused `scale` of some chains is reported as a warning
        for library in libraries:
            options.register_custom_ops_library(library)
        self.label = label
        self.session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        self.binding = self.session.io_binding()
        for name, array in feeds.items():
            self.binding.bind_cpu_input(name, array)
        for output in self.session.get_outputs():
            self.binding.bind_output(output.name)
        self.samples: list[float] = []

    def sample(self, calls: int) -> None:
        start = time.thread_time_ns()
        for _ in range(calls):
            self.session.run_with_iobinding(self.binding)
        self.samples.append((time.thread_time_ns() - start) / calls)


def measure(hidden: int, dtype: str, args: argparse.Namespace) -> dict[str, float]:
    rng = np.random.default_rng(1)
    np_type = DTYPES[dtype][1]
    feeds = {name: rng.standard_normal([1, hidden]).astype(np_type) for name in ("x", "skip")}
    ours = [get_library_path()]
    contenders = [("none", "none", []), ("Max", "Max", [])]
    if args.floor_library:
        contenders += [("ReadXAllocate", "ReadXAllocate", [args.floor_library]),
                       ("ReadXSkipAllocate", "ReadXSkipAllocate", [args.floor_library])]
    contenders += [(RMSNORM, RMSNORM, ours), (ORT_SIMPLIFIED_LAYER_NORM, ORT_SIMPLIFIED_LAYER_NORM, []),
                   (SKIP_RMSNORM, SKIP_RMSNORM, ours),
                   (ORT_SKIP_SIMPLIFIED_LAYER_NORM, ORT_SKIP_SIMPLIFIED_LAYER_NORM, [])]
    if args.compare_library:
        contenders += [(f"{RMSNORM} (compared)", RMSNORM, [args.compare_library]),
                       (f"{SKIP_RMSNORM} (compared)", SKIP_RMSNORM, [args.compare_library])]
    runners = [Runner(label, chain(kind, hidden, dtype, args.chain), libraries, feeds)
               for label, kind, libraries in contenders]
    for runner in runners:  # warm-up
        runner.sample(args.calls)
        runner.samples.clear()
    for _ in range(args.repetitions):
        for runner in runners:
            runner.sample(args.calls)
    baseline = statistics.median(runners[0].samples)
    costs: dict = {r.label: (statistics.median(r.samples) - baseline) / args.chain / 1e3 for r in runners[1:]}
    return costs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--floor-library", help="libort_rmsnorm_call_floor.so (see above); without it, no floor rows")
    parser.add_argument("--compare-library", help="another build of libort_rmsnorm.so, timed side by side")
    parser.add_argument("--hidden", default="256,576,1024,2048,4096", help="comma-separated H")
    parser.add_argument("--dtypes", default="float32,float16", help="comma-separated: float32, float16")
    parser.add_argument("--chain", type=int, default=64, help="stages per chain")
    parser.add_argument("--calls", type=int, default=200, help="runs per sample")
    parser.add_argument("--repetitions", type=int, default=15, help="interleaved samples per model")
    args = parser.parse_args()
    print(f"onnxruntime {ort.__version__}; microseconds per node in a chain of {args.chain}, one row, one thread, "
          f"above the chain of Maxs alone (medians of {args.repetitions} interleaved samples)\n")
    for dtype in args.dtypes.split(","):
        hidden_sizes = [int(h) for h in args.hidden.split(",")]
        rows = {hidden: measure(hidden, dtype, args) for hidden in hidden_sizes}
        labels = list(rows[hidden_sizes[0]])
        print(f"| {dtype}, H | " + " | ".join(labels) + " |")
        print("|---" * (len(labels) + 1) + "|")
        for hidden, costs in rows.items():
            print(f"| {hidden} | " + " | ".join(f"{costs[label]:.3f}" for label in labels) + " |")
        print()


if __name__ == "__main__":
    main()
