"""What ``ort-rmsnorm bench`` does, in one line: the command line lists it without importing the benchmark."""

HELP = "time the norm kernels against onnxruntime's and a memory copy (--e2e: a whole model)"
