"""Graph rewrite rules that fuse decomposed RMSNorm subgraphs (installed as ``ort_rmsnorm.rewrites``).

- :func:`fuse_model`: the whole pass over an ``onnx_ir.Model``, in place, returning a :class:`FusionReport`.
- :func:`rules`: the rules as an onnxscript ``RewriteRuleSet`` to compose with other rewrites.
- :func:`infer_types`: the shape inference the pass runs (results kept aside, the model is not annotated; it lives
  in :mod:`ort_rmsnorm.model.types`).

See docs/fusion.md for the recognized spellings, the near-miss reasons, the targets and the report format.
"""

from ort_rmsnorm.model.types import TypeTable, infer_types

from ._pass import fuse_model, rules, upgrade_default_opset
from ._report import Fusion, FusionReport, Skipped
from ._target_list import TARGETS

__all__ = [
    "TARGETS",
    "Fusion",
    "FusionReport",
    "Skipped",
    "TypeTable",
    "fuse_model",
    "infer_types",
    "rules",
    "upgrade_default_opset",
]
