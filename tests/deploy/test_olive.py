"""examples/olive: ort-rmsnorm's fusion as a pass of an Olive workflow, with Olive's package configuration extended
rather than changed. Runs where olive-ai is installed (it is no test dependency) and the checkout's examples are
beside the tests; skips otherwise."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import onnx
import pytest

from ort_rmsnorm import verify
from ort_rmsnorm.model.write import save_model
from ort_rmsnorm.builders.llama import LlamaConfig, build_llama_onnx

pytest.importorskip("olive", reason="olive-ai is not installed (pip install olive-ai)")

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "olive"

# Run by Olive in a process of its own: its pass registry and this folder on the path stay there.
_RUN = """
import json, sys
from olive.workflows import run
from package_config import package_config
config = json.load(open("workflow.json"))
config["passes"]["fuse"]["target"] = sys.argv[1]
run(config, package_config=package_config())
"""


@pytest.mark.parametrize("target", ["custom", "ort"])
def test_olive_workflow_fuses_and_keeps_the_outputs(tmp_path, target):
    if not EXAMPLE.is_dir():
        pytest.skip(f"no {EXAMPLE} beside the tests")
    config = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=160, num_layers=2, num_heads=4)
    save_model(build_llama_onnx(config), tmp_path / "model.onnx")
    (tmp_path / "workflow.json").write_text((EXAMPLE / "workflow.json").read_text())
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(EXAMPLE), os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run([sys.executable, "-c", _RUN, target], cwd=tmp_path, env=env, capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    output = tmp_path / json.loads((EXAMPLE / "workflow.json").read_text())["output_dir"] / "model.onnx"
    ops = [(node.domain, node.op_type) for node in onnx.load(output).graph.node]
    # Two layers: 5 norms, 4 of them after a residual add.
    expected = {"custom": [("ort_rmsnorm", "RMSNorm"), ("ort_rmsnorm", "SkipRMSNorm")],
                "ort": [("", "SimplifiedLayerNormalization"), ("com.microsoft", "SkipSimplifiedLayerNormalization")]}
    assert [ops.count(op) for op in expected[target]] == [1, 4], ops
    checked = verify.verify(tmp_path / "model.onnx", output)
    assert checked.ok, checked.describe()
