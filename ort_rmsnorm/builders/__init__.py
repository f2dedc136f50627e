"""The models the demo, ``ort-rmsnorm bench``, ``benchmarks/`` and the tests build (tools side: the pass and the
public API import none of them).

- ``llama``: the Llama-style decoder's config (:class:`~ort_rmsnorm.builders.llama.LlamaConfig`, the demo's
  ``DEMO_CONFIG``) and the model built with ``onnx.helper`` in the dynamo exporter's spelling
- ``exporters``: the same model in torch, the two torch exporters, a transformers causal LM exported with its KV
  cache (imports torch)
- ``smollm``: SmolLM-135M's proportions at any hidden size, and the transformers ``LlamaForCausalLM`` of them
- ``genai``: tiny onnxruntime-genai folders from random-weight Hugging Face models (``TinyConfig``, a
  ``LlamaConfig`` with key/value heads and positions), greedy generation and teacher-forced logits
- ``int4``: int4 weights with onnxruntime's own quantizer

This package's ``__init__`` imports nothing: each module says what it imports.
"""
