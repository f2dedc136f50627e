"""`ort-rmsnorm fuse` on malformed models made from real ones (``cli/malformed.py``): every case ends in status 0 or 2,
with one error line and no traceback, before or after fusing; the input's bytes stay as they were; the output's
folder holds a complete output (status 0) or nothing (status 2).

    pytest tests/cli/test_malformed.py                                   # 300 cases of seed 0 (CI)
    ORT_RMSNORM_MALFORMED_CASES=5000 ORT_RMSNORM_MALFORMED_SEED=7 pytest tests/cli/test_malformed.py
    ORT_RMSNORM_MALFORMED_REPLAY=7:1234 pytest tests/cli/test_malformed.py -k property   # one case

The command runs in this process (``ort_rmsnorm.cli.main``, what the ``ort-rmsnorm`` entry point calls), so that a
few hundred cases take seconds; an exception escaping it is the traceback a user would see. The probes below it
are the ones found by hand, each a test of its own; a few run as real processes too.
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import io
import os
import traceback
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from cli.malformed import MODEL, make_case, write_seed_models
from ort_rmsnorm.model.read import ModelFileError, external_data_files, load_model
from ort_rmsnorm.cli import main

SEED = int(os.environ.get("ORT_RMSNORM_MALFORMED_SEED", "0"))
CASES = int(os.environ.get("ORT_RMSNORM_MALFORMED_CASES", "300"))
REPLAY = os.environ.get("ORT_RMSNORM_MALFORMED_REPLAY")
ERROR_PREFIX = "ort-rmsnorm fuse: error: "


@pytest.fixture(scope="module")
def seeds(tmp_path_factory):
    return write_seed_models(tmp_path_factory.mktemp("seeds"))


def _digests(folder: Path) -> dict[str, str]:
    """sha256 of every regular file in ``folder`` (FIFOs and directories by kind: reading a FIFO would block)."""
    found = {}
    for path in sorted(folder.rglob("*")):
        if path.is_symlink() or not path.is_file():
            found[str(path)] = "link" if path.is_symlink() else "other"
        else:
            found[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest()
    return found


def fuse_in_process(*args) -> tuple[int | None, str, str]:
    """(status, stderr, traceback or ""): ``ort-rmsnorm fuse`` as the entry point runs it, in this process."""
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
            status = main(["fuse", *map(str, args), "--quiet"])
    except BaseException:  # noqa: BLE001 - anything escaping main is the failure this test looks for
        return None, stderr.getvalue(), traceback.format_exc()
    return status, stderr.getvalue(), ""


def check_one_line_error(status: int | None, stderr: str, escaped: str) -> str | None:
    """What is wrong with how a run ended, or None: status 0, or status 2 with its error on one line, last."""
    if escaped:
        return f"an exception escaped:\n{escaped}"
    if status not in (0, 2):
        return f"exit status {status}"
    if "Traceback" in stderr:
        return f"a traceback on stderr:\n{stderr}"
    if status == 2:
        lines = stderr.strip().splitlines()
        errors = [line for line in lines if line.startswith(ERROR_PREFIX)]
        if len(errors) != 1 or lines[-1] != errors[0]:
            return f"not one error line, last:\n{stderr}"
    return None


def run_case(seeds, seed: int, index: int, root: Path) -> tuple[str, str | None, str]:
    """Runs one case in ``root``; (its description, what failed or None, the outcome's name)."""
    case_folder, out_folder = root / f"case-{index}", root / f"out-{index}"
    case = make_case(seeds, seed, index, case_folder)
    out_folder.mkdir()
    before = _digests(case_folder)
    status, stderr, escaped = fuse_in_process(case_folder / MODEL, out_folder / "fused.onnx")
    described = f"case {case.id} ({case.model}, {case.kind}: {case.description})"
    problem = check_one_line_error(status, stderr, escaped)
    if problem is None and _digests(case_folder) != before:
        problem = "the input's files changed"
    left = sorted(path.name for path in out_folder.iterdir())
    if problem is None and status == 2 and left:
        problem = f"status 2 left {left} in the output's folder"
    if problem is None and status == 0:
        if left not in (["fused.onnx"], ["fused.onnx", "fused.onnx.data"]):
            problem = f"status 0 left {left} in the output's folder"
        else:
            try:
                load_model(out_folder / "fused.onnx")
            except ModelFileError as error:
                problem = f"status 0 wrote a model that does not load again: {error}"
    outcome = "fused" if status == 0 else (stderr.strip().splitlines() or ["?"])[-1][len(ERROR_PREFIX):]
    return described, problem, outcome


def test_property_malformed_models_end_in_one_line(seeds, tmp_path):
    if REPLAY:
        seed, index = map(int, REPLAY.split(":"))
        indices = [index]
    else:
        seed, indices = SEED, range(CASES)
    failures, outcomes = [], collections.Counter()
    for index in indices:
        described, problem, outcome = run_case(seeds, seed, index, tmp_path)
        outcomes["fused" if outcome == "fused" else "refused"] += 1
        if problem is not None:
            failures.append(f"{described}: {problem}\n  replay: ORT_RMSNORM_MALFORMED_REPLAY={seed}:{index} "
                            "pytest tests/cli/test_malformed.py -k property")
    print(f"{len(indices)} cases of seed {seed}: {dict(outcomes)}")
    assert not failures, f"{len(failures)} of {len(indices)} cases failed:\n" + "\n".join(failures[:20])


# ---- the probes found by hand, one test each ---------------------------------------------------------------------


def _sln_model(folder: Path, *, location: str = "w.bin", offset: str | None = "0", length: str | None = "256",
               dims=(64,), default_domain_norm: bool = True, extra: tuple[tuple[str, str], ...] = ()) -> Path:
    """``y = SimplifiedLayerNormalization(x, gamma)`` (default domain, as onnxruntime-genai writes it; the checker
    then runs on a copy in memory) or ``y = x * gamma``, gamma's 64 float32 values in ``folder/w.bin`` (256 bytes)
    through the external data reference given."""
    (folder / "w.bin").write_bytes(np.ones(64, np.float32).tobytes())
    gamma = TensorProto(name="gamma", data_type=TensorProto.FLOAT, dims=list(dims), data_location=TensorProto.EXTERNAL)
    for key, value in (("location", location), ("offset", offset), ("length", length), *extra):
        if value is not None:
            gamma.external_data.add(key=key, value=value)
    if default_domain_norm:
        node = helper.make_node("SimplifiedLayerNormalization", ["x", "gamma"], ["y"], axis=-1, epsilon=1e-5,
                                name="sln")
    else:
        node = helper.make_node("Mul", ["x", "gamma"], ["y"], name="mul")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 64])], [gamma])
    path = folder / "model.onnx"
    path.write_bytes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)],
                                       ir_version=8).SerializeToString())
    return path


def _refused(folder: Path, model: Path, *fragments: str) -> str:
    out = folder / "out"
    out.mkdir()
    before = _digests(folder)
    status, stderr, escaped = fuse_in_process(model, out / "fused.onnx")
    assert check_one_line_error(status, stderr, escaped) is None, (status, stderr, escaped)
    assert status == 2, stderr
    error = stderr.strip().splitlines()[-1]
    for fragment in fragments:
        assert fragment in error, error
    assert _digests(folder) == before and not list(out.iterdir())
    return error


@pytest.mark.parametrize("default_domain_norm", [True, False], ids=["sln", "mul"])
@pytest.mark.parametrize("entry, value, expected", [
    ("offset", "-16", "its offset '-16' is not a byte count"),
    ("length", "-4", "its length '-4' is not a byte count"),
    ("offset", "abc", "its offset 'abc' is not a byte count"),
    ("offset", "9223372036854775808", "is not a byte count"),
    ("offset", "9223372036854775800", "is past any file's end"),
    ("length", "8", "its length is 8 bytes, but its type FLOAT and dims [64] take 256 bytes"),
    ("length", "18446744073709551616", "is not a byte count"),
])
def test_external_offsets_and_lengths_are_checked(tmp_path, default_domain_norm, entry, value, expected):
    """Were SerdeError tracebacks (negative or non-decimal), or accepted and written out (a length that disagrees
    with the tensor's size), whichever op the model holds."""
    model = _sln_model(tmp_path, **{entry: value}, default_domain_norm=default_domain_norm)
    _refused(tmp_path, model, str(model), "tensor 'gamma' stored as external data", expected)


@pytest.mark.parametrize("extra, expected", [
    ((("basepath", "elsewhere"),), "its key 'basepath' is not one onnxruntime reads"),
    ((("length", "256"),), "its 'length' is given twice"),
])
def test_external_data_keys_onnxruntime_refuses_are_refused(tmp_path, extra, expected):
    """onnxruntime fails such a model with "model format error!" (onnx_ir only warns and ignores the key)."""
    _refused(tmp_path, _sln_model(tmp_path, extra=extra), expected)


@pytest.mark.parametrize("default_domain_norm", [True, False], ids=["sln", "mul"])
def test_external_dims_that_disagree_with_the_length_are_refused(tmp_path, default_domain_norm):
    """dims [2^32, 2^32] with a length of 256 bytes: accepted and written out, although onnxruntime refuses it."""
    model = _sln_model(tmp_path, dims=(2**32, 2**32), default_domain_norm=default_domain_norm)
    _refused(tmp_path, model, "its length is 256 bytes", "dims [4294967296, 4294967296] take 73786976294838206464")


@pytest.mark.parametrize("default_domain_norm", [True, False], ids=["sln", "mul"])
@pytest.mark.parametrize("location, expected", [
    ("/etc/passwd", "is an absolute path"),
    ("../../x", "goes up a directory"),
    ("../outside.bin", "goes up a directory"),
    ("sub/../../outside.bin", "goes up a directory"),
    ("link.bin", "reached through this symbolic link"),
    ("dirlink/w.bin", "reached through this symbolic link"),
    ("fifo", "is not a regular file"),
    ("sub", "is not a regular file"),
    ("w.bin\0.x", "holds a NUL character"),
    ("", "names no location"),
])
def test_external_locations_outside_the_folder_are_refused_before_reading(tmp_path, default_domain_norm, location,
                                                                           expected):
    """With a default-domain SimplifiedLayerNormalization the checker was skipped: `/etc/passwd` passed the project's
    own check (then an UnboundLocalError in infer_types), `../../x` was opened before failing. A FIFO would block
    whoever opens it: the check only lstat-s."""
    folder = tmp_path / "models"
    folder.mkdir()
    (tmp_path / "outside.bin").write_bytes(np.ones(64, np.float32).tobytes())
    (folder / "link.bin").symlink_to(tmp_path / "outside.bin")
    (folder / "dirlink").symlink_to(tmp_path)
    (tmp_path / "w.bin").write_bytes(np.ones(64, np.float32).tobytes())
    (folder / "sub").mkdir()
    os.mkfifo(folder / "fifo")
    model = _sln_model(folder, location=location, default_domain_norm=default_domain_norm)
    _refused(folder, model, expected)


def test_external_data_through_a_link_only_where_the_caller_allows_it(tmp_path):
    """A folder fused with --follow-symlinks (a Hugging Face snapshot: data files are links into ../../blobs/) hands
    load_model the links its walk allowed; any other link stays refused, and the checker, whose path form refuses
    links, runs on the model in memory."""
    folder = tmp_path / "snapshot"
    folder.mkdir()
    model = _sln_model(folder, default_domain_norm=False)  # the path form of the checker for this one
    blob = tmp_path / "blob"
    (folder / "w.bin").rename(blob)
    (folder / "w.bin").symlink_to(blob)
    with pytest.raises(ModelFileError, match="reached through this symbolic link"):
        load_model(model)
    with pytest.raises(ModelFileError, match="reached through this symbolic link"):
        load_model(model, linked=lambda path: None)
    loaded = load_model(model, linked=lambda path: str(blob) if path == folder / "w.bin" else None)
    assert [value.name for value in loaded.graph.initializers.values()] == ["gamma"]
    blob.write_bytes(bytes(8))  # the target is the file checked: now too short
    with pytest.raises(ModelFileError, match="too short"):
        load_model(model, linked=lambda path: str(blob))


def test_external_data_of_a_constant_in_a_function_is_checked_against_the_models_folder(tmp_path):
    """A Constant node's tensor in a model-local function may be stored as external data too: it is checked like an
    initializer, and read from the model's folder (onnx_ir sets no base folder for functions: it read the current
    directory's file)."""
    value = numpy_helper.from_array(np.arange(4, dtype=np.float32), "c")
    (tmp_path / "c.bin").write_bytes(value.raw_data)
    stored = TensorProto(name="c", data_type=TensorProto.FLOAT, dims=[4], data_location=TensorProto.EXTERNAL)
    for key, entry in (("location", "c.bin"), ("offset", "0"), ("length", "16")):
        stored.external_data.add(key=key, value=entry)
    body = [helper.make_node("Constant", [], ["c"], value=stored), helper.make_node("Add", ["x", "c"], ["y"])]
    function = helper.make_function("local", "F", ["x"], ["y"], body, [helper.make_opsetid("", 18)])
    graph = helper.make_graph([helper.make_node("F", ["x"], ["y"], domain="local")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("local", 1)],
                              functions=[function], ir_version=9)
    path = tmp_path / "model.onnx"
    path.write_bytes(model.SerializeToString())
    loaded = load_model(path)
    constant = next(iter(loaded.functions.values()))[0].attributes["value"].value
    np.testing.assert_array_equal(constant.numpy(), np.arange(4, dtype=np.float32))
    assert external_data_files(loaded) == {(tmp_path / "c.bin").resolve()}
    stored.external_data[0].value = "../c.bin"
    function.node[0].CopyFrom(helper.make_node("Constant", [], ["c"], value=stored))
    path.write_bytes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18),
                                                             helper.make_opsetid("local", 1)],
                                       functions=[function], ir_version=9).SerializeToString())
    with pytest.raises(ModelFileError, match="goes up a directory"):
        load_model(path)


def _with_invalid_utf8(data: bytes, name: bytes, replacement: bytes) -> bytes:
    assert len(name) == len(replacement) and data.count(name) >= 1
    return data.replace(name, replacement)


@pytest.mark.parametrize("where", ["node_name", "value_name", "doc_string"])
def test_names_that_are_not_utf8_are_one_line(tmp_path, where):
    """Invalid UTF-8 in a name: a UnicodeDecodeError in the checker (node name), a TypeError in onnx_ir (a value
    name protobuf hands over as bytes) or a SerdeError in save_model after fusing succeeded (a doc string)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["hidden"], name="relu_node"),
                               helper.make_node("Relu", ["hidden"], ["y"], name="second", doc_string="docdoc")],
                              "g", [x], [y])
    data = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]).SerializeToString()
    replaced = {"node_name": (b"relu_node", b"relu\xffnode"), "value_name": (b"hidden", b"hid\xc3en"),
                "doc_string": (b"docdoc", b"doc\xe2oc")}[where]
    path = tmp_path / "model.onnx"
    path.write_bytes(_with_invalid_utf8(data, *replaced))
    error = _refused(tmp_path, path, str(path), "is not valid UTF-8")
    assert "\\x" in error  # the bytes escaped, never printed raw


def test_infer_types_leaves_nothing_unbound_when_reading_a_constant_fails(tmp_path):
    """A small external initializer that cannot be read (here: its file is gone) made infer_types fail with
    `UnboundLocalError: ... 'stripped'` instead of falling back to the model's own annotations."""
    import onnx_ir as ir

    from ort_rmsnorm.model.types import infer_types

    path = _sln_model(tmp_path, default_domain_norm=False)
    model = load_model(path)
    (tmp_path / "w.bin").unlink()
    table = infer_types(model)
    assert table.dtype(model.graph.outputs[0]) == ir.DataType.FLOAT


def test_a_serialization_failure_after_fusing_is_one_line(tmp_path, monkeypatch):
    """The last guard: onnx_ir failing to serialize the fused model is an error naming the output, not a
    SerdeError traceback, and leaves nothing behind."""
    import onnx_ir as ir

    path = _sln_model(tmp_path, default_domain_norm=False)

    def failing_save(*_args, **_kwargs):
        try:
            b"\xff".decode()
        except UnicodeDecodeError as error:
            raise ir.serde.SerdeError("Error calling serialize_model_into") from error

    monkeypatch.setattr(ir, "save", failing_save)
    _refused(tmp_path, path, "cannot write the model: onnx_ir cannot serialize it")


@pytest.mark.parametrize("mutation", ["external_offset", "utf8_name"])
def test_malformed_models_through_the_entry_point(cli, tmp_path, mutation):
    """Two of the probes as a user runs them: a real process, its exit status and stderr."""
    if mutation == "external_offset":
        model = _sln_model(tmp_path, offset="-16")
    else:
        x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
        graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"], name="relu_node")], "g", [x],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
        data = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]).SerializeToString()
        model = tmp_path / "model.onnx"
        model.write_bytes(_with_invalid_utf8(data, b"relu_node", b"relu\xffnode"))
    before = _digests(tmp_path)
    result = cli("fuse", model, tmp_path / "fused.onnx", "--quiet")
    assert result.returncode == 2, result
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and result.stderr.startswith(ERROR_PREFIX), result.stderr
    assert _digests(tmp_path) == before
