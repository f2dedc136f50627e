"""Benchmarks of the norm kernels and of whole models (``ort-rmsnorm bench``; ``python -m ort_rmsnorm.bench``).

The kernel benchmark times our RMSNorm / SkipRMSNorm against onnxruntime's norm kernels, the decomposed graph and a
copy of the same bytes. Every contender is a small ONNX model run by onnxruntime on the CPU with IO binding. All
contenders of one case (dtype, rows, hidden size, threads) read and write the *same* pre-built OrtValues, so Python
overhead, buffer placement and cache state are the same for all of them. Repetitions are interleaved: each
repetition times every contender once (round-robin, starting point rotated), and a contender's time is the median
over repetitions. Bandwidth counts the bytes a contender must move at least once: X + Y + scale for a norm, X + skip
+ Y + sum + scale for a skip norm, input + output for a copy. The roofline of a case is the fastest onnxruntime
copy of the same bytes (see docs/benchmarks.md for why a Gather and a same-type Cast, and not an Identity).

Modules, each importing only those above it in this list:

- ``contenders``: the contenders' ONNX models, the bytes they move, chains of a model's nodes in series
- ``buffers``: the buffers all contenders of a case share, and the check of a contender's outputs
- ``timing``: sessions on the shared buffers, calibrated samples, interleaved repetitions, clocks
- ``cases``: one case measured, its medians and ratios
- ``profile``: reading onnxruntime's profiles (node kernel times by run, norm shares)
- ``decode``: per-node costs at decode sizes (profiler and chain differencing)
- ``cold``: one norm's cost per call where a decoder runs it, right after a MatMul (the profiler)
- ``machine``: the machine a run ran on
- ``tables``, ``plots``: the kernel benchmark's markdown and plot
- ``plan``: what a kernel benchmark run measures, and the run
- ``e2e_plan``: what the end-to-end runs measure, with their defaults
- ``arguments``: the command line's options (no torch, no onnxscript)
- ``e2e``: ``--e2e float``, a Llama-style model exported from torch in float32/float16
- ``int4_tables``: the markdown of an int4 end-to-end run
- ``e2e_int4``: ``--e2e int4``, int4 models of a transformers Llama with a KV cache
- ``tune``: ``ort-rmsnorm tune``, the ``auto`` target's table of this machine, from ``cold``
- ``command``: what ``ort-rmsnorm bench`` runs; ``__main__``: ``python -m ort_rmsnorm.bench``

The models the end-to-end runs build are ``ort_rmsnorm.builders``' (shared with the demo, ``benchmarks/`` and the
tests); this package holds only what ``ort-rmsnorm bench`` runs, and the harness ``ort-rmsnorm tune`` and the demo
time with (``timing``, ``profile``, ``cold``, ``machine``).

This package's ``__init__`` imports nothing, so that the command line can read the options without loading
onnxruntime's sessions or torch.
"""
