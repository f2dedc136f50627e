"""A pytest plugin that records every run of the operator tests: the model, the feeds and the outputs, as files that
tests/platforms/replay_cases.cpp runs again through onnxruntime's C API, with another build of the library or on
another system, and compares bit for bit.

    ORT_RMSNORM_RECORD_DIR=DIR pytest -p record_cases tests/ops/test_numerics.py ...   (tests/platforms on sys.path)

DIR/cases.txt lists the cases, one block each:
    case <index> <model file> <intra-op threads, 0 = default> <test id>
    in <name> <ONNX element type> <rank> <dims...> <data file>
    out <name> <ONNX element type> <rank> <dims...> <data file>
Data files hold the tensors' bytes in C order; models are stored once each, by content. Runs whose feeds and outputs
hold more than ORT_RMSNORM_RECORD_MAX_BYTES (default 24 MiB: the streaming-store sizes, not the largest) are counted
and left out."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np
import onnx
import pytest

_ELEMENT_TYPES = {"float32": onnx.TensorProto.FLOAT, "float16": onnx.TensorProto.FLOAT16,
                  "bfloat16": onnx.TensorProto.BFLOAT16}


class _Recorder:
    def __init__(self, directory: Path):
        self.directory = directory
        (directory / "data").mkdir(parents=True, exist_ok=True)
        (directory / "models").mkdir(exist_ok=True)
        self.listing = open(directory / "cases.txt", "w")
        self.count = 0
        self.skipped = 0
        self.test_id = "unknown"
        self.max_bytes = int(os.environ.get("ORT_RMSNORM_RECORD_MAX_BYTES", 24 << 20))

    def model_file(self, model) -> str:
        if isinstance(model, onnx.ModelProto):
            model = model.SerializeToString()
        elif isinstance(model, (str, os.PathLike)):
            model = Path(model).read_bytes()
        name = f"models/{hashlib.sha256(model).hexdigest()[:20]}.onnx"
        path = self.directory / name
        if not path.exists():
            path.write_bytes(model)
        return name

    def tensor_line(self, kind: str, name: str, array: np.ndarray) -> str:
        element_type = _ELEMENT_TYPES[array.dtype.name]
        data = f"data/{self.count}.{kind}.{name}.bin"
        (self.directory / data).write_bytes(np.ascontiguousarray(array).tobytes())
        return " ".join([kind, name, str(element_type), str(array.ndim), *map(str, array.shape), data])

    def record(self, session, feeds, output_names, outputs) -> None:
        model_file, threads = getattr(session, "_recorded_model", (None, 0))
        names = list(output_names) if output_names is not None else [o.name for o in session.get_outputs()]
        tensors = [("in", name, np.asarray(value)) for name, value in feeds.items()]
        tensors += [("out", name, value) for name, value in zip(names, outputs)]
        if (model_file is None or sum(array.nbytes for _, _, array in tensors) > self.max_bytes
                or any(array.dtype.name not in _ELEMENT_TYPES or " " in name for _, name, array in tensors)):
            self.skipped += 1  # not a session made by make_session, too large, or a tensor of another type
            return
        lines = [self.tensor_line(kind, name, array) for kind, name, array in tensors]
        self.listing.write(f"case {self.count} {model_file} {threads} {self.test_id.replace(' ', '_')}\n")
        self.listing.write("\n".join(lines) + "\n")
        self.count += 1


def pytest_configure(config):
    directory = os.environ.get("ORT_RMSNORM_RECORD_DIR")
    if not directory:
        raise pytest.UsageError("record_cases: set ORT_RMSNORM_RECORD_DIR to the folder the cases go to")
    recorder = _Recorder(Path(directory))
    config._ort_rmsnorm_recorder = recorder

    # Patched before the test modules are imported, so that their `from ort_rmsnorm.runtime import ...` binds these.
    from ort_rmsnorm import runtime
    make_session, run = runtime.make_session, runtime.run

    def recording_make_session(model, *args, **kwargs):
        session = make_session(model, *args, **kwargs)
        if kwargs.get("custom_ops", True):
            session._recorded_model = (recorder.model_file(model), int(kwargs.get("threads") or 0))
        return session

    def recording_run(session, feeds, output_names=None):
        outputs = run(session, feeds, output_names)
        recorder.record(session, feeds, output_names, outputs)
        return outputs

    runtime.make_session, runtime.run = recording_make_session, recording_run


def pytest_runtest_setup(item):
    item.config._ort_rmsnorm_recorder.test_id = item.nodeid


def pytest_unconfigure(config):
    recorder = getattr(config, "_ort_rmsnorm_recorder", None)
    if recorder is not None:
        recorder.listing.close()
        print(f"record_cases: {recorder.count} runs recorded in {recorder.directory}"
              f" ({recorder.skipped} left out: larger than {recorder.max_bytes} bytes or not recordable)")
