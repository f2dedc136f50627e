"""int4 weights with onnxruntime's own quantizer (``MatMulNBitsQuantizer`` of
``onnxruntime.quantization.matmul_nbits_quantizer``; ``MatMul4BitsQuantizer`` of ``matmul_4bits_quantizer`` in
releases before it): every MatMul whose weight is a constant becomes a ``com.microsoft.MatMulNBits`` with 4-bit
weights in blocks along the input dimension, the rest of the graph, the norms included, stays as it was.

``onnxruntime.quantization`` is part of the onnxruntime wheel but imports packages that onnxruntime itself does not
require (in recent releases through onnx-ir, which requires sympy): :func:`unavailable` says what is missing.
"""

from __future__ import annotations

import importlib
import logging
import os
from collections import Counter
from dataclasses import dataclass

import onnx

from ..model.write import save_model
from .._logs import quieted

# (module, class), newest first.
QUANTIZERS = (("onnxruntime.quantization.matmul_nbits_quantizer", "MatMulNBitsQuantizer"),
              ("onnxruntime.quantization.matmul_4bits_quantizer", "MatMul4BitsQuantizer"))


@dataclass(frozen=True)
class Int4Options:
    block_size: int = 32
    symmetric: bool = True  # False: a zero point per block
    accuracy_level: int = 0  # MatMulNBits' accuracy_level; 0 leaves it unset (float32 arithmetic on the CPU)


def _import_quantizer() -> type:
    """The quantizer class of this onnxruntime. Importing its module calls ``logging.basicConfig(level=INFO)``, which
    would make every library's INFO lines print: the root logger is put back as it was."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        for module, name in QUANTIZERS:
            try:
                return getattr(importlib.import_module(module), name)
            except ModuleNotFoundError as error:
                if error.name != module:  # the module is there but needs a package that is not
                    raise
        raise ModuleNotFoundError(f"this onnxruntime has none of {', '.join(m for m, _ in QUANTIZERS)}",
                                  name="onnxruntime")
    finally:
        for handler in root.handlers[:]:
            if handler not in handlers:
                root.removeHandler(handler)
        root.setLevel(level)


def unavailable() -> str | None:
    """None when onnxruntime's int4 quantizer imports; otherwise why not and what to install."""
    try:
        _import_quantizer()
    except ImportError as error:
        package = "-U onnxruntime" if (error.name or "").startswith("onnxruntime") else error.name
        install = f" (pip install {package})" if package else ""
        return f"onnxruntime's int4 quantizer cannot be imported: {error}{install}"
    return None


def quantize(source: str | os.PathLike, destination: str | os.PathLike, options: Int4Options = Int4Options()) -> dict:
    """Writes the int4 model of ``source`` to ``destination`` (weights in external data next to it when large);
    returns the quantizer's class name and the op counts after quantization (MatMuls left: no constant weight):
    ``{"quantizer": "MatMulNBitsQuantizer", "MatMulNBits": n, "MatMul": m}``."""
    quantizer_class = _import_quantizer()
    model = onnx.load(str(source))
    with quieted("onnxruntime.quantization", logging.WARNING):  # a line per MatMul at INFO level
        quantizer = quantizer_class(model, block_size=options.block_size, is_symmetric=options.symmetric,
                                         accuracy_level=options.accuracy_level or None)
        quantizer.process()
    quantized = quantizer.model.model
    save_model(quantized, destination, protected=[source])
    counts = Counter(node.op_type for node in quantized.graph.node)
    return {"quantizer": quantizer_class.__name__, "MatMulNBits": counts["MatMulNBits"], "MatMul": counts["MatMul"]}
