"""Verifying a fused folder against the original: each model :func:`~ort_rmsnorm.folders.fuse.fuse_folder` fuses,
run against the model of the same name (:mod:`ort_rmsnorm.verify`), and the library a genai folder's fused models
need. Each model file is read once."""

from __future__ import annotations

import dataclasses
import json
import os
import re
from pathlib import Path
from typing import Callable, Mapping

import numpy as np
import onnx_ir as ir

from .. import verify
from ..contract import OP_DOMAIN
from ..feeds import DEFAULT_SEED
from ..model_io import load_model
from .fuse import uses_domain
from .layout import (
    DECODER_KEY,
    GENAI_CONFIG,
    KIND_GENAI,
    LIBRARY_KEY,
    SESSION_OPTIONS,
    Component,
    FolderError,
    Layout,
    read_layout,
    section,
)


@dataclasses.dataclass
class ModelVerification:
    path: str
    result: verify.VerifyResult | None = None
    problem: str | None = None
    """Why the pair was not compared or failed beyond the numbers (a missing or unloadable fused model)."""

    @property
    def ok(self) -> bool:
        return self.problem is None and self.result is not None and self.result.ok


@dataclasses.dataclass
class FolderVerification:
    models: list[ModelVerification]
    problems: list[str] = dataclasses.field(default_factory=list)
    """Problems of the folder itself: a fused model using this package's ops without the library it needs."""

    @property
    def ok(self) -> bool:
        return not self.problems and all(model.ok for model in self.models)

    def describe(self) -> str:
        lines = []
        for model in self.models:
            lines.append(f"{model.path}:")
            if model.result is not None:
                lines += [f"  {line}" for line in model.result.describe().splitlines()]
            if model.problem is not None:
                lines.append(f"  verify: MISMATCH: {model.problem}")
        lines += [f"folder: MISMATCH: {problem}" for problem in self.problems]
        matched = sum(model.ok for model in self.models)
        lines.append(f"verify: {'all' if matched == len(self.models) else matched} of {len(self.models)} models match"
                     + ("" if not self.problems else f"; {len(self.problems)} folder problems"))
        return "\n".join(lines)


def _symbolic_dims(model: ir.Model) -> dict[str, list[str]]:
    """Input name -> its dims' names (empty strings for static or unnamed dims)."""
    return {value.name: [dim.value if isinstance(dim, ir.SymbolicDim) and dim.value else ""
                         for dim in (value.shape or [])] for value in model.graph.inputs}


def _genai_default_dims(layout: Layout, component: Component, inputs: Mapping[str, list[str]]) -> dict[str, int]:
    """Sizes a genai decoder needs that verify's generic defaults cannot guess, from the config: the past key/value
    inputs' head dim (``head_size``) and, for the layers of a sliding window, their past length (``window_size``:
    the cache of such a layer is a ring of that many positions, and onnxruntime refuses a shorter one)."""
    if layout.config is None or DECODER_KEY not in component.config_keys:
        return {}
    decoder = layout.config["model"]["decoder"]
    names = decoder.get("inputs", {})
    patterns = [re.escape(names.get(key, default)).replace("%d", r"(\d+)")
                for key, default in (("past_key_names", "past_key_values.%d.key"),
                                     ("past_value_names", "past_key_values.%d.value"))]
    window = decoder.get("sliding_window") or {}
    sliding = window.get("layers")
    dims = {}
    for name, shape in inputs.items():
        match = next(filter(None, (re.fullmatch(pattern, name) for pattern in patterns)), None)
        if match is None or len(shape) != 4:
            continue
        if shape[3] and isinstance(decoder.get("head_size"), int):
            dims[shape[3]] = decoder["head_size"]
        if (shape[2] and isinstance(window.get("window_size"), int)
                and (sliding is None or int(match.group(1)) in sliding)):
            dims[shape[2]] = window["window_size"]
    return dims


def verify_folder(
    original: str | os.PathLike,
    fused: str | os.PathLike,
    *,
    dims: Mapping[str, int] | None = None,
    inputs: Mapping[str, np.ndarray] | None = None,
    seed: int = DEFAULT_SEED,
    optimization: str = "all",
    progress: Callable[[str], None] | None = None,
) -> FolderVerification:
    """Runs each model :func:`fuse_folder` fuses in ``original`` against the model of the same name in ``fused``
    (:func:`ort_rmsnorm.verify.verify`), and checks that a genai folder's models that use this package's ops can
    load its library.

    ``dims`` and ``inputs`` apply to the models that have such dims and inputs; a name no model has is a
    :class:`~ort_rmsnorm.verify.VerifyInputError`. In a genai folder, the decoder's past key/value head dim defaults
    to the config's ``head_size``.
    """
    say = progress or (lambda _line: None)
    layout = read_layout(original)
    fused = Path(fused)
    if not fused.is_dir():
        raise FolderError(f"{fused}: {'not a directory' if fused.exists() else 'no such directory'}")
    dims, inputs = dict(dims or {}), dict(inputs or {})
    shapes, arithmetic = {}, {}
    for component in layout.components:
        model = load_model(layout.root / component.path)
        shapes[component.path] = _symbolic_dims(model)
        arithmetic[component.path] = verify.arithmetic_dtype(model)
    dim_names = {name for model in shapes.values() for dims_of_input in model.values() for name in dims_of_input}
    input_names = {name for model in shapes.values() for name in model}
    for option, unknown, what in (("--dim", set(dims) - dim_names, "a dim"),
                                  ("--input", set(inputs) - input_names, "an input")):
        if unknown:
            raise verify.VerifyInputError(f"{option} {', '.join(sorted(unknown))}: no model of {layout.root} has such "
                                          f"{what}")
    results = []
    using_library = []
    for index, component in enumerate(layout.components, 1):
        say(f"[{index}/{len(layout.components)}] verifying {component.path}")
        entry = ModelVerification(component.path)
        results.append(entry)
        model_inputs = shapes[component.path]
        names = {name for shape in model_inputs.values() for name in shape if name}
        model_dims = {**_genai_default_dims(layout, component, model_inputs),
                      **{name: size for name, size in dims.items() if name in names}}
        given = {name: array for name, array in inputs.items() if name in model_inputs}
        fused_path = fused / component.path
        if not fused_path.is_file():
            entry.problem = f"{fused_path}: no such file in the fused folder"
            continue
        if uses_domain(load_model(fused_path), OP_DOMAIN):  # clear errors for a corrupted or invalid file
            using_library.append(component)
        try:
            entry.result = verify.run_and_compare(layout.root / component.path, fused_path, arithmetic[component.path],
                                                  dims=model_dims, inputs=given, seed=seed, optimization=optimization)
        except verify.FusedModelError as error:
            entry.problem = str(error)
    problems = _library_problems(layout, fused, using_library) if layout.kind == KIND_GENAI else []
    return FolderVerification(results, problems)


def _library_problems(layout: Layout, fused: Path, using_library: list[Component]) -> list[str]:
    """A fused genai folder whose models use this package's ops (``using_library``) must name a library inside it
    where their sessions take their options from."""
    config_path = fused / GENAI_CONFIG
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        return [f"{config_path}: cannot read it: {error}"]
    fused_layout = Layout(KIND_GENAI, fused, layout.components, config)
    problems = []
    for component in using_library:
        for key in component.config_keys:
            try:
                options_key = fused_layout.session_options_key(key)
                library = section(config, options_key).get(LIBRARY_KEY)
            except (KeyError, IndexError, TypeError):
                library, options_key = None, f"{key}.{SESSION_OPTIONS}"
            if not isinstance(library, str):
                problems.append(f"{component.path} uses {OP_DOMAIN} ops, but {options_key} in {config_path} names no "
                                f"{LIBRARY_KEY}: onnxruntime-genai could not load the model")
            elif not (fused / library).is_file():
                problems.append(f"{options_key}.{LIBRARY_KEY} is {library!r}, which is not a file in {fused}: "
                                "onnxruntime-genai loads a library only from inside the model folder, the current "
                                "directory or an execution provider's folder")
    return problems
