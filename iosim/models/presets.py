"""Published models' attention, each number from the model's ``config.json`` on the Hugging Face Hub, cited by URL
beside it (``iosim.models.hf_config`` reads such a file the user passes; nothing is downloaded)."""

from __future__ import annotations

from iosim.core.errors import InputError
from iosim.models.config import LOCAL, ModelConfig, alternating, pattern_layers, uniform

HF = "https://huggingface.co"

# Every number below is the model's config.json at the URL beside it; head_dim is hidden_size / num_attention_heads
# where the file has no head_dim field.
PRESETS: dict[str, ModelConfig] = {
    # n_layer 24, n_head 16, n_embd 1024 (head_dim 64), n_positions 1024, attn_pdrop 0.1: the paper's GPT-2 medium
    "gpt2-medium": ModelConfig("GPT-2 medium", layers=24, heads=16, kv_heads=16, head_dim=64, max_context=1024,
                               source=f"{HF}/openai-community/gpt2-medium/blob/main/config.json", dropout_p=0.1),
    # num_hidden_layers 32, num_attention_heads 32, num_key_value_heads 8, hidden_size 4096 (head_dim 128),
    # max_position_embeddings 8192
    "llama-3-8b": ModelConfig("Llama-3-8B", layers=32, heads=32, kv_heads=8, head_dim=128, max_context=8192,
                              source=f"{HF}/meta-llama/Meta-Llama-3-8B/blob/main/config.json"),
    # num_hidden_layers 80, num_attention_heads 64, num_key_value_heads 8, hidden_size 8192 (head_dim 128),
    # max_position_embeddings 8192
    "llama-3-70b": ModelConfig("Llama-3-70B", layers=80, heads=64, kv_heads=8, head_dim=128, max_context=8192,
                               source=f"{HF}/meta-llama/Meta-Llama-3-70B/blob/main/config.json"),
    # num_hidden_layers 32, num_attention_heads 32, num_key_value_heads 8, hidden_size 4096 (head_dim 128),
    # max_position_embeddings 32768, sliding_window 4096 on every layer
    "mistral-7b": ModelConfig("Mistral-7B-v0.1", layers=32, heads=32, kv_heads=8, head_dim=128, max_context=32768,
                              source=f"{HF}/mistralai/Mistral-7B-v0.1/blob/main/config.json", sliding_window=4096,
                              layer_types=uniform(32, LOCAL)),
    # num_hidden_layers 42, num_attention_heads 16, num_key_value_heads 8, head_dim 256, max_position_embeddings
    # 8192, sliding_window 4096, model_type gemma2: local and global layers alternate
    "gemma-2-9b": ModelConfig("Gemma-2-9B", layers=42, heads=16, kv_heads=8, head_dim=256, max_context=8192,
                              source=f"{HF}/google/gemma-2-9b/blob/main/config.json", sliding_window=4096,
                              layer_types=alternating(42)),
    # num_hidden_layers 28, num_attention_heads 28, num_key_value_heads 4, hidden_size 3584 (head_dim 128),
    # max_position_embeddings 131072; sliding_window 131072 but use_sliding_window false: every layer global
    "qwen2.5-7b": ModelConfig("Qwen2.5-7B", layers=28, heads=28, kv_heads=4, head_dim=128, max_context=131072,
                              source=f"{HF}/Qwen/Qwen2.5-7B/blob/main/config.json"),
    # Qwen3 (model_type qwen3, qwen3_moe): head_dim 128 stated (64 heads × 128 exceeds the 32B's hidden_size 5120),
    # max_position_embeddings 40960, sliding_window null and use_sliding_window false: every layer global. 8B:
    # 36 layers, 32 heads, 8 K/V heads; 32B: 64, 64, 8; 235B-A22B (the April 2025 release; its -2507 variants state
    # max_position_embeddings 262144): 94, 64, 4
    "qwen3-8b": ModelConfig("Qwen3-8B", layers=36, heads=32, kv_heads=8, head_dim=128, max_context=40960,
                            source=f"{HF}/Qwen/Qwen3-8B/blob/main/config.json"),
    "qwen3-32b": ModelConfig("Qwen3-32B", layers=64, heads=64, kv_heads=8, head_dim=128, max_context=40960,
                             source=f"{HF}/Qwen/Qwen3-32B/blob/main/config.json"),
    "qwen3-235b-a22b": ModelConfig("Qwen3-235B-A22B", layers=94, heads=64, kv_heads=4, head_dim=128, max_context=40960,
                                   source=f"{HF}/Qwen/Qwen3-235B-A22B/blob/main/config.json"),
    # num_hidden_layers 126, num_attention_heads 128, num_key_value_heads 8, hidden_size 16384 (head_dim 128),
    # max_position_embeddings 131072
    "llama-3.1-405b": ModelConfig("Llama-3.1-405B", layers=126, heads=128, kv_heads=8, head_dim=128,
                                  max_context=131072, source=f"{HF}/meta-llama/Llama-3.1-405B/blob/main/config.json"),
    # text_config: num_hidden_layers 62, num_attention_heads 32, num_key_value_heads 16, head_dim 128, sliding_window
    # 1024; no sliding_window_pattern nor max_position_embeddings stated: transformers' Gemma3TextConfig defaults, 6
    # (every sixth layer global: 52 local, 10 global) and 131072
    "gemma-3-27b": ModelConfig("Gemma-3-27B", layers=62, heads=32, kv_heads=16, head_dim=128, max_context=131072,
                               source=f"{HF}/google/gemma-3-27b-it/blob/main/config.json (text_config)",
                               sliding_window=1024, layer_types=pattern_layers(6, 62)),
    # gpt-oss (model_type gpt_oss): num_attention_heads 64, num_key_value_heads 8, head_dim 64, sliding_window 128,
    # max_position_embeddings 131072, layer_types local and global alternating, local first; 20b: 24 layers, 120b:
    # 36 (transformers' GptOssConfig, whose defaults are the 120b's; NVIDIA Megatron Bridge's gpt-oss page for the
    # 20b). Its attention has learned sinks (self_attn.sinks, one logit a head)
    "gpt-oss-20b": ModelConfig("gpt-oss-20b", layers=24, heads=64, kv_heads=8, head_dim=64, max_context=131072,
                               source=f"{HF}/openai/gpt-oss-20b/blob/main/config.json", sliding_window=128,
                               layer_types=alternating(24), sinks=True),
    "gpt-oss-120b": ModelConfig("gpt-oss-120b", layers=36, heads=64, kv_heads=8, head_dim=64, max_context=131072,
                                source=f"{HF}/openai/gpt-oss-120b/blob/main/config.json", sliding_window=128,
                                layer_types=alternating(36), sinks=True),
    # multi-head latent attention (model_type deepseek_v3; Kimi-K2 reuses its architecture, DeepseekV3ForCausalLM):
    # kv_lora_rank 512, qk_nope_head_dim 128, qk_rope_head_dim 64 (a head of Q and K: 192), v_head_dim 128, every
    # layer global; only attention is counted, the dense and MoE MLPs alike. DeepSeek-V3: num_hidden_layers 61,
    # num_attention_heads 128, num_key_value_heads 128, max_position_embeddings 163840. Kimi-K2 (the July 2025
    # Instruct release; -0905 states 262144 positions): 61 layers, 64 heads, 64 K/V heads, max_position_embeddings
    # 131072
    "deepseek-v3": ModelConfig("DeepSeek-V3", layers=61, heads=128, kv_heads=128, head_dim=192, max_context=163840,
                               source=f"{HF}/deepseek-ai/DeepSeek-V3/blob/main/config.json", v_head_dim=128,
                               kv_lora_rank=512, qk_rope_head_dim=64),
    "kimi-k2": ModelConfig("Kimi-K2-Instruct", layers=61, heads=64, kv_heads=64, head_dim=192, max_context=131072,
                           source=f"{HF}/moonshotai/Kimi-K2-Instruct/blob/main/config.json", v_head_dim=128,
                           kv_lora_rank=512, qk_rope_head_dim=64),
}


def get_model(name: str) -> ModelConfig:
    if not isinstance(name, str) or name not in PRESETS:
        raise InputError(f"model={name!r} is not one of {sorted(PRESETS)}; or give a config file")
    return PRESETS[name]
