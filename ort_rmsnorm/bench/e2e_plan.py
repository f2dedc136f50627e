"""What the end-to-end benchmarks (``ort-rmsnorm bench --e2e float|int4``) measure, with their defaults. Importing
this module imports neither torch nor onnxscript."""

from __future__ import annotations

from dataclasses import dataclass

from ..builders.llama import LlamaConfig

MODES = ("float", "int4")

# float: the Llama-style model of ort_rmsnorm.models.exporters in float32 and float16, without a KV cache. Hidden 2048
# with 4 layers; MLP, heads and vocabulary of TinyLlama (Llama 2 architecture).
FLOAT_CONFIG = LlamaConfig(vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_layers=4, num_heads=16)
FLOAT_DTYPES = ("float32", "float16")
FLOAT_PREFILL_TOKENS = 512
FLOAT_RUNS = {"prefill": 5, "decode": 21, "profile": 2}

# MatMulNBits' accuracy_level: 0 unset (float32 arithmetic on the CPU), 1 float32, 4 int8 activations.
ACCURACY_LEVELS = (0, 1, 4)


@dataclass(frozen=True)
class Int4Plan:
    """A Hugging Face Llama exported with a KV cache, int4-quantized; one model per hidden size, layers fixed.

    The defaults are SmolLM-135M's shape (hidden 576, 30 layers, 9 heads, 3 key/value heads, MLP 1536, vocabulary
    49152); other hidden sizes keep its proportions (see ort_rmsnorm.models.smollm.model_shape)."""

    hidden_sizes: tuple[int, ...] = (576,)
    layers: int = 30
    vocab: int = 49152
    past_tokens: int = 128  # in the KV cache at the timed decode step
    prefill_tokens: int = 64  # the prefill starts from an empty cache
    threads: tuple[int, ...] = (1, 2)
    decode_runs: int = 51
    prefill_runs: int = 11
    profile_runs: int = 20  # per model and phase, one intra-op thread
    block_size: int = 32
    symmetric: bool = True
    accuracy_level: int = 0
    clock: str = "auto"  # see timing.clock_name


# A short run that checks the harness, not the figures.
QUICK_INT4 = Int4Plan(hidden_sizes=(256,), layers=4, vocab=8192, past_tokens=32, prefill_tokens=16, decode_runs=11,
                      prefill_runs=3, profile_runs=5)
