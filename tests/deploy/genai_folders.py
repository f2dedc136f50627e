"""Model folders in onnxruntime-genai's layout made with ``onnx.helper`` (no genai, no torch), for the folder tests
that always run. The folders genai's own builder makes are :mod:`ort_rmsnorm.builders.genai`'s."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ort_rmsnorm.builders.genai import BOS, EOS, PAD


HIDDEN = 64


def simplified_norm_model(seed: int, *, hidden: int = HIDDEN) -> onnx.ModelProto:
    """``y = MatMul(SimplifiedLayerNormalization(x, gamma), W)`` with x ``[batch, sequence, hidden]``, as the genai
    builder writes the first norm of a decoder; W (16 KiB) goes to external data when saved with it."""
    rng = np.random.default_rng(seed)
    gamma = numpy_helper.from_array((1 + 0.1 * rng.standard_normal(hidden)).astype(np.float32), "gamma")
    weight = numpy_helper.from_array((rng.standard_normal((hidden, hidden)) / 8).astype(np.float32), "weight")
    nodes = [
        helper.make_node("SimplifiedLayerNormalization", ["x", "gamma"], ["normed"], name="norm", axis=-1,
                         epsilon=1e-6, stash_type=1),
        helper.make_node("MatMul", ["normed", "weight"], ["y"], name="proj"),
    ]
    graph = helper.make_graph(
        nodes, "simplified_norm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "sequence", hidden])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "sequence", hidden])],
        [gamma, weight])
    opsets = [helper.make_opsetid("", 17)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=helper.find_min_ir_version_for(opsets))


def genai_config(**sections) -> dict:
    """A genai_config.json as the builder writes it (decoder with its session options), plus ``sections``."""
    return {
        "model": {
            "bos_token_id": BOS,
            "context_length": 128,
            "decoder": {
                "session_options": {"log_id": "onnxruntime-genai", "provider_options": []},
                "filename": "model.onnx",
                "head_size": 16,
                "hidden_size": HIDDEN,
                "num_attention_heads": 4,
                "num_hidden_layers": 2,
                "num_key_value_heads": 2,
            },
            **sections,
            "eos_token_id": EOS,
            "pad_token_id": PAD,
            "type": "phi3v",
            "vocab_size": 128,
        },
        "search": {"do_sample": False, "max_length": 128, "num_beams": 1, "past_present_share_buffer": True},
    }


def write_onnx_genai_folder(folder: Path) -> Path:
    """A genai-layout folder made with onnx.helper: ``model.onnx`` (a Llama-style decoder with decomposed norms and
    external data), ``embedding.onnx`` (no session options of its own: it uses the decoder's), ``vision.onnx``
    (its own session options, SimplifiedLayerNormalization, external data), ``unnamed.onnx`` (named by no config
    key: copied as it is), a tokenizer file and a file in a subfolder."""
    from ort_rmsnorm.model.write import save_model
    from ort_rmsnorm.builders.llama import LlamaConfig, build_llama_onnx

    folder.mkdir(parents=True, exist_ok=True)
    decoder = build_llama_onnx(LlamaConfig(vocab_size=128, hidden_size=HIDDEN, intermediate_size=160, num_layers=2,
                                           num_heads=4))
    save_model(decoder, folder / "model.onnx", external_data=True)
    save_model(simplified_norm_model(1), folder / "embedding.onnx", external_data=False)
    save_model(simplified_norm_model(2), folder / "vision.onnx", external_data=True)
    save_model(simplified_norm_model(3), folder / "unnamed.onnx", external_data=False)
    config = genai_config(embedding={"filename": "embedding.onnx"},
                          vision={"filename": "vision.onnx", "config_filename": "processor_config.json",
                                  "session_options": {"log_id": "vision", "provider_options": []}})
    (folder / "genai_config.json").write_text(json.dumps(config, indent=4) + "\n")
    (folder / "processor_config.json").write_text("{}\n")
    (folder / "tokenizer.json").write_text('{"model": {"type": "BPE", "vocab": {}, "merges": []}}\n')
    (folder / "extras").mkdir(exist_ok=True)
    (folder / "extras" / "notes.txt").write_text("kept as it is\n")
    return folder


def write_onnx_folder(folder: Path) -> Path:
    """An optimum-style folder of several .onnx models and their configs (no genai_config.json)."""
    from ort_rmsnorm.model.write import save_model
    from ort_rmsnorm.builders.llama import LlamaConfig, build_llama_onnx

    folder.mkdir(parents=True, exist_ok=True)
    save_model(build_llama_onnx(LlamaConfig(vocab_size=128, hidden_size=HIDDEN, intermediate_size=160,
                                            num_layers=1, num_heads=4)),
               folder / "decoder_model_merged.onnx", external_data=True)
    save_model(simplified_norm_model(4), folder / "model.onnx", external_data=False)
    (folder / "onnx").mkdir(exist_ok=True)
    save_model(simplified_norm_model(5), folder / "onnx" / "encoder_model.onnx", external_data=False)
    (folder / "config.json").write_text('{"model_type": "llama"}\n')
    (folder / "generation_config.json").write_text("{}\n")
    return folder
