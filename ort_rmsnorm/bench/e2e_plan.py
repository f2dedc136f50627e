"""What the end-to-end benchmark (``ort-rmsnorm bench --e2e``) measures, with their defaults. Importing
this module imports neither torch nor onnxscript."""

from __future__ import annotations

from dataclasses import dataclass

from ..llama import LlamaConfig

# The Llama-style model of ort_rmsnorm.exporters in float32 and float16, without a KV cache. Hidden 2048 with
# 4 layers; MLP, heads and vocabulary of TinyLlama (Llama 2 architecture).
FLOAT_CONFIG = LlamaConfig(vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_layers=4, num_heads=16)
FLOAT_DTYPES = ("float32", "float16")
FLOAT_PREFILL_TOKENS = 512
FLOAT_RUNS = {"prefill": 5, "decode": 21, "profile": 2}
