"""The markdown of an int4 end-to-end run (:func:`ort_rmsnorm.bench.e2e_int4.run_int4`'s report)."""

from __future__ import annotations

def check_text(check: dict) -> str:
    """The logits check of one phase, in words."""
    verdict = "within" if check["ok"] else "outside"
    control = check["control_max_abs"]
    relative = f": fused / control {check['max_abs'] / control:.2f}" if control else ""
    return (f"max abs difference {check['max_abs']:.3g} ({verdict} verify's tolerance {check['tolerance']:.3g}); "
            f"the original with its norm weights one ulp away differs by {control:.3g}{relative}")


def _ratio(value: float | None) -> str:
    return f"{value:.2f}" if value is not None else "-"


def _speedup_cell(timing: dict | None) -> str:
    if timing is None:
        return "-"
    low, high = timing["ratio_quartiles"]
    noise = " (noise)" if low <= 1.0 <= high else ""
    return f"{timing['speedup']:.3f} ({low:.3f}-{high:.3f}){noise}"


def markdown(report: dict) -> str:
    plan = report["plan"]
    symmetry = "symmetric" if plan["symmetric"] else "with zero points"
    level = plan["accuracy_level"] or "unset (float32 arithmetic)"
    quantization = f"int4 MatMulNBits, block {plan['block_size']}, {symmetry}, accuracy_level {level}"
    lines = [
        f"Hugging Face LlamaForCausalLM (transformers), random weights, exported by torch's dynamo exporter (opset 18) "
        f"with a KV cache, {quantization}; original = the int4 model, fused = the same after `ort_rmsnorm.fuse`. "
        f"Decode: 1 token after {plan['past_tokens']} cached; prefill: {plan['prefill_tokens']} tokens, empty cache; "
        "batch 1; onnxruntime optimizations on for both. Speed-up = original / fused time, medians of interleaved "
        "runs (one thread: the calling thread's CPU time; more: wall time); in brackets the quartiles of the paired "
        "ratios, '(noise)' where they include 1.0.\n",
    ]
    threads = sorted({t["threads"] for m in report["models"] for t in m["timings"]})
    header = ["model", "parameters", "int4 MB"]
    header += [f"{phase} {t}T" for phase in ("decode", "prefill") for t in threads]
    header += ["decode norm share (original -> fused)", "fused / decomposed norm cost"]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for m in report["models"]:
        shape, decode = m["shape"], m["profile"]["decode"]
        cells = [f"hidden {shape['hidden']}, {shape['layers']} layers", f"{m['parameters'] / 1e6:.0f}M",
                 f"{m['int4_bytes'] / 1e6:.0f}"]
        for phase in ("decode", "prefill"):
            for t in threads:
                cells.append(_speedup_cell(next((x for x in m["timings"] if x["phase"] == phase
                                                 and x["threads"] == t), None)))
        cells += [f"{100 * decode['original_share']:.1f}% -> {100 * decode['fused_share']:.1f}%",
                  _ratio(decode["fused_over_decomposed"])]
        lines.append("| " + " | ".join(cells) + " |")
    for m in report["models"]:
        shape = m["shape"]
        lines += ["", f"### hidden {shape['hidden']}: {shape['layers']} layers, {shape['heads']} heads "
                  f"({shape['kv_heads']} key/value), MLP {shape['intermediate']}, vocabulary {shape['vocab']}", ""]
        lines += ["| threads | phase | original ms | fused ms | speed-up (paired quartiles) | runs |",
                  "|---|---|---|---|---|---|"]
        for t in m["timings"]:
            lines.append(f"| {t['threads']} | {t['phase']} | {t['original_ms']:.2f} | {t['fused_ms']:.2f} | "
                         f"{_speedup_cell(t)} | {t['runs']} |")
        lines += ["", "onnxruntime's profiler, one thread, per node the median over the runs, summed (us per run; "
                  "each node also carries the profiler's own floor of a few us):", "",
                  "| phase | model | kernel us | norms us | norm nodes | share | top ops |",
                  "|---|---|---|---|---|---|---|"]
        for phase, p in m["profile"].items():
            for which in ("original", "fused"):
                share = p[which]
                top = ", ".join(f"{op} {us:.0f}" for op, us in share["by_op"][:5])
                lines.append(f"| {phase} | {which} | {share['kernel_us']:.0f} | {share['norm_us']:.0f} | "
                             f"{share['norm_nodes']} | {100 * share['norm_us'] / (share['kernel_us'] or 1):.1f}% | "
                             f"{top} |")
        lines.append("")
        for phase, p in m["profile"].items():
            per_node = p["us_per_norm_node"]
            lines.append(f"- {phase}: the fused norms cost {_ratio(p['fused_over_decomposed'])} of the decomposed ones "
                         f"(the nodes the pass replaced, residual adds included); per node {per_node['original']:.1f} "
                         f"us decomposed, {per_node['fused']:.1f} us fused, {p['us_per_reshape_node']:.1f} us for a "
                         f"Reshape (which moves no data: the profiler's own floor); the removed share alone would "
                         f"make the fused model x{p['expected_speedup']:.3f}; profiled kernel time original / fused "
                         f"x{p['kernel_speedup']:.3f}")
        for phase, c in m["check"].items():
            lines.append(f"- logits at {phase}: {check_text(c)}, max rel {c['max_rel']:.3g} (logits up to "
                         f"{c['logits_max_abs']:.3g})")
        fusion = m["fusion"]
        fused = ", ".join(f"{count} x {op}" for op, count in fusion["fused"].items())
        skipped = "; ".join(f"{count} x {why}" for why, count in fusion["skipped_reasons"].items())
        lines.append(f"- fused {fused}; {fusion['skipped']} skipped" + (f" ({skipped})" if skipped else "")
                     + f"; int4: {m['quantized']['MatMulNBits']} MatMulNBits, {m['quantized']['MatMul']} MatMul left")
        lines.append("- next to the fused norms in onnxruntime's optimized graph: "
                     + "; ".join(f"{count} x {pattern}" for pattern, count in m["neighbours"]["patterns"].items()))
        nodes = m["neighbours"]["nodes"]
        if nodes:
            costs = m["profile"]["decode"]["neighbours_us"]
            lines.append("- neighbours that might be absorbed (casts, shape changes, elementwise): " + ", ".join(
                f"{count} {op} ({costs.get(op, 0):.0f} us per decode step)" for op, count in nodes.items()))
        else:
            lines.append("- no cast, shape change or elementwise node next to a fused norm: nothing to absorb")
    return "\n".join(lines) + "\n"
