"""Smoke tests of the benchmark harness (the ort_rmsnorm.bench package) in a tiny configuration. No timing is
asserted: only that every contender runs (or is reported as unsupported with a reason), computes what it should,
and that the table, JSON and plot come out."""

import json
import os
import stat

import numpy as np
import onnx
import pytest

from ort_rmsnorm import cli, runtime
from ort_rmsnorm.bench import __main__ as bench_main
from ort_rmsnorm.bench import cases, command, contenders, machine, plan, plots, tables
from ort_rmsnorm.runtime import make_session, run
from reference import rmsnorm

TINY = dict(hidden_sizes=[48], rows=[1, 5], threads=[1, 2], repetitions=2, min_sample_s=0.0,
            contenders=list(contenders.CONTENDER_NAMES), decode_hidden=48, profile_runs=3, chain_length=3)


@pytest.fixture(scope="module")
def report():
    return plan.run_plan(plan.Plan(dtypes=["float32", "bfloat16"], **TINY), log=lambda line: None)


def test_every_contender_runs_or_says_why(report):
    for case in report["cases"]:
        measured = {m["contender"] for m in case["measurements"]}
        assert measured | set(case["unsupported"]) == set(contenders.CONTENDER_NAMES), case
        assert not measured & set(case["unsupported"])
        # Ours and the copies run for every dtype; a contender that computed something wrong would be unsupported.
        assert {"rmsnorm", "skip_rmsnorm", "copy_gather", "copy2_gather"} <= measured
        assert all(why.startswith("onnxruntime cannot run it: ") for why in case["unsupported"].values())
        for m in case["measurements"]:
            assert m["seconds"] > 0 and m["samples"] == TINY["repetitions"]
            assert m["vs_roofline"] is not None


def test_results_name_the_cpu_and_the_kernels_that_ran(report, monkeypatch):
    """The kernel set a result came from is recorded: forced, or the one the library chose on this CPU."""
    recorded = report["machine"]
    assert recorded["kernels"] in recorded["ort_rmsnorm"].get("cpu_isas", ["scalar"])
    assert set(recorded["cpu"]) == {"vendor", "family", "model", "stepping", "flags"}
    monkeypatch.setenv(machine.CPU_ISA_ENV, "avx2")
    forced = machine.machine_info()
    assert forced["kernels"] == forced["forced_isa"] == "avx2"
    assert "kernels: avx2 (forced by ORT_RMSNORM_CPU_ISA)" in machine.machine_line(forced)


def test_onnxruntime_gaps_are_detected_not_assumed(report):
    float32 = [c for c in report["cases"] if c["dtype"] == "float32"]
    # onnxruntime has every float32 kernel (RMSNormalization only since opset 23 support: older versions lack it).
    assert all(set(c["unsupported"]) <= {"onnx_rmsnorm23"} for c in float32)
    bfloat16 = [c for c in report["cases"] if c["dtype"] == "bfloat16"]
    assert all("decomposed" in c["unsupported"] for c in bfloat16)  # no bfloat16 Mul in onnxruntime's CPU EP


def test_ratios_refer_to_the_right_contenders(report):
    case = cases.case_from_dict(report["cases"][-1])
    ours, theirs = case.get("rmsnorm"), case.get("ort_simplified")
    assert ours.speedup_vs_ort == pytest.approx(theirs.seconds / ours.seconds)
    copies = [m.seconds for m in case.measurements if m.family == "copy"]
    assert ours.vs_roofline == pytest.approx(ours.seconds / min(copies))
    shape = contenders.Shape(case.dtype, case.rows, case.hidden)
    assert ours.bytes == 2 * shape.tensor_bytes + case.hidden * shape.itemsize
    assert case.get("skip_rmsnorm").bytes == 4 * shape.tensor_bytes + case.hidden * shape.itemsize


def test_decode_costs_cover_ours_with_and_without_profiler(report):
    costs = {(c["dtype"], c["contender"]): c for c in report["decode"]}
    for dtype in ("float32", "bfloat16"):
        for name in ("rmsnorm", "skip_rmsnorm"):
            cost = costs[dtype, name]
            assert cost["nodes"] == [{"rmsnorm": "RMSNorm", "skip_rmsnorm": "SkipRMSNorm"}[name]]
            assert cost["profiled_us_mean"] >= 0 and cost["in_graph_us"] is not None
            assert cost["thread_pool_used"] is False  # one row runs inline


def test_outputs_are_written(report, tmp_path):
    markdown = tables.markdown_tables(report)
    assert "| 5x48 |" in markdown and "Decode (1 x H)" in markdown
    pytest.importorskip("matplotlib")
    plot = tmp_path / "plot.png"
    plots.write_plot(report, plot)
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


TINY_COMMAND = ["--dtypes", "float16", "--hidden", "32", "--rows", "3", "--threads", "1", "--repetitions", "1",
                "--min-sample-ms", "0", "--contenders", "copy_cast,rmsnorm", "--no-decode"]


def test_command_line_writes_json_and_table(tmp_path):
    """The output directory is made before the run; every file is written atomically, with the usual permissions."""
    out = tmp_path / "results" / "run"
    assert cli.main(["bench", *TINY_COMMAND, "--out", str(out), "--plot", "none"]) == 0
    report = json.loads((out / "cpu.json").read_text())
    assert [m["contender"] for m in report["cases"][0]["measurements"]] == ["copy_cast", "rmsnorm"]
    assert (out / "cpu.md").is_file() and not (out / "cpu.png").exists()
    assert sorted(path.name for path in out.iterdir()) == ["cpu.json", "cpu.md"]  # no temporary file left
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE((out / "cpu.json").stat().st_mode) == 0o666 & ~umask


def test_unwritable_output_fails_before_measuring(tmp_path, capsys):
    (tmp_path / "file").write_text("")
    assert cli.main(["bench", *TINY_COMMAND, "--out", str(tmp_path / "file" / "results")]) == cli.EXIT_USAGE
    assert "--out: cannot make the directory" in capsys.readouterr().err


@pytest.fixture
def uninstall(monkeypatch):
    """``uninstall("matplotlib" | "torch" | ...)``: the command line sees it as not installed."""

    def uninstall(missing: str) -> None:
        if missing == "matplotlib":
            monkeypatch.setattr(plots, "can_plot", lambda: False)
        else:
            installed = command.installed
            monkeypatch.setattr(command, "installed", lambda module: module != missing and installed(module))

    return uninstall


def test_plot_asked_for_without_matplotlib_fails_before_measuring(tmp_path, uninstall, capsys):
    uninstall("matplotlib")
    out, plot = tmp_path / "results", tmp_path / "plot.png"
    assert cli.main(["bench", *TINY_COMMAND, "--out", str(out), "--plot", str(plot)]) == cli.EXIT_USAGE
    assert capsys.readouterr().err == (
        f"ort-rmsnorm bench: error: --plot {plot}: matplotlib is not installed (pip install matplotlib), "
        "or --plot none\n"
    )
    assert not out.exists()


def test_default_plot_is_left_out_without_matplotlib(tmp_path, uninstall, capsys):
    """Also: ``python -m ort_rmsnorm.bench`` (its __main__.main) is the command line's ``bench``."""
    uninstall("matplotlib")
    out = tmp_path / "results"
    assert bench_main.main([*TINY_COMMAND, "--out", str(out)]) == 0
    assert "no plot: matplotlib is not installed (pip install matplotlib)" in capsys.readouterr().err
    assert (out / "cpu.json").is_file() and not (out / "cpu.png").exists()


def test_end_to_end_without_torch_fails_before_measuring(tmp_path, uninstall, capsys):
    uninstall("torch")
    assert cli.main(["bench", "--e2e", "--out", str(tmp_path / "results")]) == cli.EXIT_USAGE
    assert "--e2e exports its model with torch, which is not installed (pip install torch)" in capsys.readouterr().err
    assert not (tmp_path / "results").exists()


@pytest.mark.parametrize("value", ["-1", "nan", "inf", "abc"])
def test_sample_length_is_a_duration(value, capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["bench", f"--min-sample-ms={value}"])
    assert exit_.value.code == cli.EXIT_USAGE
    assert f"--min-sample-ms: '{value}' is not a number of milliseconds >= 0" in capsys.readouterr().err


def test_sessions_take_turns_when_timed_side_by_side():
    """runtime.time_interleaved (the demo and the end-to-end benchmark): warm-up runs, then turns whose first
    session rotates; runtime.timing_options stops a session's pool from spinning into the next session's run."""
    order = []

    class Recorder:
        def __init__(self, name: str) -> None:
            self.name = name

        def run_with_ort_values(self, output_names, values):
            order.append(self.name)
            return []

    samples = runtime.time_interleaved([Recorder("a"), Recorder("b")], {}, 3, warmup=1)
    assert order == ["a", "b", "a", "b", "b", "a", "a", "b"]
    assert [len(times) for times in samples] == [3, 3] and all(t >= 0 for times in samples for t in times)
    assert runtime.timing_options().get_session_config_entry("session.force_spinning_stop") == "1"


def test_unknown_contender_is_named():
    with pytest.raises(ValueError, match="layernorm"):
        plan.run_plan(plan.Plan(dtypes=["float32"], **{**TINY, "contenders": ["rmsnorm", "layernorm"]}))


def test_chained_model_feeds_each_stage_the_previous_outputs():
    shape = contenders.Shape("float32", 2, 16)
    model = contenders.chained(contenders.ours_skip_rmsnorm(shape), 3)
    onnx.checker.check_model(model)
    assert len(model.graph.node) == 3 and len({n.name for n in model.graph.node}) == 3
    rng = np.random.default_rng(7)
    x, skip = rng.standard_normal((2, 2, 16), dtype=np.float32)
    y, total = run(make_session(model), {"x": x, "skip": skip})
    scale = contenders.scale_values(16)
    for _ in range(3):  # stage i+1: x = y_i, skip = sum_i
        expected_y, expected_sum = rmsnorm(x, scale, epsilon=contenders.EPSILON, skip=skip)
        x, skip = expected_y.astype(np.float32), expected_sum
    np.testing.assert_allclose(total, skip, rtol=1e-6)
    np.testing.assert_allclose(y, x, rtol=1e-5, atol=1e-6)


@pytest.mark.torch
def test_end_to_end_reports_speed_and_norm_share():
    pytest.importorskip("torch")
    from ort_rmsnorm.bench import e2e
    from ort_rmsnorm.builders.llama import LlamaConfig

    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2)
    report = e2e.run_e2e(config, dtypes=("float32",), prefill_tokens=6, prefill_runs=1, decode_runs=1,
                               profile_runs=1, log=lambda line: None)
    assert report["check"]["float32"].endswith(": ok")
    fusion = report["fusion"]["float32"]
    assert sum(fusion["fused"].values()) == 3 and fusion["skipped"] == 0  # two norms per layer and the final one
    phases = {p["phase"]: p for p in report["phases"]}
    assert set(phases) == {"prefill", "decode"} and phases["prefill"]["tokens"] == 6
    for phase in phases.values():
        assert phase["original_ms"] > 0 and phase["fused_ms"] > 0
        # The original's norms are found through the exporter's module names, the fused ones by op type.
        assert 0 < phase["original_norm_share"] < 1 and 0 < phase["fused_norm_share"] < 1
    assert "| float32 | decode (1 token) |" in e2e.markdown(report)


def test_int4_model_shapes_keep_smollm_proportions():
    from ort_rmsnorm.builders.smollm import model_shape

    smollm = model_shape(576, 30, 49152)
    assert (smollm.heads, smollm.kv_heads, smollm.intermediate, smollm.head_dim) == (9, 3, 1536, 64)
    for hidden in (64, 100, 256, 1024, 2048):
        shape = model_shape(hidden, 30, 49152)
        assert hidden % shape.heads == 0 and shape.heads % shape.kv_heads == 0, shape
        assert 3 * shape.kv_heads <= shape.heads or shape.kv_heads == 1, shape
        assert shape.intermediate % 64 == 0 and abs(shape.intermediate - hidden * 8 / 3) <= 32, shape


@pytest.mark.parametrize("options, message", [
    (["--e2e", "--e2e-hidden", "256,512"], "--e2e float measures one model: give --e2e-hidden one value"),
    (["--e2e", "float", "--e2e-past", "8"], "--e2e-past, --e2e-asymmetric and --e2e-accuracy-level are options of"),
    (["--e2e", "int4", "--e2e-dtypes", "float16"], "--e2e int4 runs float32 activations"),
])
def test_end_to_end_options_that_do_not_go_together(options, message, tmp_path, capsys):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    assert cli.main(["bench", *options, "--out", str(tmp_path / "results")]) == cli.EXIT_USAGE
    assert message in capsys.readouterr().err
    assert not (tmp_path / "results").exists()


def test_int4_end_to_end_without_transformers_fails_before_measuring(tmp_path, monkeypatch, capsys):
    # torch installed, transformers not, whatever this environment has (scripts/test --quick's has neither).
    monkeypatch.setattr(command, "installed", lambda module: module != "transformers")
    assert cli.main(["bench", "--e2e", "int4", "--out", str(tmp_path / "results")]) == cli.EXIT_USAGE
    assert ("--e2e int4 exports a transformers Llama with torch: transformers is not installed "
            "(pip install transformers)") in capsys.readouterr().err
    assert not (tmp_path / "results").exists()


@pytest.mark.torch
def test_int4_end_to_end_reports_speed_norm_share_and_neighbours(tmp_path):
    """A two-layer transformers Llama through ``bench --e2e int4``: exported with its KV cache, int4, fused (every
    norm the torch module runs), logits compared, timed, profiled; JSON and markdown written."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    out = tmp_path / "results"
    assert cli.main(["bench", "--e2e", "int4", "--e2e-hidden", "64", "--e2e-layers", "2", "--e2e-vocab", "128",
                     "--e2e-past", "3", "--e2e-prefill", "2", "--e2e-threads", "1", "--e2e-decode-runs", "2",
                     "--e2e-prefill-runs", "1", "--e2e-profile-runs", "2", "--out", str(out)]) == 0
    report = json.loads((out / "e2e-int4.json").read_text())
    assert sorted(path.name for path in out.iterdir()) == ["e2e-int4.json", "e2e-int4.md"]
    [model] = report["models"]
    assert model["shape"]["hidden"] == 64 and model["shape"]["layers"] == 2
    # Two norms per layer and the final one; all but the first after a residual add.
    assert model["fusion"] == {"fused": {"ort_rmsnorm.RMSNorm": 1, "ort_rmsnorm.SkipRMSNorm": 4}, "skipped": 0,
                               "skipped_reasons": {}}
    # q, k, v, o, gate, up, down per layer and the LM head; attention's two products have no constant weight.
    assert model["quantized"]["MatMulNBits"] == 15 and model["quantized"]["MatMul"] == 4
    for phase in ("decode", "prefill"):
        check = model["check"][phase]
        assert check["ok"] and check["max_abs"] <= 1e-4, check
        profile = model["profile"][phase]
        assert profile["fused"]["norm_nodes"] == 5
        # Each decomposed norm is seven nodes (Pow, ReduceMean, Add, Sqrt, Reciprocal, Mul, Mul), plus four adds.
        assert profile["original"]["norm_nodes"] == 5 * 7 + 4 == profile["replaced_nodes"]
        assert 0 < profile["fused_share"] < 1 and 0 < profile["original_share"] < 1
    assert {(t["threads"], t["phase"]) for t in model["timings"]} == {(1, "decode"), (1, "prefill")}
    assert all(t["original_ms"] > 0 and t["fused_ms"] > 0 and t["clock"] == "thread_cpu" for t in model["timings"])
    assert sum(model["neighbours"]["patterns"].values()) == 5
    assert "| hidden 64, 2 layers |" in (out / "e2e-int4.md").read_text()


def test_contenders_take_turns_in_varied_orders():
    """Each repetition runs every contender once; each goes first equally often; none always follows the same other
    one (its predecessor's caches and clock would be part of its time); the order repeats from run to run."""
    from ort_rmsnorm.runtime import turns

    count, repetitions = 4, 40
    order = list(turns(count, repetitions))
    assert order == list(turns(count, repetitions))
    rounds = [order[i:i + count] for i in range(0, len(order), count)]
    assert all(sorted(one) == list(range(count)) for one in rounds)
    assert [one[0] for one in rounds].count(0) == repetitions // count
    predecessors = {contender: {a for a, b in zip(order, order[1:]) if b == contender} for contender in range(count)}
    assert all(len(before) >= 2 for before in predecessors.values()), predecessors
