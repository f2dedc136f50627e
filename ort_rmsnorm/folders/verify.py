"""Verifying a fused folder against the original: each model :func:`~ort_rmsnorm.folders.fuse.fuse_folder` fuses,
run against the model of the same name (:mod:`ort_rmsnorm.verify`), and the library a genai folder's fused models
need. Each model file is read once."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path, PurePosixPath
from typing import Callable, Mapping

import numpy as np
import onnx_ir as ir

from .. import verify
from ..contract import OP_DOMAIN
from ..feeds import DEFAULT_SEED
from ..model.read import load_model
from ..schemas import register_schemas
from . import genai_config
from .contents import Contents, read_contents
from .fuse import uses_domain
from .genai_config import path_text
from .layout import (
    DECODER_PATH,
    GENAI_CONFIG,
    KIND_GENAI,
    LIBRARY_KEY,
    SESSION_OPTIONS,
    Component,
    FolderError,
    Layout,
    read_config,
    read_layout,
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

    def describe(self, verbose: bool = False) -> str:
        """Each model's comparison (``verbose``: every norm's verdict, not only those that differ) and the
        verdict line."""
        lines = []
        for model in self.models:
            lines.append(f"{model.path}:")
            if model.result is not None:
                lines += [f"  {line}" for line in model.result.describe(verbose).splitlines()]
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


DEFAULT_NAME_TEMPLATES = (("past_key_names", "past_key_values.%d.key"),
                          ("past_value_names", "past_key_values.%d.value"))
"""The config keys naming the decoder's past key/value inputs, and onnxruntime-genai's defaults (``%d``: the layer)."""
MAX_CONFIG_SIZE = 2**31 - 1
"""onnxruntime-genai reads ``head_size`` and ``sliding_window.window_size`` into 32-bit ints: a config size beyond is
no size genai runs with, and verify makes no inputs of it."""
_LAYER_DIGITS = 18
"""A layer number of more digits is no layer a config can list (an int64): compared as such, never converted."""


def match_template(template: str, name: str) -> str | None:
    """Whether ``name`` is ``template`` with each ``%d`` standing for one or more ASCII digits (as
    ``re.fullmatch(re.escape(template).replace("%d", r"([0-9]+)"))``); returns the digits of the first
    ``%d`` as a greedy regular expression takes them (the most that still lets the rest match), ``""`` for a
    template without ``%d``, None for no match.

    Linear in ``len(name)`` per piece of the template: one pass from the end marks, for each piece, the positions
    from which the rest of the template matches, so no choice is tried twice (a backtracking regular expression takes
    time exponential in the number of adjacent ``%d`` when the name has many digits). onnxruntime-genai writes the
    names with ``%d``: ASCII digits only."""
    literals = template.split("%d")
    holes = len(literals) - 1
    size = len(name)
    # rest[p]: the pieces after the current one match name[p:]; built from the last piece back to the second.
    rest = [False] * (size + 1)
    last = literals[-1]
    if holes == 0:
        return "" if name == last else None
    start_last = size - len(last)
    if start_last >= 0 and name.endswith(last):
        rest[start_last] = True
    for index in range(holes - 1, 0, -1):  # the %d before literals[index + 1], then literals[index]
        rest = _digits_then(name, rest)
        literal = literals[index]
        before = [False] * (size + 1)
        for position in range(size - len(literal) + 1):
            if rest[position + len(literal)] and name.startswith(literal, position):
                before[position] = True
        rest = before
    first = literals[0]
    if not name.startswith(first):
        return None
    begin = len(first)
    end = begin
    found = None
    while end < size and "0" <= name[end] <= "9":
        end += 1
        if rest[end]:
            found = end
    return name[begin:found] if found is not None else None


def _digits_then(name: str, after: list[bool]) -> list[bool]:
    """Positions from which one or more ASCII digits followed by a position of ``after`` match."""
    size = len(name)
    result = [False] * (size + 1)
    reachable = False  # a run of digits from position + 1 reaches a position of ``after``
    for position in range(size - 1, -1, -1):
        if "0" <= name[position] <= "9":
            reachable = after[position + 1] or reachable
        else:
            reachable = False
        result[position] = reachable
    return result


def _layer(digits: str) -> int | None:
    significant = digits.lstrip("0") or "0"
    return int(significant) if len(significant) <= _LAYER_DIGITS else None


@dataclasses.dataclass(frozen=True)
class CacheSizes:
    """What a genai decoder's config says of its past key/value inputs, checked: the name templates, ``head_size``
    and the sliding window (its size, and the layers it applies to: all when None)."""

    templates: tuple[str, ...]
    head_size: int | None = None
    window_size: int | None = None
    sliding_layers: frozenset[int] | None = None


def _size_in_config(layout: Layout, where: tuple, value) -> int | None:
    """An int size of the config (``where``), checked to be one verify can make inputs of; None when absent or not
    an int (the config's own business, onnxruntime-genai's to refuse)."""
    if not isinstance(value, int) or isinstance(value, bool):
        return None
    if not 1 <= value <= MAX_CONFIG_SIZE:
        shown = value if len(str(abs(value))) <= 30 else f"an integer of {len(str(abs(value)))} digits"
        raise verify.VerifyInputError(
            f"{layout.root / GENAI_CONFIG}: {path_text(where)} is {shown}, where verify makes the past key/value "
            f"inputs of that size: it must be from 1 to {MAX_CONFIG_SIZE}")
    return value


def cache_sizes(layout: Layout) -> CacheSizes | None:
    """The decoder's past key/value sizes from a genai folder's config (None for another folder), every value
    checked before any input is made of it: :class:`~ort_rmsnorm.verify.VerifyInputError` naming the key."""
    if layout.config is None:
        return None
    decoder = genai_config.get(layout.config, DECODER_PATH, None)
    if not isinstance(decoder, dict):
        return None
    names = decoder.get("inputs")
    names = names if isinstance(names, dict) else {}
    templates = tuple(names[key] if isinstance(names.get(key), str) else default
                      for key, default in DEFAULT_NAME_TEMPLATES)
    head_size = _size_in_config(layout, (*DECODER_PATH, "head_size"), decoder.get("head_size"))
    window = decoder.get("sliding_window")
    window = window if isinstance(window, dict) else {}
    window_size = _size_in_config(layout, (*DECODER_PATH, "sliding_window", "window_size"), window.get("window_size"))
    layers = window.get("layers")
    sliding = (frozenset(layer for layer in layers if isinstance(layer, int) and not isinstance(layer, bool))
               if isinstance(layers, list) else None)
    return CacheSizes(templates, head_size, window_size, sliding)


def _genai_default_dims(sizes: CacheSizes | None, component: Component,
                        inputs: Mapping[str, list[str]]) -> dict[str, int]:
    """Sizes a genai decoder needs that verify's generic defaults cannot guess, from the config: the past key/value
    inputs' head dim (``head_size``) and, for the layers of a sliding window, their past length (``window_size``:
    the cache of such a layer is a ring of that many positions, and onnxruntime refuses a shorter one)."""
    if sizes is None or DECODER_PATH not in component.config_paths:
        return {}
    dims = {}
    for name, shape in inputs.items():
        if len(shape) != 4:
            continue
        digits = next((found for found in (match_template(template, name) for template in sizes.templates)
                       if found is not None), None)
        if digits is None:
            continue
        if shape[3] and sizes.head_size is not None:
            dims[shape[3]] = sizes.head_size
        layer = _layer(digits) if digits else None  # a name without %d: no layer number
        if (shape[2] and sizes.window_size is not None
                and (sizes.sliding_layers is None or layer in sizes.sliding_layers)):
            dims[shape[2]] = sizes.window_size
    return dims


def check_verification_config(source: str | os.PathLike, *, follow_symlinks: bool = False) -> None:
    """What :func:`verify_folder` reads of the folder ``source``'s config to make inputs, checked on its own (before
    ``fuse --verify`` writes anything): :class:`~ort_rmsnorm.verify.VerifyInputError` for a size it cannot use."""
    cache_sizes(read_layout(source, follow_symlinks=follow_symlinks))


def verify_folder(
    original: str | os.PathLike,
    fused: str | os.PathLike,
    *,
    dims: Mapping[str, int] | None = None,
    inputs: Mapping[str, np.ndarray] | None = None,
    seed: int = DEFAULT_SEED,
    optimization: str = "all",
    follow_symlinks: bool = False,
    progress: Callable[[str], None] | None = None,
    norms: bool = True,
) -> FolderVerification:
    """Runs each model :func:`fuse_folder` fuses in ``original`` against the model of the same name in ``fused``
    (:func:`ort_rmsnorm.verify.verify`), and checks that a genai folder's models that use this package's ops can
    load its library.

    ``dims`` and ``inputs`` apply to the models that have such dims and inputs; a name no model has is a
    :class:`~ort_rmsnorm.verify.VerifyInputError`. In a genai folder, the decoder's past key/value head dim defaults
    to the config's ``head_size``. Both folders are read under the trust boundary of
    :func:`~ort_rmsnorm.folders.contents.read_contents` (``follow_symlinks`` as there). ``norms``: check each norm of
    each fused model too (:func:`ort_rmsnorm.verify.verify`).
    """
    register_schemas()
    say = progress or (lambda _line: None)
    layout = read_layout(original, follow_symlinks=follow_symlinks)
    fused = Path(fused)
    fused_contents = read_contents(fused, follow_symlinks=follow_symlinks)
    dims, inputs = dict(dims or {}), dict(inputs or {})
    sizes = cache_sizes(layout) if layout.kind == KIND_GENAI else None
    shapes, arithmetic = {}, {}
    for component in layout.components:
        model = _load_checked(layout.contents, component.path)
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
        model_dims = {**_genai_default_dims(sizes, component, model_inputs),
                      **{name: size for name, size in dims.items() if name in names}}
        given = {name: array for name, array in inputs.items() if name in model_inputs}
        fused_path = fused / component.path
        if fused_contents.entry(component.path) is None:
            entry.problem = f"{fused_path}: no such file in the fused folder"
            continue
        if uses_domain(_load_checked(fused_contents, component.path), OP_DOMAIN):  # clear errors for a bad file
            using_library.append(component)
        try:
            entry.result = verify.run_and_compare(layout.root / component.path, fused_path, arithmetic[component.path],
                                                  dims=model_dims, inputs=given, seed=seed, optimization=optimization,
                                                  norms=norms)
        except verify.FusedModelError as error:
            entry.problem = str(error)
    problems = _library_problems(layout, fused_contents, using_library) if layout.kind == KIND_GENAI else []
    return FolderVerification(results, problems)


def _load_checked(contents: Contents, relative: str) -> ir.Model:
    """A model of the folder, read by its path (onnx reads by name), checked to be the file the walk found."""
    contents.check_unchanged(relative)
    model = load_model(contents.path(relative), linked=contents.linked_file)
    contents.check_unchanged(relative)
    return model


def _library_problems(layout: Layout, fused: Contents, using_library: list[Component]) -> list[str]:
    """A fused genai folder whose models use this package's ops (``using_library``) must name a library inside it
    where their sessions take their options from."""
    config_path = fused.path(GENAI_CONFIG)
    if fused.entry(GENAI_CONFIG) is None:
        return [f"{config_path}: no such file in the fused folder"]
    try:
        config, _text = read_config(fused)
    except FolderError as error:
        return [str(error)]
    fused_layout = Layout(KIND_GENAI, fused.root, layout.components, config, fused)
    problems = []
    for component in using_library:
        for config_path_of_model in component.config_paths:
            try:
                options_path = fused_layout.session_options_path(config_path_of_model)
                library = genai_config.get(config, options_path, {}).get(LIBRARY_KEY)
            except FolderError:
                library, options_path = None, (*config_path_of_model, SESSION_OPTIONS)
            options_key = path_text(options_path)
            if not isinstance(library, str):
                problems.append(f"{component.path} uses {OP_DOMAIN} ops, but {options_key} in {config_path} names no "
                                f"{LIBRARY_KEY}: onnxruntime-genai could not load the model")
            elif fused.entry(str(PurePosixPath(library))) is None:
                problems.append(f"{options_key}.{LIBRARY_KEY} is {library!r}, which is not a file in {fused.root}: "
                                "onnxruntime-genai loads a library only from inside the model folder, the current "
                                "directory or an execution provider's folder")
    return problems
