"""Models with external data: fused without loading the weights, the output keeps external data and runs.

The test model holds 4 x 64 MiB of float32 weights in an external data file (written tensor by tensor, so the test
itself never holds them all either). Peak memory of `ort-rmsnorm fuse` is measured in its own process (VmHWM) and
compared with the same command on the same graph with tiny weights, which imports and does everything else alike.
Linux only (/proc).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from op_models import make_model

LAYERS = 4
# Peak memory of the big run over the small run's, as a share of the weights' size.
MAX_EXTRA_MEMORY_SHARE = 0.25

# VmHWM, the peak resident set of this process image: unlike ru_maxrss, which survives execve and so includes the
# forking parent's resident set, it starts afresh when the subprocess starts.
_MEASURED_MAIN = """
import sys
from ort_rmsnorm.cli import main
status = main(sys.argv[1:])
peak = next(line.split()[1] for line in open("/proc/self/status") if line.startswith("VmHWM:"))
print(f"peak_rss_kib={peak}", file=sys.stderr)
sys.exit(status)
"""


def _external_tensor(name: str, shape: tuple[int, ...], location: str, offset: int) -> onnx.TensorProto:
    tensor = TensorProto(name=name, data_type=TensorProto.FLOAT, dims=shape, data_location=TensorProto.EXTERNAL)
    length = int(np.prod(shape)) * 4
    for key, value in (("location", location), ("offset", str(offset)), ("length", str(length))):
        tensor.external_data.add(key=key, value=value)
    return tensor


def write_residual_model(folder: Path, hidden: int, layers: int = LAYERS) -> tuple[Path, int]:
    """``layers`` blocks of ``x = x + MatMul(RMSNorm(x), W)`` (the HF float32 spelling), then a final norm; all
    weights in ``weights.bin``. Returns the model path and the weights' size in bytes."""
    rng = np.random.default_rng(0)
    data_path, initializers, nodes = folder / "weights.bin", [], []
    initializers += [numpy_helper.from_array(np.float32(2.0), "two"), numpy_helper.from_array(np.float32(1e-6), "eps"),
                     numpy_helper.from_array(np.array([-1], np.int64), "last_axis")]

    with open(data_path, "wb") as data:
        def add_weight(name: str, values: np.ndarray) -> None:
            initializers.append(_external_tensor(name, values.shape, data_path.name, data.tell()))
            values.astype(np.float32).tofile(data)

        def norm(x: str, prefix: str) -> str:
            add_weight(f"{prefix}.weight", 1.0 + 0.1 * rng.standard_normal(hidden, dtype=np.float32))
            nodes.extend([
                helper.make_node("Pow", [x, "two"], [f"{prefix}.sq"], name=f"{prefix}.pow"),
                helper.make_node("ReduceMean", [f"{prefix}.sq", "last_axis"], [f"{prefix}.ms"], name=f"{prefix}.mean"),
                helper.make_node("Add", [f"{prefix}.ms", "eps"], [f"{prefix}.shifted"], name=f"{prefix}.add"),
                helper.make_node("Sqrt", [f"{prefix}.shifted"], [f"{prefix}.rms"], name=f"{prefix}.sqrt"),
                helper.make_node("Reciprocal", [f"{prefix}.rms"], [f"{prefix}.inv"], name=f"{prefix}.rsqrt"),
                helper.make_node("Mul", [x, f"{prefix}.inv"], [f"{prefix}.normalized"], name=f"{prefix}.normalize"),
                helper.make_node("Mul", [f"{prefix}.weight", f"{prefix}.normalized"], [f"{prefix}.out"], name=prefix),
            ])
            return f"{prefix}.out"

        x = "x"
        for layer in range(layers):
            add_weight(f"layer{layer}.proj", rng.standard_normal((hidden, hidden), dtype=np.float32) / np.sqrt(hidden))
            projected = f"layer{layer}.projected"
            nodes.append(helper.make_node("MatMul", [norm(x, f"layer{layer}.norm"), f"layer{layer}.proj"], [projected],
                                          name=f"layer{layer}.proj"))
            nodes.append(helper.make_node("Add", [x, projected], [f"layer{layer}.residual"],
                                          name=f"layer{layer}.residual"))
            x = f"layer{layer}.residual"
        nodes.append(helper.make_node("Identity", [norm(x, "final_norm")], ["y"], name="output"))
        size = data.tell()

    graph = helper.make_graph(
        nodes, "residual_stack",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "sequence", hidden])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "sequence", hidden])],
        initializers,
    )
    path = folder / "model.onnx"
    onnx.save_model(make_model(graph, [helper.make_opsetid("", 18)]), path)
    return path, size


def _fuse_measured(model: Path, output: Path) -> tuple[subprocess.CompletedProcess, int]:
    completed = subprocess.run([sys.executable, "-c", _MEASURED_MAIN, "fuse", str(model), str(output), "--quiet"],
                               capture_output=True, text=True, timeout=600)
    peak = int(completed.stderr.rsplit("peak_rss_kib=", 1)[1].split()[0]) * 1024
    return completed, peak


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="peak memory is read from /proc (Linux)")
def test_fuse_keeps_weights_external_and_on_disk(cli, digest, tmp_path):
    small_folder, big_folder = tmp_path / "small", tmp_path / "big"
    small_folder.mkdir()
    big_folder.mkdir()
    small_model, _ = write_residual_model(small_folder, hidden=64)
    big_model, weights_bytes = write_residual_model(big_folder, hidden=4096)
    assert 250e6 < weights_bytes <= 300e6
    data_hash = digest(big_folder / "weights.bin")

    small_run, small_peak = _fuse_measured(small_model, small_folder / "fused.onnx")
    assert small_run.returncode == 0, small_run.stderr
    big_run, big_peak = _fuse_measured(big_model, big_folder / "fused.onnx")
    assert big_run.returncode == 0, big_run.stderr
    extra = big_peak - small_peak
    print(f"peak RSS: {big_peak / 2**20:.0f} MiB with {weights_bytes / 2**20:.0f} MiB of external weights, "
          f"{small_peak / 2**20:.0f} MiB with tiny weights: {extra / 2**20:.0f} MiB more")
    assert extra < MAX_EXTRA_MEMORY_SHARE * weights_bytes, (big_peak, small_peak)

    # Every norm fused; the output keeps its weights in its own data file, the input's data is untouched.
    assert f"{LAYERS + 1} fused" in big_run.stdout
    output = big_folder / "fused.onnx"
    output_data = big_folder / "fused.onnx.data"
    assert output.stat().st_size < 1e6 and output_data.stat().st_size >= weights_bytes
    fused = onnx.load(output, load_external_data=False)
    locations = {entry.value for tensor in fused.graph.initializer for entry in tensor.external_data
                 if entry.key == "location"}
    assert locations == {"fused.onnx.data"}
    assert digest(big_folder / "weights.bin") == data_hash
    assert sorted(entry.name for entry in big_folder.iterdir()) == ["fused.onnx", "fused.onnx.data", "model.onnx",
                                                                     "weights.bin"]

    # The output runs and matches the original.
    result = cli("verify", big_model, output, "--dim", "sequence=3")
    assert result.returncode == 0, result
    assert "verify: all of 1 outputs match" in result.stdout


def _with_ort_norm_ops(model: Path) -> None:
    """Replaces each norm's Pow with onnxruntime's SimplifiedLayerNormalization of the same input (its output left
    unused), so that the model holds ops the checker knows only in onnxruntime's domain; the weights stay external."""
    proto = onnx.load(model, load_external_data=False)
    gamma = numpy_helper.from_array(np.ones(64, np.float32), "gamma_of_ort_norm")
    proto.graph.initializer.append(gamma)
    proto.graph.node.append(helper.make_node("SimplifiedLayerNormalization", ["x", gamma.name], ["ort_norm.out"],
                                             name="ort_norm", axis=-1, epsilon=1e-5))
    proto.graph.output.append(helper.make_tensor_value_info("ort_norm.out", TensorProto.FLOAT,
                                                            ["batch", "sequence", 64]))
    onnx.save_model(proto, model)


def test_fuse_from_another_directory_with_ort_ops_and_external_data(cli, digest, tmp_path):
    """onnx.checker resolves an in-memory model's external data against the current directory: the model must be
    checked as stored next to its data, wherever the command runs."""
    folder, elsewhere = tmp_path / "model", tmp_path / "elsewhere"
    folder.mkdir()
    elsewhere.mkdir()
    model, _ = write_residual_model(folder, hidden=64, layers=2)
    _with_ort_norm_ops(model)
    before = digest(folder / "weights.bin")
    result = cli("fuse", model.resolve(), "out.onnx", "--quiet", "--verify", "--dim", "sequence=3", cwd=elsewhere)
    assert result.returncode == 0, result
    assert "4 fused" in result.stdout  # 3 decomposed norms and the converted SimplifiedLayerNormalization
    assert "verify: all of 2 outputs match" in result.stdout
    assert (elsewhere / "out.onnx.data").is_file() and digest(folder / "weights.bin") == before
