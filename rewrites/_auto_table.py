"""Where onnxruntime's own norm ops run faster than ours on the CPU: written by ``benchmarks/per_call.py
--write-table`` (do not edit by hand), read by the ``auto`` target (``_auto``).

FASTER_UP_TO[op][dtype]: the largest row length (elements normalized per row) at which onnxruntime's op
(SimplifiedLayerNormalization for RMSNorm, com.microsoft.SkipSimplifiedLayerNormalization for SkipRMSNorm) was
measured faster than ours by more than the noise, counting from the shortest rows up; an op or type absent: ours
was faster at every length measured.
"""

MEASURED_ON = 'measured on Intel(R) Xeon(R) Processor, onnxruntime 1.32.0, one thread, 2026-12-05'
FASTER_UP_TO: dict[str, dict[str, int]] = {
    'SkipRMSNorm': {'float32': 64},
}
