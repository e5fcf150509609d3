"""Named presets: published hyperparameters, each with its source and published size.

Every figure here is quoted from its source (paper table or the HF
``config.json`` of the released checkpoint); ``published_params`` /
``published_active`` are the sizes the source states, which the tests
compare with our analytic counts (within 1%, or ``tolerance`` where the
source's rounding is coarser: gpt3-1.3b, deepseek-v3, qwen3-30b-a3b, kimi-k2,
llama4-scout, llama4-maverick, each with a note).

"Active" parameters are those used per token: everything except the
(E - k) idle routed experts of each MoE layer. Embedding tables count (as
Mistral and Qwen count them); a source that leaves the input embedding out
of its active figure (OpenAI's gpt-oss, Moonshot's Kimi K2: a lookup does
no arithmetic) is compared on its own basis, ``active_basis``.
"""

from __future__ import annotations

from dataclasses import dataclass

from models_zoo.audio import AudioConfig
from models_zoo.deepseek import DeepseekConfig
from models_zoo.gpt import GptConfig
from models_zoo.gpt_oss import GptOssConfig
from models_zoo.llama import LlamaConfig
from models_zoo.multimodal import MultimodalConfig
from models_zoo.vision import VisionConfig


@dataclass(frozen=True, slots=True)
class Preset:
    name: str
    family: str
    config: object
    source: str
    published_params: float
    published_active: float
    tolerance: float = 0.01  # relative; wider only where the source rounds coarser (see note)
    note: str = ""
    active_basis: str = "all"  # or "no_input_embedding": the source's active figure leaves the input table out


def _gpt(
    name: str, h: int, layers: int, heads: int, published: float, head_dim: int = 0, note: str = "", tol: float = 0.01
) -> Preset:
    cfg = GptConfig(hidden=h, layers=layers, heads=heads, head_dim=head_dim, vocab=50257, seq_len=2048)
    src = "Brown et al. 2020 (GPT-3), Table 2.1: n_layers, d_model, n_heads, d_head, n_ctx 2048; GPT-2 BPE vocab 50257"
    return Preset(name, "gpt", cfg, src, published, published, tolerance=tol, note=note)


def _llama(name: str, src: str, published: float, **kw: object) -> Preset:
    return Preset(name, "llama", LlamaConfig(**kw), src, published, published)


def _gpt_oss(name: str, layers: int, experts: int, published: float, active: float) -> Preset:
    cfg = GptOssConfig(hidden=2880, layers=layers, heads=64, kv_heads=8, head_dim=64, ffn=2880, experts=experts,
                       top_k=4, vocab=201088, seq_len=4096)
    src = (f"HF openai/{name} config.json ({layers} layers, hidden 2880, 64 heads of 64, 8 KV heads, {experts} experts of "
           "2880, 4 per token, sliding_window 128 on even layers, vocab 201088, rope_theta 150000, YaRN from 4,096 "
           f"tokens); OpenAI 2025 (gpt-oss model card, arXiv 2508.10925) section 2: {published / 1e9:.1f}B total, "
           f"{active / 1e9:.1f}B active")
    return Preset(name, "gpt-oss", cfg, src, published, active, active_basis="no_input_embedding",
                  note="the card's active count leaves out the input embedding table (0.58B)")


_LLAMA2 = dict(vocab=32000, seq_len=4096, norm_eps=1e-5, rope_theta=10000.0)
_LLAMA3 = dict(vocab=128256, seq_len=8192, norm_eps=1e-5, rope_theta=500000.0)

#: Qwen3 (Qwen Team 2025, arXiv 2505.09388): 151936-token vocabulary, QK-norm, RoPE base 1e6, RMSNorm eps 1e-6;
#: 4,096-token sequences in pre-training stages S1 and S2 (section 3.2).
_QWEN3 = dict(vocab=151936, head_dim=128, qk_norm=True, rope_theta=1000000.0, norm_eps=1e-6, seq_len=4096)

_QWEN3_30B_A3B = LlamaConfig(hidden=2048, layers=48, heads=32, kv_heads=4, ffn=768, experts=128, top_k=8, **_QWEN3)

#: Nemotron-4 (NVIDIA NeMo nemo/collections/llm/gpt/model/nemotron.py, NemotronConfig): LayerNorm with
#: zero-centred gamma and bias (layernorm1p), squared-ReLU MLP, RoPE on half of each head (rotary_percent 0.5), no
#: linear biases, untied embeddings, 4,096-token sequences; Megatron-Core defaults layernorm_epsilon 1e-5, rotary_base
#: 10000; 256,000-token vocabulary (Parmar et al. 2024, Nemotron-4 15B, section 2).
_NEMOTRON4 = dict(vocab=256000, seq_len=4096, mlp="relu2", norm="layernorm1p", rotary_fraction=0.5,
                  norm_eps=1e-5, rope_theta=10000.0)

#: Llama 4 text models (HF meta-llama/Llama-4-Scout-17B-16E and Llama-4-Maverick-17B-128E config.json text_config):
#: 48 layers, hidden 5120, 40 heads of 128, 8 KV heads, vocab 202048, RoPE base 5e5, RMSNorm eps 1e-5; routed experts
#: of 8192 with one shared expert, top-1 with a sigmoid router; every 4th layer NoPE with full attention, the others
#: RoPE with attention chunked at 8192 tokens (iRoPE); 8,192-token sequences (the chunk).
_LLAMA4 = dict(hidden=5120, layers=48, heads=40, kv_heads=8, head_dim=128, ffn=8192, vocab=202048, seq_len=8192,
               rope_theta=500000.0, norm_eps=1e-5, top_k=1, shared_experts=1, variant="llama4",
               expert_layout="fused_io", nope_every=4, sliding_window=8192, full_every=4)

PRESETS: tuple[Preset, ...] = (
    _gpt("gpt", 768, 12, 12, 125e6, note="generic GPT-3-style model; defaults are GPT-3 Small"),
    _gpt("gpt3-1.3b", 2048, 24, 16, 1.3e9, head_dim=128, tol=0.015,
         note="Table 2.1 lists 24 heads of 128 (3072 != d_model 2048); 16 x 128 keeps attention d_model wide; "
         "the exact count 1.316B is 1.2% over the rounded '1.3B'"),
    _gpt("gpt3-6.7b", 4096, 32, 32, 6.7e9),
    _gpt("gpt3-13b", 5140, 40, 40, 13.0e9, head_dim=128,
         note="d_model 5140 with 40 heads of 128 (attention width 5120), as Table 2.1 lists"),
    _gpt("gpt3-175b", 12288, 96, 96, 175.0e9),
    _llama("llama2-7b",
           "Touvron et al. 2023 (Llama 2) Table 1; HF meta-llama/Llama-2-7b-hf config.json; 6.74B on the model card",
           6.74e9, hidden=4096, layers=32, heads=32, kv_heads=32, ffn=11008, **_LLAMA2),
    _llama("llama2-70b",
           "Touvron et al. 2023 (Llama 2) Table 1; HF meta-llama/Llama-2-70b-hf config.json; 69B on the model card",
           69.0e9, hidden=8192, layers=80, heads=64, kv_heads=8, ffn=28672, **_LLAMA2),
    _llama("llama3-8b", "Meta Llama 3 release; HF meta-llama/Meta-Llama-3-8B config.json; 8.03B on the model card",
           8.03e9, hidden=4096, layers=32, heads=32, kv_heads=8, ffn=14336, **_LLAMA3),
    _llama("llama3-70b", "Meta Llama 3 release; HF meta-llama/Meta-Llama-3-70B config.json; 70.6B on the model card",
           70.6e9, hidden=8192, layers=80, heads=64, kv_heads=8, ffn=28672, **_LLAMA3),
    _llama("llama3-405b",
           "Llama Team 2024 (The Llama 3 Herd of Models) Table 3; HF meta-llama/Llama-3.1-405B config.json",
           405e9, hidden=16384, layers=126, heads=128, kv_heads=8, ffn=53248, **_LLAMA3),
    _llama("qwen3-8b", "HF Qwen/Qwen3-8B config.json (36 layers, hidden 4096, 32 heads, 8 KV heads, head_dim 128, "
           "intermediate 12288, untied); model card: 8.2B, 6.95B non-embedding", 8.2e9,
           hidden=4096, layers=36, heads=32, kv_heads=8, ffn=12288, **_QWEN3),
    _llama("qwen3-32b", "HF Qwen/Qwen3-32B config.json (64 layers, hidden 5120, 64 heads, 8 KV heads, head_dim 128, "
           "intermediate 25600, untied); model card: 32.8B, 31.2B non-embedding", 32.8e9,
           hidden=5120, layers=64, heads=64, kv_heads=8, ffn=25600, **_QWEN3),
    Preset("qwen3-30b-a3b", "llama", _QWEN3_30B_A3B,
           "HF Qwen/Qwen3-30B-A3B config.json (48 layers, hidden 2048, 32 heads, 4 KV heads, head_dim 128, 128 experts, "
           "8 per token, moe_intermediate 768); model card: 30.5B total, 3.3B activated", 30.5e9, 3.3e9,
           tolerance=0.02, note="our active count is 3.353B: the card's '3.3B' truncates it (1.6%)"),
    Preset("qwen3-235b-a22b", "llama",
           LlamaConfig(hidden=4096, layers=94, heads=64, kv_heads=4, ffn=1536, experts=128, top_k=8, **_QWEN3),
           "HF Qwen/Qwen3-235B-A22B config.json (94 layers, hidden 4096, 64 heads, 4 KV heads, head_dim 128, 128 "
           "experts, 8 per token, moe_intermediate 1536), as MindSpeed-RL configs/model/qwen3_235b_a22b.yaml repeats "
           "it; model card: 235B total, 22B activated", 235e9, 22e9),
    _llama("nemotron4-15b", "NeMo Nemotron4Config15B (32 layers, hidden 6144, ffn 24576, 48 heads, 8 query groups); "
           "Parmar et al. 2024 (Nemotron-4 15B Technical Report, arXiv 2402.16819): 3.2B embedding + 12.5B "
           "non-embedding parameters", 15.7e9, hidden=6144, layers=32, heads=48, kv_heads=8, ffn=24576, **_NEMOTRON4),
    _llama("nemotron4-340b", "NeMo Nemotron4Config340B (96 layers, hidden 18432, ffn 73728, 96 heads, 8 query groups); "
           "NVIDIA 2024 (Nemotron-4 340B Technical Report, arXiv 2406.11704) Table 1 and section 2.1: 9.4B embedding + "
           "331.6B non-embedding parameters", 341e9,
           hidden=18432, layers=96, heads=96, kv_heads=8, ffn=73728, **_NEMOTRON4),
    Preset("mixtral-8x7b", "mixtral",
           LlamaConfig(hidden=4096, layers=32, heads=32, kv_heads=8, ffn=14336, experts=8, top_k=2, vocab=32000,
                       seq_len=32768, rope_theta=1e6, norm_eps=1e-5),
           "Jiang et al. 2024 (Mixtral of Experts) Table 1, 32k training context; Mistral AI release note: "
           "46.7B total, 12.9B used per token", 46.7e9, 12.9e9),
    Preset("mixtral-8x22b", "mixtral",
           LlamaConfig(hidden=6144, layers=56, heads=48, kv_heads=8, ffn=16384, experts=8, top_k=2, vocab=32000,
                       seq_len=65536, rope_theta=1e6, norm_eps=1e-5),
           "HF mistralai/Mixtral-8x22B-v0.1 config.json (64K context); Mistral AI release note: 141B total, 39B active",
           141e9, 39e9),
    Preset("llama4-scout", "llama", LlamaConfig(experts=16, qk_l2norm=True, **_LLAMA4),
           "HF meta-llama/Llama-4-Scout-17B-16E config.json text_config (16 experts, MoE on every layer, use_qk_norm); "
           "Meta 2025 (The Llama 4 herd, model card): 109B total, 17B active", 109e9, 17e9, tolerance=0.015,
           note="text model only: the 107.8B of the language model are 1.1% under the card's 109B, which counts the "
           "vision encoder too; 17.17B active against the card's '17B'"),
    Preset("llama4-maverick", "llama", LlamaConfig(experts=128, moe_every=2, dense_ffn=16384, **_LLAMA4),
           "HF meta-llama/Llama-4-Maverick-17B-128E config.json text_config (128 experts on every 2nd layer, dense "
           "layers of 16384, no QK-norm); Meta 2025 (The Llama 4 herd, model card): 400B total, 17B active",
           400e9, 17e9, tolerance=0.015,
           note="text model only (the card's 400B rounds the whole model); our active count is 17.18B, 1.1% over "
           "the card's '17B' (as Scout's 17.17B)"),
    Preset("deepseek-v3", "deepseek",
           DeepseekConfig(hidden=7168, layers=61, dense_layers=3, heads=128, q_lora_rank=1536, kv_lora_rank=512,
                          qk_nope_dim=128, qk_rope_dim=64, v_head_dim=128, ffn=18432, expert_ffn=2048, experts=256,
                          top_k=8, shared_experts=1, vocab=129280, seq_len=4096, rope_theta=10000.0),
           "DeepSeek-AI 2024 (DeepSeek-V3 Technical Report, arXiv 2412.19437): 671B total, 37B activated, "
           "4K pre-training context; HF deepseek-ai/DeepSeek-V3 config.json", 671e9, 37e9, tolerance=0.02,
           note="MTP module off, as in transformers' model (--set mtp_layers=1 adds it as training keeps it: "
           "683.6B; the checkpoint's 685B stores its output head again); our active count 37.55B includes both "
           "0.93B embedding tables (36.6B without the input one): '37B' is rounded"),
    Preset("kimi-k2", "deepseek",
           DeepseekConfig(hidden=7168, layers=61, dense_layers=1, heads=64, q_lora_rank=1536, kv_lora_rank=512,
                          qk_nope_dim=128, qk_rope_dim=64, v_head_dim=128, ffn=18432, expert_ffn=2048, experts=384,
                          top_k=8, shared_experts=1, vocab=163840, seq_len=4096, rope_theta=50000.0),
           "Megatron-Bridge KimiK2Provider (src/megatron/bridge/models/kimi/kimi_provider.py: 61 layers, 1 dense, "
           "hidden 7168, ffn 18432, 384 experts of 2048, 1 shared, top-8, 64 heads, q_lora 1536, kv_lora 512, "
           "qk 128 + 64 rope, v 128, vocab 163840, rotary_base 50000, seq 4096), as HF moonshotai/Kimi-K2-Instruct "
           "config.json (DeepseekV3ForCausalLM); Kimi Team 2025 (arXiv 2507.20534): 1.04T total; model card: 32B "
           "activated", 1.04e12, 32e9, tolerance=0.015, active_basis="no_input_embedding",
           note="the released config gives 1.026T, 1.3% under the report's 1.04T (the model card rounds to 1T); "
           "activated 31.69B without the input embedding (32.86B with it) against the card's '32B'"),
    _gpt_oss("gpt-oss-20b", 24, 32, 20.9e9, 3.6e9),
    _gpt_oss("gpt-oss-120b", 36, 128, 116.8e9, 5.1e9),
    Preset("vit-l-16", "vit",
           VisionConfig(hidden=1024, layers=24, heads=16, ffn=4096, image_size=224, patch_size=16),
           "Dosovitskiy et al. 2021 (ViT) Table 1: ViT-Large, 307M; patch 16, 224 px, 1000-class head", 307e6, 307e6),
    Preset("vit-h-14", "vit",
           VisionConfig(hidden=1280, layers=32, heads=16, ffn=5120, image_size=224, patch_size=14),
           "Dosovitskiy et al. 2021 (ViT) Table 1: ViT-Huge, 632M; patch 14, 224 px, 1000-class head", 632e6, 632e6),
    Preset("llava-style-7b", "multimodal",
           MultimodalConfig(
               text=LlamaConfig(hidden=4096, layers=32, heads=32, kv_heads=32, ffn=11008, vocab=32064, seq_len=2048),
               vision=VisionConfig(hidden=1024, layers=23, heads=16, ffn=4096, image_size=336, patch_size=14,
                                   style="clip", norm_eps=1e-5),
           ),
           "Liu et al. 2024 (LLaVA-1.5): CLIP ViT-L/14-336 (penultimate layer: 23 of 24 run), 2-layer MLP, "
           "Vicuna-7B v1.5 (Llama-2-7B); HF llava-hf/llava-1.5-7b-hf: 7.06B", 7.06e9, 7.06e9,
           note="the unused 24th CLIP layer (12.6M) is not in the graph"),
    Preset("internvl2-76b", "multimodal",
           MultimodalConfig(
               text=LlamaConfig(hidden=8192, layers=80, heads=64, kv_heads=8, ffn=28672, **_LLAMA3),
               vision=VisionConfig(hidden=3200, layers=45, heads=25, ffn=12800, image_size=448, patch_size=14,
                                   style="internvit"),
               merge=2, projector_norm=True,
           ),
           "OpenGVLab InternVL2-Llama3-76B: InternViT-6B-448px-V1-5 (45 layers, 3200 wide), pixel shuffle 0.5, "
           "MLP projector, Hermes-2-Theta-Llama-3-70B; 76B", 76e9, 76e9,
           note="one 448 px tile per sample (InternVL tiles dynamically up to 12 + thumbnail)"),
    Preset("omni-moe-30b-a3b", "multimodal",
           MultimodalConfig(
               text=_QWEN3_30B_A3B,
               vision=VisionConfig(hidden=1152, layers=27, heads=16, ffn=4304, image_size=448, patch_size=16,
                                   style="siglip"),
               merge=2, projector_norm=True, projector_hidden=4608, deepstack=(8, 16, 24),
               audio=AudioConfig(hidden=1280, layers=32, heads=20, ffn=5120, mel_bins=128, out_dim=2048),
           ),
           "Qwen3-Omni-30B-A3B Thinker shape (Qwen3-Omni Technical Report, arXiv 2509.17765, Table 1: audio encoder "
           "650M, vision encoder 540M, Thinker 30B-A3B; HF config.json) on Qwen3-30B-A3B (model card: 30.5B total, "
           "3.3B activated): published sums 31.69B / 4.49B", 31.69e9, 4.49e9,
           note="Whisper-style audio stem (conv1d, 2x pooling) stands in for AuT's conv2d stem; "
           "one 448 px image and 30 s of audio per sample"),
)

BY_NAME: dict[str, Preset] = {p.name: p for p in PRESETS}
