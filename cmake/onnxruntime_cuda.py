"""Which onnxruntime the Python environment running this has, for CMake's ORT_RMSNORM_CUDA=AUTO
(cmake/cuda_choice.cmake). Prints one line:

    cuda <folder>    its onnxruntime package has the CUDA execution provider (onnxruntime-gpu)
    cpu <folder>     it has none (onnxruntime)
    none             there is no onnxruntime package

Nothing is imported: the provider's library is looked for next to onnxruntime's bindings. CMake runs this with
``python -I``, which ignores PYTHONPATH: inside pip's isolated build environment that is the environment the package
is being installed into, not the build environment.
"""

import importlib.util
from pathlib import Path

spec = importlib.util.find_spec("onnxruntime")
if spec is None or not spec.submodule_search_locations:
    print("none")
else:
    folder = Path(next(iter(spec.submodule_search_locations)))
    # libonnxruntime_providers_cuda.so (Linux), onnxruntime_providers_cuda.dll (Windows)
    provider = any((folder / "capi").glob("*onnxruntime_providers_cuda.*"))
    print("cuda" if provider else "cpu", folder)
