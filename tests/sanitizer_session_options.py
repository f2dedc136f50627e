"""pytest plugin for runs against the AddressSanitizer build of the library (scripts/test-sanitizers loads it with
`-p sanitizer_session_options`): every session that registers our library allocates each tensor with its own
malloc, so AddressSanitizer's redzones surround every input and output the kernels touch. With onnxruntime's
defaults, tensors are carved out of large arena or memory-pattern blocks, where an out-of-bounds write would land in
a neighbouring tensor unnoticed."""

from __future__ import annotations

import onnxruntime as ort

import ort_rmsnorm
import ort_rmsnorm._library
import ort_rmsnorm.runtime

_register = ort_rmsnorm._library.register


def _register_with_malloc_per_tensor(options: ort.SessionOptions) -> ort.SessionOptions:
    options.enable_cpu_mem_arena = False
    options.enable_mem_pattern = False
    return _register(options)


# Every name the function is reachable by (session_options() looks it up in _library; runtime.py and the package
# imported it by name).
ort_rmsnorm._library.register = _register_with_malloc_per_tensor
ort_rmsnorm.runtime.register = _register_with_malloc_per_tensor
ort_rmsnorm.register = _register_with_malloc_per_tensor
