"""Tiny onnxruntime-genai model folders made from random-weight Hugging Face models (nothing is downloaded), for
end-to-end runs (``benchmarks/genai_e2e.py``) and the deployment tests (``tests/deploy``).

- :func:`make_hf_folder`: a Hugging Face folder (``config.json``, ``model.safetensors``, a byte-level BPE tokenizer
  trained on a few sentences, ``tokenizer.json`` + ``tokenizer_config.json``) for Llama, Qwen2, Qwen3 or Gemma 2, built
  from a config with ``transformers``; the norm weights are moved away from their ones/zeros initialization, so that
  a lost scale shows.
- :func:`build_genai_folder`: onnxruntime-genai's model builder (``python -m onnxruntime_genai.models.builder``) on
  it, for one of :data:`PRECISIONS`.
- :func:`generate` / :func:`teacher_forced_logits`: greedy generation with onnxruntime_genai, and the decoder's
  logits over a fixed sequence run directly in onnxruntime.

Gemma 3 is not here: the builder of onnxruntime-genai 0.18.0 fails on the Gemma 3 config of transformers 5.24.0
(``KeyError: 'rope_type'`` in ``make_rope_init``: the config holds one rope setting per attention type). Gemma 2 has
the same float32 casts around its norms in 16-bit builds.

Everything heavy (torch, transformers, onnxruntime_genai) is imported inside the functions that need it.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Sequence

import numpy as np
import onnx

from ..contract import qualified
from .llama import LlamaConfig

ARCHITECTURES = ("llama", "qwen2", "qwen3", "gemma2")
# Builder options per build: float32 weights and activations; int4 weights with the builder's default accuracy
# level for CPU (4: MatMulNBits quantizes its activations to int8); int4 weights with float32 activations; float16
# for the CPU execution provider.
PRECISIONS = {
    "fp32": ["-p", "fp32", "-e", "cpu"],
    "int4": ["-p", "int4", "-e", "cpu"],
    "int4-acc1": ["-p", "int4", "-e", "cpu", "--extra_options", "accuracy_level=1"],
    "fp16-cpu": ["-p", "fp16", "-e", "cpu"],
}
# Builds whose activations are float32 everywhere: fusing them must not change a single generated token.
FLOAT32_ACTIVATIONS = ("fp32", "int4-acc1")
BUILDER_MODULE = "onnxruntime_genai.models.builder"
BOS, EOS, PAD = 1, 2, 0
_CORPUS = [
    "the quick brown fox jumps over the lazy dog",
    "an rms norm divides by the root mean square about zero",
    "a layer norm subtracts the mean first",
    "hello world, this is a tiny tokenizer made for tests",
]


@dataclasses.dataclass(frozen=True)
class TinyConfig(LlamaConfig):
    """A :class:`~ort_rmsnorm.builders.llama.LlamaConfig` for transformers' models, tiny by default, with the two sizes
    they have and the onnx.helper and torch builders do not: key/value heads (grouped-query attention) and the
    positions of the rotary embedding. One class would give those builders fields they ignore."""

    vocab_size: int = 384
    hidden_size: int = 64
    intermediate_size: int = 128
    num_layers: int = 2
    num_heads: int = 4
    num_key_value_heads: int = 2
    max_position_embeddings: int = 256

    def transformers_sizes(self) -> dict[str, int]:
        """The sizes in transformers' names (``AutoConfig`` keywords), as the end-to-end results record them."""
        return {"hidden_size": self.hidden_size, "intermediate_size": self.intermediate_size,
                "num_hidden_layers": self.num_layers, "num_attention_heads": self.num_heads,
                "num_key_value_heads": self.num_key_value_heads, "vocab_size": self.vocab_size,
                "max_position_embeddings": self.max_position_embeddings}


def missing_requirements() -> str | None:
    """Why the genai folders cannot be built and run here, or None."""
    for module, package in (("onnxruntime_genai", "onnxruntime-genai"), ("torch", "torch"),
                            ("transformers", "transformers"), ("tokenizers", "tokenizers")):
        if importlib.util.find_spec(module) is None:
            return f"{package} is not installed"
    return None


def make_tokenizer(folder: Path, vocab_size: int) -> None:
    """A byte-level BPE tokenizer (as Llama 3's and Qwen's) trained on a few sentences, saved with transformers."""
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<pad>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator(_CORPUS * 4, trainer)
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>",
                                                pad_token="<pad>")
    fast.save_pretrained(folder)


def make_hf_folder(architecture: str, folder: Path, config: TinyConfig = TinyConfig(), seed: int = 0,
                   **settings) -> Path:
    """A random-weight Hugging Face causal LM folder of ``architecture`` (one of :data:`ARCHITECTURES`); ``settings``
    are further Hugging Face config values (``tie_word_embeddings``, ``rope_theta``, ...)."""
    import torch
    import transformers

    overrides = {
        "llama": {},
        "qwen2": {},
        "qwen3": dict(head_dim=config.head_dim),  # q_norm / k_norm over each head
        # A window the tiny context holds (the default 4096 is over the KV cache the generator allocates).
        "gemma2": dict(head_dim=config.head_dim, sliding_window=32),
    }[architecture]
    hf_config = transformers.AutoConfig.for_model(
        architecture, **config.transformers_sizes(), rms_norm_eps=config.rms_norm_eps, **overrides, **settings,
        pad_token_id=PAD, bos_token_id=BOS, eos_token_id=EOS, initializer_range=0.1)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(hf_config, dtype=torch.float32)
    with torch.no_grad():
        for module in model.modules():
            if "Norm" in type(module).__name__:
                for parameter in module.parameters(recurse=False):
                    parameter.add_(0.1 * torch.randn_like(parameter))
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    make_tokenizer(folder, config.vocab_size)
    return folder


def build_genai_folder(hf_folder: Path, output: Path, precision: str, cache_dir: Path) -> Path:
    """Runs onnxruntime-genai's model builder on ``hf_folder`` for ``precision`` (a key of :data:`PRECISIONS`)."""
    command = [sys.executable, "-m", BUILDER_MODULE, "-i", str(hf_folder), "-o", str(output), "-c", str(cache_dir),
               *PRECISIONS[precision]]
    completed = subprocess.run(command, capture_output=True, text=True, timeout=600)
    if completed.returncode != 0:
        raise RuntimeError(f"the model builder failed ({' '.join(command)}):\n{completed.stderr[-3000:]}")
    return output


def context_length(folder: Path) -> int:
    return json.loads((folder / "genai_config.json").read_text())["model"]["context_length"]


def generate(folder: Path, prompt: Sequence[int], new_tokens: int) -> list[int]:
    """Greedy generation with onnxruntime_genai: the ``new_tokens`` tokens after ``prompt``.

    The search's max_length is the context length, so that the KV cache holds a Gemma 2 sliding window; EOS does
    not end the generation before ``new_tokens``."""
    import onnxruntime_genai as og

    model = og.Model(str(folder))
    params = og.GeneratorParams(model)
    # min_length: a random model may well draw EOS early.
    params.set_search_options(max_length=context_length(folder), min_length=len(prompt) + new_tokens,
                              do_sample=False)
    generator = og.Generator(model, params)
    generator.append_tokens(list(prompt))
    tokens: list[int] = []
    while len(tokens) < new_tokens and not generator.is_done():
        generator.generate_next_token()
        tokens.append(int(generator.get_next_tokens()[0]))
    return tokens


def prompt_tokens(count: int, vocab_size: int = TinyConfig.vocab_size, seed: int = 0) -> list[int]:
    """A fixed prompt of ``count`` tokens: BOS, then ids drawn past the special tokens."""
    rng = np.random.default_rng(seed)
    return [BOS, *rng.integers(3, vocab_size, size=count - 1).tolist()]


def teacher_forced_logits(model_path: Path, folder_config: dict, tokens: Sequence[int]) -> np.ndarray:
    """The decoder's logits [len(tokens), vocab] for ``tokens`` fed at once with an empty cache, run in onnxruntime
    with our library registered (as genai runs it, but without its search)."""
    import onnxruntime as ort

    from .._library import session_options

    options = session_options()
    options.log_severity_level = 3
    session = ort.InferenceSession(str(model_path), options, providers=["CPUExecutionProvider"])
    decoder = folder_config["model"]["decoder"]
    # GroupQueryAttention keeps a sliding-window layer's cache as a ring of window_size positions (MultiHeadAttention,
    # of the fp16 CPU builds, masks instead).
    ring = any(node.op_type == "GroupQueryAttention"
               for node in onnx.load(str(model_path), load_external_data=False).graph.node)
    window = (decoder.get("sliding_window") or {}) if ring else {}
    count = len(tokens)
    feeds = {}
    for node_arg in session.get_inputs():
        if node_arg.name == "input_ids":
            feeds[node_arg.name] = np.array([tokens], np.int64)
        elif node_arg.name == "attention_mask":
            feeds[node_arg.name] = np.ones((1, count), np.int64)
        elif node_arg.name == "position_ids":
            feeds[node_arg.name] = np.arange(count, dtype=np.int64)[None]
        elif node_arg.name.startswith("past_key_values."):
            # Empty, except a ring cache, which onnxruntime wants window_size long.
            layer = int(node_arg.name.split(".")[1])
            past = window["window_size"] if window and layer in window.get("layers", [layer]) else 0
            dtype = np.float16 if node_arg.type == "tensor(float16)" else np.float32
            feeds[node_arg.name] = np.zeros((1, decoder["num_key_value_heads"], past, decoder["head_size"]), dtype)
        else:
            raise ValueError(f"{model_path}: input {node_arg.name} is not one the builder writes")
    return session.run(["logits"], feeds)[0][0]


def norm_ops(model_path: Path) -> dict[str, int]:
    """Counts of the norm ops in a model's main graph, by (domain-qualified) op type."""
    model = onnx.load(str(model_path), load_external_data=False)
    counts: dict[str, int] = {}
    for node in model.graph.node:
        if "Norm" in node.op_type:
            name = qualified(node.domain, node.op_type)
            counts[name] = counts.get(name, 0) + 1
    return counts
