"""This machine's table for the ``auto`` target: written by ``ort-rmsnorm tune``, read by ``auto`` before the shipped
one, named in every choice; a broken table file is an error naming it, a table of another CPU is passed over."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import ort_rmsnorm
from ort_rmsnorm import auto_table
from ort_rmsnorm.auto_table import ENV, AutoTableError
from ort_rmsnorm.builders.llama import LlamaConfig, build_llama_onnx

ORT_OPS = {"SimplifiedLayerNormalization", "SkipSimplifiedLayerNormalization"}
OUR_OPS = {"RMSNorm", "SkipRMSNorm"}


def _llama(hidden: int = 32):
    return build_llama_onnx(LlamaConfig(vocab_size=64, hidden_size=hidden, intermediate_size=2 * hidden,
                                        num_layers=2, num_heads=2), "float32")


def _norm_ops(model) -> set[str]:
    return {node.op_type for node in model.graph.node if node.op_type in ORT_OPS | OUR_OPS}


def _write(path, faster_up_to, cpu=None, **extra):
    document = {"format": 1, "measured_on": "measured by a test", "cpu": cpu or auto_table.cpu_key(),
                "onnxruntime": "test", "faster_up_to": faster_up_to, **extra}
    path.write_text(json.dumps(document))
    return path


def test_the_machine_table_decides_and_is_named(tmp_path, monkeypatch):
    table = _write(tmp_path / "table.json", {"RMSNorm": {"float32": 64}, "SkipRMSNorm": {"float32": 64}})
    monkeypatch.setenv(ENV, str(table))
    fused, report = ort_rmsnorm.fuse(_llama(32), "auto")
    assert _norm_ops(fused) == ORT_OPS, report.summary()
    assert all(str(table) in fusion.choice and "measured by a test" in fusion.choice for fusion in report.fusions)
    _write(table, {})  # ours at every length: the same command now writes ours
    fused, report = ort_rmsnorm.fuse(_llama(32), "auto")
    assert _norm_ops(fused) == OUR_OPS and all(str(table) in fusion.choice for fusion in report.fusions)


def test_shipped_ignores_the_machine_table(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    _write(auto_table.machine_table_path().parent.mkdir(parents=True) or auto_table.machine_table_path(),
           {"RMSNorm": {"float32": 4096}})
    monkeypatch.delenv(ENV)
    assert auto_table.machine_table_path() == tmp_path / "ort-rmsnorm" / "auto-table.json"
    _, report = ort_rmsnorm.fuse(_llama(32), "auto")
    assert any(str(auto_table.machine_table_path()) in fusion.choice for fusion in report.fusions)
    monkeypatch.setenv(ENV, "shipped")
    _, report = ort_rmsnorm.fuse(_llama(32), "auto")
    assert all("the shipped table" in fusion.choice for fusion in report.fusions)


def test_a_table_of_another_cpu_is_passed_over(tmp_path, monkeypatch):
    table = _write(tmp_path / "table.json", {"RMSNorm": {"float32": 4096}}, cpu="Some Other CPU (family 1)")
    monkeypatch.setenv(ENV, str(table))
    _, report = ort_rmsnorm.fuse(_llama(32), "auto")
    assert all("the shipped table" in fusion.choice and "measured on another CPU (Some Other CPU (family 1))"
               in fusion.choice for fusion in report.fusions), [fusion.choice for fusion in report.fusions]


@pytest.mark.parametrize("content, problem", [
    ("{", "not a table"),
    ('{"format": 2}', "not a table of format 1"),
    ('{"format": 1, "measured_on": "x", "cpu": "y", "faster_up_to": {"LayerNorm": {}}}', "unknown op 'LayerNorm'"),
    ('{"format": 1, "measured_on": "x", "cpu": "y", "faster_up_to": {"RMSNorm": {"int8": 4}}}', "unknown type"),
    ('{"format": 1, "measured_on": "x", "cpu": "y", "faster_up_to": {"RMSNorm": {"float32": -4}}}', "row length"),
    ('{"format": 1, "measured_on": "x", "cpu": "y", "faster_up_to": {"RMSNorm": {"float32": 1.5}}}', "row length"),
    ('{"format": 1, "measured_on": "x", "cpu": "y", "faster_up_to": {"RMSNorm": {"float32": ' + "9" * 5000 + "}}}",
     "digits"),
    ("[" * 50000, "not a table"),
    (" " * 70000, "larger than"),
    ('{"format": 1, "measured_on": 3, "cpu": "y", "faster_up_to": {}}', "must be text"),
])
def test_a_broken_table_is_an_error_naming_it(tmp_path, monkeypatch, content, problem):
    table = tmp_path / "table.json"
    table.write_text(content)
    monkeypatch.setenv(ENV, str(table))
    with pytest.raises(AutoTableError, match=problem) as caught:
        ort_rmsnorm.fuse(_llama(32), "auto")
    assert str(table) in str(caught.value)


def test_a_broken_table_on_the_command_line_is_one_line(tmp_path):
    model, table = tmp_path / "m.onnx", tmp_path / "table.json"
    import onnx

    onnx.save(_llama(32), model)
    table.write_text("{")
    env = {**__import__("os").environ, ENV: str(table)}
    result = subprocess.run([sys.executable, "-m", "ort_rmsnorm", "fuse", str(model), str(tmp_path / "o.onnx"),
                             "--target", "auto"], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert lines[-1].startswith("ort-rmsnorm fuse: error: ") and str(table) in lines[-1]
    assert "Traceback" not in result.stderr and not (tmp_path / "o.onnx").exists()


def test_a_missing_named_table_is_an_error(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV, str(tmp_path / "absent.json"))
    with pytest.raises(AutoTableError, match="not a regular file"):
        ort_rmsnorm.fuse(_llama(32), "auto")


def test_tune_writes_a_table_auto_reads(tmp_path):
    """`ort-rmsnorm tune` measures (the smallest run here: one length, one round, one run), writes a valid table
    where asked, and auto names it. Which op wins is the machine's business; that the file decides is tested above."""
    table = tmp_path / "tuned" / "table.json"
    env = {**__import__("os").environ, ENV: str(table)}
    result = subprocess.run([sys.executable, "-m", "ort_rmsnorm", "tune", "--hidden", "64", "--dtypes", "float32",
                             "--rounds", "1", "--runs", "1"], capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == 0, result.stderr
    assert "RMSNorm     float32  H    64: ours" in result.stderr and f"wrote {table}" in result.stdout
    loaded, cpu = auto_table.read(table)
    assert cpu == auto_table.cpu_key() and set(loaded.faster_up_to) <= {"RMSNorm", "SkipRMSNorm"}
    assert all(limits == {"float32": 64} for limits in loaded.faster_up_to.values())


def test_tune_prints_the_table_it_would_write(tmp_path):
    env = {**__import__("os").environ, ENV: str(tmp_path / "never.json")}
    result = subprocess.run([sys.executable, "-m", "ort_rmsnorm", "tune", "--hidden", "64", "--dtypes", "float16",
                             "--rounds", "1", "--runs", "1", "--output", "-"], capture_output=True, text=True, env=env,
                            timeout=600)
    assert result.returncode == 0, result.stderr
    printed = json.loads(result.stdout[result.stdout.index("{"):])
    assert printed["cpu"] == auto_table.cpu_key() and printed["onnxruntime"] and printed["format"] == 1
    assert not (tmp_path / "never.json").exists()


@pytest.mark.parametrize("arguments, problem", [
    (["--hidden", "0"], "row lengths"),
    (["--hidden", "64,x"], "row lengths"),
    (["--dtypes", "int8"], "float32, float16"),
    (["--rounds", "0"], "positive integer"),
])
def test_tune_refuses_bad_options(arguments, problem):
    result = subprocess.run([sys.executable, "-m", "ort_rmsnorm", "tune", *arguments], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 2 and problem in result.stderr and "Traceback" not in result.stderr


def test_tune_refuses_an_output_that_is_no_file(tmp_path):
    result = subprocess.run([sys.executable, "-m", "ort_rmsnorm", "tune", "--output", str(tmp_path)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "not a regular file" in result.stderr and "Traceback" not in result.stderr


def test_tune_leaves_a_link_where_the_table_would_go(tmp_path):
    target, link = tmp_path / "elsewhere.json", tmp_path / "table.json"
    target.write_text("{}")
    link.symlink_to(target)
    result = subprocess.run([sys.executable, "-m", "ort_rmsnorm", "tune", "--output", str(link)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "symbolic link" in result.stderr and "Traceback" not in result.stderr
    assert link.is_symlink() and target.read_text() == "{}"


def test_tune_takes_onnxruntime_up_to_its_last_win_before_ours(monkeypatch):
    """The search rule on prescribed per-round ratios (ours / theirs): a tie does not end a search, a length where ours
    wins does, and onnxruntime's op is taken up to the longest length it won before that."""
    from ort_rmsnorm.bench import cold, tune

    theirs, ours, tie = [1.1] * 8, [0.9] * 8, [1.1] * 4 + [0.9] * 4
    script = {  # (op, dtype) -> ratios per length, lengths 64, 128, 256, 512
        ("RMSNorm", "float32"): [tie, theirs, tie, ours],
        ("SkipRMSNorm", "float32"): [theirs, theirs, theirs, theirs],
        ("RMSNorm", "float16"): [ours, theirs, theirs, theirs],
        ("SkipRMSNorm", "float16"): [tie, tie, tie, tie],
    }
    lengths = [64, 128, 256, 512]
    measured = []

    def fake_measure(contenders, dtype, hidden, stage_weights, *, rounds, runs):
        op = contenders[0].op
        measured.append((op, dtype, hidden))
        ratios = script[(op, dtype)][lengths.index(hidden)]
        return cold.ColdResult(hidden, dtype, {"ours": list(ratios), "theirs": [1.0] * len(ratios)})

    monkeypatch.setattr(cold, "measure", fake_measure)
    monkeypatch.setattr(cold, "weights", lambda hidden, stages, mib: [])
    table, cells = tune.measure(lengths, ["float32", "float16"], rounds=8, runs=1, weight_mib=1, library="unused",
                                progress=lambda line: None)
    assert table.faster_up_to == {"RMSNorm": {"float32": 128}, "SkipRMSNorm": {"float32": 512}}
    # Ours at a length ends that op and type's search; ties go on.
    assert ("RMSNorm", "float16", 128) not in measured and ("RMSNorm", "float32", 512) in measured
    assert ("SkipRMSNorm", "float16", 512) in measured
    assert [cell.verdict for cell in cells if (cell.op, cell.dtype) == ("RMSNorm", "float32")] == [
        tune.TIE, tune.THEIRS, tune.TIE, tune.OURS]
