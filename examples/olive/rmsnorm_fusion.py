"""An Olive pass that fuses a model's RMSNorms with ort-rmsnorm: ``RMSNormFusion``.

Olive finds a pass type in its package configuration, a JSON file mapping each type to the class's module path; a
workflow may name another one (``olive run --package-config FILE``, ``olive.workflows.run(config,
package_config=...)``). ``python package_config.py`` writes Olive's own configuration with this pass added, so no
file of Olive's is changed. This file must be importable where Olive runs (this folder on ``PYTHONPATH``).

Pass options: ``target`` (``custom``, the default, ``auto``, ``ort``, ``onnx``, ``decomposed``: as
``ort-rmsnorm fuse --target``) and ``allow_opset_upgrade`` (``--convert-opset``). A model fused for ``custom`` or
``auto`` runs in sessions that load the library (``ort_rmsnorm.session_options()``); ``ort`` writes onnxruntime's
own ops only.
"""

from __future__ import annotations

from pathlib import Path

import ort_rmsnorm
from olive.hardware.accelerator import AcceleratorSpec
from olive.model import ONNXModelHandler
from olive.model.utils import resolve_onnx_path
from olive.passes import Pass
from olive.passes.pass_config import BasePassConfig, PassConfigParam


class RMSNormFusion(Pass):
    """Fuses the model's RMSNorm subgraphs and norm ops into one op each (ort_rmsnorm.fuse_file)."""

    @classmethod
    def _default_config(cls, accelerator_spec: AcceleratorSpec) -> dict[str, PassConfigParam]:
        return {
            "target": PassConfigParam(type_=str, default_value="custom",
                                      description="what the norms become: custom, auto, ort, onnx or decomposed"),
            "allow_opset_upgrade": PassConfigParam(type_=bool, default_value=False,
                                                   description="raise the model's opset where a target needs it"),
        }

    def _run_for_config(self, model: ONNXModelHandler, config: type[BasePassConfig],
                        output_model_path: str) -> ONNXModelHandler:
        output = Path(resolve_onnx_path(output_model_path, Path(model.model_path).name))
        output.parent.mkdir(parents=True, exist_ok=True)
        # The same route as `ort-rmsnorm fuse`: the model's external data, if any, is written beside the output.
        ort_rmsnorm.fuse_file(model.model_path, output, config.target,
                              allow_opset_upgrade=config.allow_opset_upgrade)
        return ONNXModelHandler(model_path=str(output))
