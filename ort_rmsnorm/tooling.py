"""Running onnxruntime's own tools on models that use our ops.

Tools such as ``quantize_static``, ``onnxruntime.transformers.optimizer.optimize_model``, the quantization
pre-processing or the mobile usability checker open their own ``InferenceSession`` without our library, and
onnxruntime's symbolic shape inference stops at an op it does not know. :func:`everywhere` gives them both::

    with ort_rmsnorm.everywhere():
        quantize_static("fused.onnx", "fused.qdq.onnx", reader)

Inside it (while any thread is inside one), every ``onnxruntime.InferenceSession`` the process creates has the library
registered in its session options (given ones are registered in place, idempotently; none given: new ones), and every
``SymbolicShapeInference`` has our handlers. Leaving the last one puts ``InferenceSession.__init__`` and
``SymbolicShapeInference.__init__`` back as they were. It nests and may be entered from several threads at once.
:func:`infer_symbolic_shapes` is symbolic shape inference with our handlers, and :func:`add_symbolic_handlers` adds
them to an instance of your own. On the command line, ``ort-rmsnorm tool MODULE ARGS`` runs ``python -m MODULE
ARGS`` inside :func:`everywhere`.

docs/deploy.md, "Tools after fusing", lists the tools and what each needs.
"""

from __future__ import annotations

import contextlib
import functools
import runpy
import sys
import threading
from typing import Callable, Iterator, Sequence

import onnxruntime as ort

from ._library import register
from .model.types import symbolic_leftovers_removed
from .contract import OP_DOMAIN, RMSNORM, SKIP_RMSNORM
from .schemas import register_schemas

__all__ = ["add_symbolic_handlers", "everywhere", "infer_symbolic_shapes", "run_tool"]

_lock = threading.RLock()


class _Patch:
    """Replacements of class attributes, installed while at least one holder holds them.

    The replacements check :attr:`active`, so one left in place (someone replaced the attribute again after us, and
    the original is not ours to put back over theirs) does nothing once the last holder is gone."""

    def __init__(self, targets: Callable[[], Sequence[tuple[type, str, Callable]]]):
        self._targets = targets  # [(class, attribute, make_replacement(original))], resolved on first install
        self._holders = 0
        self._saved: list[tuple[type, str, object, object]] = []

    @property
    def active(self) -> bool:
        return self._holders > 0

    def acquire(self) -> None:
        with _lock:
            if self._holders == 0:
                for owner, name, make in self._targets():
                    original = owner.__dict__.get(name, _MISSING)
                    replacement = make(getattr(owner, name))
                    setattr(owner, name, replacement)
                    self._saved.append((owner, name, original, replacement))
            self._holders += 1

    def release(self) -> None:
        with _lock:
            self._holders -= 1
            if self._holders:
                return
            for owner, name, original, replacement in reversed(self._saved):
                if owner.__dict__.get(name) is not replacement:
                    continue  # replaced again by someone else: theirs stays; ours is inert now
                if original is _MISSING:
                    delattr(owner, name)
                else:
                    setattr(owner, name, original)
            self._saved.clear()


_MISSING = object()


# ---- sessions --------------------------------------------------------------------------------------------------


def _session_targets():
    return [(ort.InferenceSession, "__init__", _registering_init)]


def _registering_init(original: Callable) -> Callable:
    @functools.wraps(original)
    def __init__(self, path_or_bytes, sess_options=None, *args, **kwargs):
        if _SESSIONS.active:
            sess_options = register(sess_options if sess_options is not None else ort.SessionOptions())
        original(self, path_or_bytes, sess_options, *args, **kwargs)

    return __init__


_SESSIONS = _Patch(_session_targets)


# ---- symbolic shape inference ----------------------------------------------------------------------------------


def _symbolic_class():
    """onnxruntime's SymbolicShapeInference, or None where it cannot be imported (it needs sympy)."""
    try:
        from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference
    except ImportError:
        return None
    return SymbolicShapeInference


def _symbolic_targets():
    symbolic = _symbolic_class()
    return [] if symbolic is None else [(symbolic, "__init__", _handlers_init)]


def _handlers_init(original: Callable) -> Callable:
    @functools.wraps(original)
    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        if _SYMBOLIC.active:
            add_symbolic_handlers(self)

    return __init__


_SYMBOLIC = _Patch(_symbolic_targets)


def add_symbolic_handlers(inference) -> None:
    """Adds our ops to a ``SymbolicShapeInference`` instance's dispatcher: Y (and ``sum``) get X's type and symbolic
    shape. Idempotent. A node of the same op type in another domain goes to the handler that was there before, if
    any."""
    for op_type in (RMSNORM, SKIP_RMSNORM):
        previous = inference.dispatcher_.get(op_type)
        if getattr(previous, "_ort_rmsnorm", False):
            continue
        handler = functools.partial(_infer_norm, inference, previous)
        handler._ort_rmsnorm = True
        inference.dispatcher_[op_type] = handler


def _infer_norm(inference, previous: Callable | None, node) -> None:
    if node.domain != OP_DOMAIN:
        if previous is not None:
            previous(node)
        return
    inference._propagate_shape_and_type(node, 0, 0)
    if node.op_type == SKIP_RMSNORM and len(node.output) > 1 and node.output[1]:
        inference._propagate_shape_and_type(node, 0, 1)


def infer_symbolic_shapes(model, int_max: int = 2**31 - 1, auto_merge: bool = False,
                          guess_output_rank: bool = False, verbose: int = 0):
    """``onnxruntime.tools.symbolic_shape_infer.SymbolicShapeInference.infer_shapes`` with our handlers: the same
    arguments and result (a new ``onnx.ModelProto`` with every value's type and shape)."""
    symbolic = _symbolic_class()
    if symbolic is None:
        raise ImportError("onnxruntime's symbolic shape inference cannot be imported (it needs sympy: "
                          "pip install sympy)")
    register_schemas()  # its per-node fallback is onnx's inference
    _SYMBOLIC.acquire()
    try:
        with symbolic_leftovers_removed():
            return symbolic.infer_shapes(model, int_max=int_max, auto_merge=auto_merge,
                                         guess_output_rank=guess_output_rank, verbose=verbose)
    finally:
        _SYMBOLIC.release()


# ---- everywhere ------------------------------------------------------------------------------------------------


@contextlib.contextmanager
def everywhere() -> Iterator[None]:
    """Within it, every ``onnxruntime.InferenceSession`` the process creates has the library, and onnxruntime's
    symbolic shape inference knows our ops (see the module's docstring). Everything is put back when the last
    ``everywhere()`` of any thread exits; nestable, thread-safe, usable as a decorator."""
    register_schemas()
    _SESSIONS.acquire()
    try:
        _SYMBOLIC.acquire()
        try:
            yield
        finally:
            _SYMBOLIC.release()
    finally:
        _SESSIONS.release()


def run_tool(module: str, args: Sequence[str]) -> int:
    """Runs ``python -m module args`` in this process inside :func:`everywhere` and returns its exit status."""
    from importlib.util import find_spec

    try:
        found = find_spec(module) is not None
    except ModuleNotFoundError as error:  # a parent package missing; another missing import is the tool's to report
        if error.name is None or not (module + ".").startswith(error.name + "."):
            raise
        found = False
    except ValueError:  # not a module name (empty, relative)
        found = False
    if not found:
        raise ModuleNotFoundError(f"no module named {module!r}", name=module)
    saved_argv = sys.argv[:]
    sys.argv = [module, *args]
    try:
        with everywhere():
            runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as exit_:
        code = exit_.code
        if code is None or isinstance(code, int):
            return code or 0
        print(code, file=sys.stderr)
        return 1
    finally:
        sys.argv = saved_argv
    return 0
