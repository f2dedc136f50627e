"""Where onnxruntime's own norm ops run faster than ours on the CPU, measured cold (each op right after a MatMul, as in
a decoder): the shipped table of the ``auto`` target, written by ``benchmarks/cold_call.py --write-shipped`` (do not
edit by hand). ``ort-rmsnorm tune`` writes a table of the user's machine, which ``auto`` reads first
(``ort_rmsnorm.auto_table``).

FASTER_UP_TO[op][dtype]: onnxruntime's op (SimplifiedLayerNormalization for RMSNorm,
com.microsoft.SkipSimplifiedLayerNormalization for SkipRMSNorm) is taken on rows (elements normalized per row) up to
this length: the longest at which it was measured faster than ours in at least three of four rounds, below the first
length at which ours was faster in three of four (``ort_rmsnorm.bench.tune``); an op or type absent: onnxruntime's op
was faster at no length before ours was.
"""

MEASURED_ON = 'measured cold on AMD EPYC (vendor_id AuthenticAMD, cpu family 26, model 2, stepping 1), onnxruntime 1.32.0, one thread, 2026-12-07'
FASTER_UP_TO: dict[str, dict[str, int]] = {
    'RMSNorm': {'float32': 64, 'float16': 2048},
    'SkipRMSNorm': {'float32': 256},
}
