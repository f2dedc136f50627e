"""Checking that a fused model computes what the original computes.

Both models run in onnxruntime with our library registered and the same session options, on the same deterministic
inputs, and every output is compared with a tolerance that depends on its dtype. Each norm op of the fused model is
checked too (:mod:`ort_rmsnorm.norm_checks`): against a float64 evaluation of its definition, and the original's value
at that point against the same, so that a semantic change the outputs' tolerance lets through (an epsilon, a scale)
fails at its norm, and an output difference beyond its tolerance while every norm keeps its definition is reported
as rounding amplified by the quantizing or discontinuous ops downstream (:attr:`VerifyResult.explained`), not failed.

Inputs: :mod:`ort_rmsnorm.feeds` (float inputs standard normal from a fixed seed, integer and bool inputs valid for
their usual meanings, small sizes for symbolic dims).

Tolerance: an output element passes when ``|fused - original| <= rtol_T * (|original| + rms(original))``, where
``rms`` is the root mean square of the original output's finite values. The fused op rounds once where an unfused
float16/bfloat16 graph rounds twice (docs/ops.md, "Numerics"), so the two differ by about one unit in the last place of
``T`` at the norm, and downstream layers carry that difference on in proportion to the typical size of their
outputs, hence the ``rms`` term; it grows slowly with depth. ``rtol_T`` is 8 units in the last place at 1 (ulp:
2^-10 for float16, 2^-7 for bfloat16), i.e. 2^-7 and 2^-4. Measured on Llama-style float16 models (hidden 256, 32
tokens), the largest difference is 1.2 ulp after 1 decoder layer and 3.1 ulp after 16. For float32, 2^-14 also
covers the float32 rounding of the unfused graph's several ops; measured: at most 4e-6 after 16 layers. NaN and
infinities must sit at the same places with the same signs. Integer and bool outputs must be equal.

``T`` is the least precise of the output's dtype and the float types the original model computes in
(:func:`ort_rmsnorm.model.types.computed_dtypes`): a float16 model whose logits are cast to float32 at the end carries
float16 differences into its float32 output, and a float64 output computed in float32 carries float32 ones.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Mapping

import ml_dtypes
import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort

from . import norm_checks, runtime
from .contract import OPTIMIZATION_LEVEL_NAMES
from .feeds import DEFAULT_SEED, VerifyInputError, make_inputs
from .model.read import load_model, one_line
from .model.types import computed_dtypes
from .runtime import BFLOAT16
from .schemas import register_schemas

# Relative tolerance per output dtype (see the module docstring).
RELATIVE_TOLERANCE = {
    np.dtype(np.float64): 2.0**-40,
    np.dtype(np.float32): 2.0**-14,
    np.dtype(np.float16): 2.0**-7,
    BFLOAT16: 2.0**-4,
}

OPTIMIZATION_LEVELS = dict(zip(OPTIMIZATION_LEVEL_NAMES, (
    ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
), strict=True))


# onnxruntime's Python exceptions (Fail, InvalidArgument, InvalidGraph, ...) derive from Exception directly.
_ORT_ERRORS = (RuntimeError,) + tuple(
    error
    for error in vars(ort.capi.onnxruntime_pybind11_state).values()
    if isinstance(error, type) and issubclass(error, Exception)
)


class FusedModelError(Exception):
    """The fused model cannot be loaded or run where the original can: a verification failure."""


@dataclasses.dataclass
class OutputComparison:
    name: str
    dtype: str
    shape: tuple
    max_abs: float
    max_rel: float
    tolerance: float | None  # None: compared exactly
    problem: str | None = None  # why it failed beyond the numbers (shape, dtype, NaN placement)
    arithmetic: str | None = None  # the model's float type that set the tolerance, where it is not the output's

    @property
    def ok(self) -> bool:
        return self.problem is None and (self.tolerance is None or self.max_rel <= self.tolerance)

    def describe(self, explained: bool = False) -> str:
        """``explained``: the per-norm check explains a difference beyond the tolerance
        (:attr:`VerifyResult.explained`)."""
        verdict = "ok" if self.ok else "beyond tolerance, explained below" if explained else "MISMATCH"
        head = f"output '{self.name}' {self.dtype} {list(self.shape)}"
        if self.problem is not None:
            return f"{head}: {verdict}: {self.problem}"
        if 0 in self.shape:
            return f"{head}: empty, nothing to compare: {verdict}"
        if self.tolerance is None:
            return f"{head}: equal: {verdict}"
        basis = f" for the model's {self.arithmetic} arithmetic" if self.arithmetic else ""
        return (f"{head}: max abs {self.max_abs:.3g}, max rel {self.max_rel:.3g} (tolerance {self.tolerance:.3g}"
                f"{basis}): {verdict}")


@dataclasses.dataclass
class VerifyResult:
    inputs: dict[str, tuple[str, tuple]]  # name -> (dtype, shape) of the inputs used
    outputs: list[OutputComparison]
    norms: norm_checks.NormReport | None = None
    """The per-norm check (:mod:`ort_rmsnorm.norm_checks`); None when it was not asked for."""

    @property
    def outputs_ok(self) -> bool:
        return all(output.ok for output in self.outputs)

    @property
    def explained(self) -> bool:
        """Outputs beyond their tolerance only in their numbers, every norm keeping its exact definition, and ops
        downstream of the norms that quantize or are discontinuous: the difference is rounding they amplified."""
        return (not self.outputs_ok and all(output.problem is None for output in self.outputs)
                and self.norms is not None and self.norms.problem is None and bool(self.norms.norms)
                and self.norms.ok and bool(self.norms.amplifiers))

    @property
    def norms_ok(self) -> bool:
        return self.norms is None or self.norms.ok

    @property
    def ok(self) -> bool:
        return self.norms_ok and (self.outputs_ok or self.explained)

    def describe(self, verbose: bool = False) -> str:
        """The inputs, each output's comparison, the per-norm summary (each norm's verdict when one differs or
        with ``verbose``) and the verdict line."""
        feeds = ", ".join(f"{name} {dtype} {list(shape)}" for name, (dtype, shape) in self.inputs.items())
        lines = [f"inputs: {feeds or '(none)'}", *(output.describe(self.explained) for output in self.outputs)]
        if self.norms is not None:
            lines.append(self.norms.summary())
            lines += [f"  {norm.describe()}" for norm in self.norms.norms if verbose or not norm.ok]
        matched = sum(output.ok for output in self.outputs)
        verdict = (f"verify: {'all' if self.outputs_ok else matched} of {len(self.outputs)} outputs match"
                   + ("" if self.outputs_ok else f"; {len(self.outputs) - matched} MISMATCH"))
        if self.explained:
            verdict = (f"verify: {matched} of {len(self.outputs)} outputs within tolerance; the rest explained by "
                       f"rounding at {len(self.norms.norms)} norms (max "
                       f"{norm_checks.ulps_text(self.norms.max_ulps)}), amplified by "
                       f"{', '.join(self.norms.amplifiers)}")
        if not self.norms_ok:
            failed = sum(not norm.ok for norm in self.norms.norms)
            verdict += f"; {failed} norm{'s' if failed != 1 else ''} MISMATCH"
        lines.append(verdict)
        return "\n".join(lines)


# --- comparison ---------------------------------------------------------------------------------------------------


def arithmetic_dtype(model: ir.Model) -> np.dtype | None:
    """The least precise float type among those the model computes in, or None when it computes in none of
    :data:`RELATIVE_TOLERANCE`'s types."""
    floats = [dtype for dtype in map(_numpy_dtype, computed_dtypes(model)) if dtype in RELATIVE_TOLERANCE]
    return max(floats, key=RELATIVE_TOLERANCE.__getitem__, default=None)


def _numpy_dtype(dtype: ir.DataType) -> np.dtype | None:
    try:
        return np.dtype(dtype.numpy())
    except TypeError:  # no numpy equivalent (UNDEFINED; types older onnx_ir releases cannot map)
        return None


def compare(name: str, original: np.ndarray, fused: np.ndarray, arithmetic: np.dtype | None = None) -> OutputComparison:
    """Compares one output of the fused model with the original's (see the module docstring for the criterion).

    ``arithmetic``: the least precise float type the original model computes in (:func:`arithmetic_dtype`); a float
    output's tolerance is that type's where it is looser than the output's own.
    """
    dtype = original.dtype
    comparison = OutputComparison(name, str(dtype), original.shape, 0.0, 0.0, RELATIVE_TOLERANCE.get(dtype))
    looser = RELATIVE_TOLERANCE.get(arithmetic, 0.0)
    if comparison.tolerance is not None and looser > comparison.tolerance:
        comparison.tolerance, comparison.arithmetic = looser, str(arithmetic)
    if fused.dtype != dtype:
        comparison.problem = f"dtype changed: original {dtype}, fused {fused.dtype}"
        return comparison
    if fused.shape != original.shape:
        comparison.problem = f"shape changed: original {list(original.shape)}, fused {list(fused.shape)}"
        return comparison
    if original.size == 0:
        return comparison
    if comparison.tolerance is None:  # integers, bools, strings
        differing = int(np.count_nonzero(original != fused))
        if differing:
            comparison.problem = f"{differing} of {original.size} elements differ (compared exactly)"
        return comparison
    reference = original.astype(np.float64)
    candidate = fused.astype(np.float64)
    finite = np.isfinite(reference)
    same_special = (np.isnan(reference) == np.isnan(candidate)).all() and (
        reference[~finite & ~np.isnan(reference)] == candidate[~finite & ~np.isnan(reference)]
    ).all()
    if not same_special or not np.isfinite(candidate[finite]).all():
        comparison.problem = "NaN or infinity at different places"
        return comparison
    if not finite.any():
        return comparison
    error = np.abs(candidate[finite] - reference[finite])
    magnitude = np.abs(reference[finite])
    rms = float(np.sqrt(np.mean(magnitude**2)))
    floor = max(rms, float(ml_dtypes.finfo(dtype).smallest_subnormal))
    comparison.max_abs = float(error.max())
    comparison.max_rel = float(np.max(error / (magnitude + floor)))
    return comparison


# --- running ------------------------------------------------------------------------------------------------------


EXTERNAL_DATA_FOLDER = "session.model_external_initializers_file_folder_path"
"""onnxruntime's session option: the folder external data is read from for a model given as bytes."""


def _session(model: str | os.PathLike | onnx.ModelProto, optimization: str, threads: int | None,
             external_data_folder: str | None = None):
    options = ort.SessionOptions()
    options.log_severity_level = 3  # errors only: no shape-annotation warnings in the verdict's output
    if external_data_folder is not None:
        options.add_session_config_entry(EXTERNAL_DATA_FOLDER, external_data_folder)
    return runtime.make_session(
        model if isinstance(model, onnx.ModelProto) else str(model),
        optimization=OPTIMIZATION_LEVELS[optimization],
        threads=threads,
        options=options,
    )


def _interface(session: ort.InferenceSession) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    return (
        [(node_arg.name, node_arg.type) for node_arg in session.get_inputs()],
        [(node_arg.name, node_arg.type) for node_arg in session.get_outputs()],
    )


def _model_name(model) -> str:
    return str(model) if not isinstance(model, onnx.ModelProto) else "the model"


def _load(model: str | os.PathLike | onnx.ModelProto) -> ir.Model:
    """The model's graph (external data stays on disk); clear errors for missing, corrupted or invalid files."""
    return ir.serde.deserialize_model(model) if isinstance(model, onnx.ModelProto) else load_model(model)


def verify(
    original: str | os.PathLike | onnx.ModelProto,
    fused: str | os.PathLike | onnx.ModelProto,
    *,
    dims: Mapping[str, int] | None = None,
    inputs: Mapping[str, np.ndarray] | None = None,
    seed: int = DEFAULT_SEED,
    optimization: str = "all",
    threads: int | None = None,
    norms: bool = True,
) -> VerifyResult:
    """Runs ``original`` and ``fused`` on the same deterministic inputs and compares every output; with ``norms``,
    checks each norm op of ``fused`` too (:mod:`ort_rmsnorm.norm_checks`: the result's ``norms``).

    Raises :class:`~ort_rmsnorm.model.read.ModelFileError` for unreadable files, :class:`VerifyInputError` when no
    valid inputs can be made or the original does not run, and :class:`FusedModelError` when the fused model does not
    load or run while the original does.
    """
    register_schemas()
    arithmetic = arithmetic_dtype(_load(original))
    if not isinstance(fused, onnx.ModelProto):
        load_model(fused)  # clear errors for a missing, corrupted or invalid file
    return run_and_compare(original, fused, arithmetic, dims=dims, inputs=inputs, seed=seed,
                           optimization=optimization, threads=threads, norms=norms)


def run_and_compare(
    original: str | os.PathLike | onnx.ModelProto,
    fused: str | os.PathLike | onnx.ModelProto,
    arithmetic: np.dtype | None,
    *,
    dims: Mapping[str, int] | None = None,
    inputs: Mapping[str, np.ndarray] | None = None,
    seed: int = DEFAULT_SEED,
    optimization: str = "all",
    threads: int | None = None,
    norms: bool = True,
) -> VerifyResult:
    """:func:`verify` once both models were read (and found valid): ``arithmetic`` is the original's
    :func:`arithmetic_dtype`."""
    try:
        original_session = _session(original, optimization, threads)
    except _ORT_ERRORS as error:
        from ._library import forced_cpu_isa_problem

        problem = forced_cpu_isa_problem()  # the library refused its forced kernel set: no fault of the model
        if problem is not None:
            raise VerifyInputError(problem) from None
        raise VerifyInputError(f"{_model_name(original)}: onnxruntime cannot load it: {one_line(error)}") from None
    try:
        fused_session = _session(fused, optimization, threads)
    except _ORT_ERRORS as error:
        raise FusedModelError(f"{_model_name(fused)}: onnxruntime cannot load it: {one_line(error)}") from None
    if _interface(original_session) != _interface(fused_session):
        raise FusedModelError(
            f"the fused model's inputs/outputs {_interface(fused_session)} differ from the original's "
            f"{_interface(original_session)}"
        )
    feeds = make_inputs(original_session.get_inputs(), dims=dims, given=inputs, seed=seed)
    try:
        expected = runtime.run(original_session, feeds)
    except _ORT_ERRORS as error:
        raise VerifyInputError(
            f"{_model_name(original)}: onnxruntime failed on the generated inputs ({_feeds_text(feeds)}): "
            f"{one_line(error)}. Set symbolic dims with --dim NAME=SIZE or give arrays with --input NAME=FILE.npy"
        ) from None
    try:
        actual = runtime.run(fused_session, feeds)
    except _ORT_ERRORS as error:
        raise FusedModelError(
            f"{_model_name(fused)}: onnxruntime failed where the original ran ({_feeds_text(feeds)}): "
            f"{one_line(error)}"
        ) from None
    names = [node_arg.name for node_arg in original_session.get_outputs()]
    del original_session, fused_session
    return VerifyResult(
        inputs={name: (str(array.dtype), array.shape) for name, array in feeds.items()},
        outputs=[compare(name, want, got, arithmetic) for name, want, got in zip(names, expected, actual)],
        norms=_check_norms(original, fused, feeds, optimization, threads) if norms else None,
    )


def _check_norms(original, fused, feeds: Mapping[str, np.ndarray], optimization: str,
                 threads: int | None) -> norm_checks.NormReport:
    """Each norm of ``fused`` against its definition and the original's value there: both models run once more
    with the norms' inputs and outputs as extra outputs (which may keep onnxruntime from fusing across them).

    A model file is read without its external data, which the session reads from the file's folder
    (:data:`EXTERNAL_DATA_FOLDER`); where onnxruntime needs it in the model (a shape constant stored outside), the
    data is read in."""
    models, folders = [], []
    try:
        for model in (original, fused):
            if isinstance(model, onnx.ModelProto):
                models.append(model)
                folders.append(None)
            else:
                models.append(onnx.load(str(model), load_external_data=False))
                # The folder the file is named in, not the one a link leads to: a Hugging Face snapshot links
                # model.onnx into blobs/, while the data file's name is relative to the snapshot's folder.
                folders.append(os.path.dirname(os.path.abspath(model)))
    except (OSError, ValueError, RuntimeError) as error:  # files checked before: memory, over 2 GiB
        return norm_checks.NormReport([], [], problem=f"cannot read the models: {one_line(error)}")

    def run(model: onnx.ModelProto, names: list[str], which: str) -> list[np.ndarray]:
        folder = folders[0 if which == "original" else 1]
        try:
            session = _session(model, optimization, threads, external_data_folder=folder)
        except _ORT_ERRORS:
            if folder is None:
                raise
            onnx.load_external_data_for_model(model, folder)
            session = _session(model, optimization, threads)
        return runtime.run(session, feeds, names)

    try:
        return norm_checks.run_checks(models[1], models[0], (folders[0] or "", folders[1] or ""), feeds, run)
    except (*_ORT_ERRORS, ValueError, OSError, onnx.checker.ValidationError) as error:
        return norm_checks.NormReport([], [], problem=f"the models with their norms' values as outputs do not run: "
                                                      f"{one_line(error)}")


def _feeds_text(feeds: Mapping[str, np.ndarray]) -> str:
    return ", ".join(f"{name}: {array.dtype} {list(array.shape)}" for name, array in feeds.items())
