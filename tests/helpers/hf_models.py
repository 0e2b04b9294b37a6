"""Small transformers models built from config with random weights (no downloads), one per model
family the transformers integration must serve, and the batches that exercise its masks."""

from __future__ import annotations

import importlib

import torch

VOCAB = 256


def _config(name: str, **fields):
    module, cls = {
        "llama": ("llama", "LlamaConfig"), "qwen2": ("qwen2", "Qwen2Config"), "qwen3": ("qwen3", "Qwen3Config"),
        "mistral": ("mistral", "MistralConfig"), "gemma2": ("gemma2", "Gemma2Config"), "gpt2": ("gpt2", "GPT2Config"),
        "gpt_neox": ("gpt_neox", "GPTNeoXConfig"), "gpt_oss": ("gpt_oss", "GptOssConfig"),
        "bert": ("bert", "BertConfig"), "modernbert": ("modernbert", "ModernBertConfig"),
    }[name]
    try:
        config_class = getattr(importlib.import_module(f"transformers.models.{module}"), cls)
    except (ImportError, AttributeError):
        return None
    return config_class(**fields)


DECODER = dict(vocab_size=VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, max_position_embeddings=512, head_dim=32)

# name -> (config fields, kind); kind: "causal" (a decoder, generates) or "encoder" (bidirectional)
FAMILIES = {
    "llama": (DECODER, "causal"),
    "qwen2": (DECODER, "causal"),
    "qwen3": (DECODER, "causal"),
    "mistral": ({**DECODER, "sliding_window": 7}, "causal"),
    "gemma2": ({**DECODER, "sliding_window": 6, "attn_logit_softcapping": 20.0, "final_logit_softcapping": 30.0,
                "query_pre_attn_scalar": 32, "layer_types": ["sliding_attention", "full_attention"]}, "causal"),
    "gpt2": (dict(vocab_size=VOCAB, n_embd=128, n_layer=2, n_head=4, n_positions=512), "causal"),
    "gpt_neox": (dict(vocab_size=VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                      num_attention_heads=4, max_position_embeddings=512), "causal"),
    # every expert active: top-k routing would turn bf16 noise into a different expert for a token
    "gpt_oss": ({**DECODER, "num_local_experts": 2, "num_experts_per_tok": 2, "sliding_window": 6,
                 "layer_types": ["sliding_attention", "full_attention"]}, "causal"),
    "bert": (dict(vocab_size=VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                  num_attention_heads=4, max_position_embeddings=512), "encoder"),
    "modernbert": (dict(vocab_size=VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=3,
                        num_attention_heads=4, global_attn_every_n_layers=2, local_attention=8,
                        max_position_embeddings=512, pad_token_id=0), "encoder"),
}


def available() -> list[str]:
    return [name for name in FAMILIES if _config(name, **FAMILIES[name][0]) is not None]


def build(name: str, attn_implementation: str, seed: int = 0, dtype=torch.float32, device="cpu"):
    """The family's small model with weights from ``seed`` (the same for every implementation)."""
    from transformers import AutoModelForCausalLM, AutoModelForMaskedLM

    fields, kind = FAMILIES[name]
    config = _config(name, **fields)
    torch.manual_seed(seed)
    auto = AutoModelForCausalLM if kind == "causal" else AutoModelForMaskedLM
    model = auto.from_config(config, attn_implementation=attn_implementation, dtype=torch.float32)
    with torch.no_grad():  # weights spread wider than init's 0.02, so that attention is not uniform
        for parameter in model.parameters():
            if parameter.dim() > 1:
                parameter.normal_(0, 0.08)
    return model.to(device=device, dtype=dtype).eval()


def batch(kind: str, padding: str, b: int = 3, s: int = 24, device="cpu", seed: int = 0):
    """(input_ids, attention_mask or None) with ``padding`` "none", "right" or "left" (rows of
    different lengths, one full row)."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, VOCAB, (b, s), generator=gen)
    if padding == "none":
        return ids.to(device), None
    lengths = [s] + [int(x) for x in torch.randint(s // 3, s, (b - 1,), generator=gen)]
    mask = torch.zeros(b, s, dtype=torch.long)
    for row, n in enumerate(lengths):
        if padding == "right":
            mask[row, :n] = 1
        else:
            mask[row, s - n:] = 1
    ids = ids.masked_fill(mask == 0, 0)
    return ids.to(device), mask.to(device)


def packed(lengths=(5, 9, 4, 6), device="cpu", seed: int = 0):
    """One row of documents packed together: (input_ids (1, total), position_ids restarting at 0)."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, VOCAB, (1, sum(lengths)), generator=gen)
    positions = torch.cat([torch.arange(n) for n in lengths])[None]
    return ids.to(device), positions.to(device)
