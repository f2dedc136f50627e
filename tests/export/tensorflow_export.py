"""Exports small Keras and TensorFlow models with tf2onnx, as a TensorFlow user gets them to ONNX, and records what
TensorFlow itself computes on one input.

    python tests/export/tensorflow_export.py OUT_DIR [CASE ...]

For each case and opset in :data:`OPSETS` it writes ``OUT_DIR/<case>-opset<N>.onnx``, the inputs
(``<case>.inputs.npz``) and TensorFlow's output on them (``<case>.tensorflow.npy``), and ``OUT_DIR/manifest.json``: per
model, the number of norms counted from the Keras model's layers (``RMSNormalization`` and the hand-written
:class:`TfRMSNorm`; ``LayerNormalization``), how many of the RMSNorms normalize the output of an ``Add`` layer (a
residual sum), the float type the model computes in, and the versions used. tests/export/test_tensorflow_models.py
runs it in a subprocess (TensorFlow is then never imported into the test process) with the interpreter it finds
TensorFlow in.

Needs tensorflow, keras and tf2onnx (``pip install .[test-tensorflow]``). Importing this module imports none of them:
the tests read :data:`CASES` and :data:`OPSETS` from it.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

HIDDEN = 16
EPSILON = 1e-6
OPSETS = (17, 18)
CASES = {
    "keras_rmsnorm": "keras.layers.RMSNormalization on [batch, sequence, 16]",
    "tf_rmsnorm": "x * tf.math.rsqrt(tf.reduce_mean(tf.square(x), -1, keepdims=True) + eps) * w in a Keras layer",
    "keras_residual": "two residual blocks h + Dense(RMSNormalization(h)) and a final RMSNormalization",
    "tf_residual": "the same blocks with the hand-written norm",
    "keras_two_axes": "RMSNormalization(axis=[-2, -1]) on [batch, sequence, 4, 16]",
    "keras_residual_mixed_float16": "keras_residual under the mixed_float16 policy",
    "tf_residual_mixed_float16": "tf_residual under the mixed_float16 policy",
    "tf_function_rmsnorm": "the hand-written norm in a tf.function; tf2onnx makes its captured scale a graph input",
    "keras_rmsnorm_and_layernorm": "RMSNormalization -> Dense -> LayerNormalization -> Dense",
    "keras_layernorm": "keras_residual with LayerNormalization: must stay unfused",
    "keras_layernorm_rms_scaling": "keras_residual with LayerNormalization(rms_scaling=True): variance about the mean",
    "tf_norm_root": "x / (tf.norm(x, axis=-1, keepdims=True) / sqrt(d)) * w: an RMSNorm with epsilon 0",
    "tf_norm_eps_outside": "x / (tf.norm(x, axis=-1, keepdims=True) * d**-0.5 + eps) * w: epsilon outside the sqrt",
    "tf_rsqrt_sum": "x * tf.math.rsqrt(tf.reduce_sum(tf.square(x), -1, keepdims=True) + eps) * w: eps/d, 1/sqrt(d)",
    "tf_l2_normalize": "tf.math.l2_normalize(x, -1) * w: max(sum, eps), a clamp, never fused",
}
L2_CASES = ("tf_norm_root", "tf_norm_eps_outside", "tf_rsqrt_sum", "tf_l2_normalize")
"""The L2-norm family, exported at more opsets: ReduceSum takes its axes as an input from opset 13."""


def opsets_of(case: str) -> tuple[int, ...]:
    return (13, 15, 17, 18) if case in L2_CASES else OPSETS


def model_name(case: str, opset: int) -> str:
    return f"{case}-opset{opset}"


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    out = Path(argv[0])
    cases = argv[1:] or list(CASES)
    unknown = [case for case in cases if case not in CASES]
    if unknown:
        print(f"unknown cases: {', '.join(unknown)}; known: {', '.join(CASES)}", file=sys.stderr)
        return 2
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
    out.mkdir(parents=True, exist_ok=True)
    exporter = _Exporter(out)
    manifest = [exporter.export(case, opset) for case in cases for opset in opsets_of(case)]
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2))
    return 0


class _Exporter:
    def __init__(self, out: Path) -> None:
        import keras
        import numpy as np
        import tensorflow as tf
        import tf2onnx

        self.out, self.keras, self.np, self.tf, self.tf2onnx = out, keras, np, tf, tf2onnx
        self.versions = {"tensorflow": tf.__version__, "keras": keras.__version__, "tf2onnx": tf2onnx.__version__}
        self.TfRMSNorm = _hand_written_norm(keras, tf)
        self.l2_norms = _l2_norms(keras, tf)

    # ---- the models ----

    def _norm(self, kind: str, **kwargs):
        layers = self.keras.layers
        return {
            "keras": lambda: layers.RMSNormalization(epsilon=EPSILON, **kwargs),
            "tf": lambda: self.TfRMSNorm(),
            "layer": lambda: layers.LayerNormalization(),
            "layer_rms_scaling": lambda: layers.LayerNormalization(rms_scaling=True),
        }[kind]()

    def _residual(self, kind: str, policy: str = "float32"):
        keras = self.keras
        keras.mixed_precision.set_global_policy(policy)
        try:
            x = keras.Input(shape=(None, HIDDEN), name="x")
            h = x
            for _ in range(2):
                h = keras.layers.Add()([h, keras.layers.Dense(HIDDEN)(self._norm(kind)(h))])
            return keras.Model(x, self._norm(kind)(h))
        finally:
            keras.mixed_precision.set_global_policy("float32")

    def build(self, case: str):
        keras = self.keras
        if case in ("keras_rmsnorm", "tf_rmsnorm"):
            x = keras.Input(shape=(None, HIDDEN), name="x")
            return keras.Model(x, self._norm(case.split("_")[0])(x))
        if case in L2_CASES:
            x = keras.Input(shape=(None, HIDDEN), name="x")
            return keras.Model(x, self.l2_norms[case]()(x))
        if case == "keras_two_axes":
            x = keras.Input(shape=(None, 4, HIDDEN), name="x")
            return keras.Model(x, self._norm("keras", axis=[-2, -1])(x))
        if case == "keras_rmsnorm_and_layernorm":
            x = keras.Input(shape=(None, HIDDEN), name="x")
            h = keras.layers.Dense(HIDDEN)(self._norm("keras")(x))
            return keras.Model(x, keras.layers.Dense(HIDDEN)(self._norm("layer")(h)))
        kind = {"keras_layernorm": "layer", "keras_layernorm_rms_scaling": "layer_rms_scaling"}.get(case)
        if kind is not None:
            return self._residual(kind)
        kind, _, policy = case.partition("_residual")
        return self._residual(kind, "mixed_float16" if policy else "float32")

    def _randomize(self, model, rng) -> None:
        """Weights that are not ones and zeros, so that a lost scale, bias or epsilon shows."""
        for variable in model.weights:
            path = getattr(variable, "path", variable.name)
            shape = tuple(variable.shape)
            if path.endswith("kernel"):
                values = rng.standard_normal(shape) / self.np.sqrt(HIDDEN)
            elif path.endswith(("bias", "beta")):
                values = 0.1 * rng.standard_normal(shape)
            else:  # scale, gamma, w
                values = 1 + 0.2 * rng.standard_normal(shape)
            variable.assign(values.astype(variable.dtype))

    # ---- export ----

    def export(self, case: str, opset: int) -> dict:
        np, tf = self.np, self.tf
        self.keras.utils.set_random_seed(opset)
        rng = np.random.default_rng(opset)
        name = model_name(case, opset)
        rank4 = case == "keras_two_axes"
        x = rng.standard_normal((2, 5, 4, HIDDEN) if rank4 else (2, 5, HIDDEN)).astype(np.float32)
        spec = (tf.TensorSpec((None, None, 4, HIDDEN) if rank4 else (None, None, HIDDEN), tf.float32, name="x"),)
        if case == "tf_function_rmsnorm":
            proto, feeds, expected, counts = self._export_function(spec, x, rng, opset)
        else:
            model = self.build(case)
            self._randomize(model, rng)
            proto, _ = self.tf2onnx.convert.from_keras(model, input_signature=spec, opset=opset)
            feeds, expected, counts = {"x": x}, np.asarray(model(x)), self._counted(model)
        path = self.out / f"{name}.onnx"
        path.write_bytes(proto.SerializeToString())
        np.savez(self.out / f"{name}.inputs.npz", **feeds)
        np.save(self.out / f"{name}.tensorflow.npy", expected)
        return {
            "name": name,
            "case": case,
            "opset": opset,
            "model": path.name,
            "inputs": f"{name}.inputs.npz",
            "tensorflow_output": f"{name}.tensorflow.npy",
            "output": proto.graph.output[0].name,
            "arithmetic": "float16" if "mixed_float16" in case else "float32",
            **counts,
            "versions": self.versions,
        }

    def _export_function(self, spec, x, rng, opset):
        np, tf = self.np, self.tf
        w = tf.constant((1 + 0.2 * rng.standard_normal(HIDDEN)).astype(np.float32))

        @tf.function
        def norm(x):
            return x * tf.math.rsqrt(tf.reduce_mean(tf.square(x), -1, keepdims=True) + EPSILON) * w

        proto, _ = self.tf2onnx.convert.from_function(norm, input_signature=spec, opset=opset)
        captured = [value.name for value in proto.graph.input if value.name != "x"]
        if len(captured) != 1:
            raise RuntimeError(f"expected tf2onnx to make the captured scale one graph input, got {captured}")
        feeds = {"x": x, captured[0]: w.numpy()}
        return proto, feeds, norm(x).numpy(), {"rmsnorms": 1, "residual": 0, "layernorms": 0}

    def _counted(self, model) -> dict:
        """The norms of a Keras model, from its layers; a norm is residual when its input is an Add layer's output."""
        layers = self.keras.layers
        fused = tuple(self.l2_norms[case] for case in L2_CASES if case != "tf_l2_normalize")
        rms = [layer for layer in model.layers
               if isinstance(layer, (layers.RMSNormalization, self.TfRMSNorm, *fused))]
        residual = [layer for layer in rms if isinstance(layer.input._keras_history.operation, layers.Add)]
        layer_norms = [layer for layer in model.layers if isinstance(layer, layers.LayerNormalization)]
        eps_outside = [layer for layer in model.layers if isinstance(layer, self.l2_norms["tf_norm_eps_outside"])]
        clamped = [layer for layer in model.layers if isinstance(layer, self.l2_norms["tf_l2_normalize"])]
        return {"rmsnorms": len(rms), "residual": len(residual), "layernorms": len(layer_norms),
                "eps_outside": len(eps_outside), "clamped": len(clamped)}


def _hand_written_norm(keras, tf):
    class TfRMSNorm(keras.layers.Layer):
        """An RMSNorm as TensorFlow users write it."""

        def build(self, input_shape):
            self.w = self.add_weight(shape=(input_shape[-1],), initializer="ones", name="w")

        def call(self, x):
            return x * tf.math.rsqrt(tf.reduce_mean(tf.square(x), -1, keepdims=True) + EPSILON) * self.w

    return TfRMSNorm


def _l2_norms(keras, tf):
    """The L2-norm family as TensorFlow users write it, each a Keras layer with a scale ``w``."""

    class _Scaled(keras.layers.Layer):
        def build(self, input_shape):
            self.w = self.add_weight(shape=(input_shape[-1],), initializer="ones", name="w")

    class TfNormRoot(_Scaled):
        def call(self, x):
            return x / (tf.norm(x, axis=-1, keepdims=True) / tf.sqrt(float(x.shape[-1]))) * self.w

    class TfNormEpsOutside(_Scaled):
        def call(self, x):
            return x / (tf.norm(x, axis=-1, keepdims=True) * float(x.shape[-1]) ** -0.5 + EPSILON) * self.w

    class TfRsqrtSum(_Scaled):
        def call(self, x):
            return x * tf.math.rsqrt(tf.reduce_sum(tf.square(x), -1, keepdims=True) + EPSILON) * self.w

    class TfL2Normalize(_Scaled):
        def call(self, x):
            return tf.math.l2_normalize(x, -1) * self.w

    return dict(zip(L2_CASES, (TfNormRoot, TfNormEpsOutside, TfRsqrtSum, TfL2Normalize)))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
