"""Describe a decoder from the command line, a YAML file or a Hugging Face `config.json`.

    cfg = resolve_model("llama3-70b")                          # zoo name or preset
    cfg = resolve_model("my_model.yaml", {"layers": 4})        # YAML of dims (+ overrides)
    cfg = resolve_model("path/to/config.json")                 # a HF config, read as JSON
    cfg = resolve_model({"base": "llama3-8b", "seq": 4096})    # a mapping (sweep spaces)

Dims use these keys everywhere (CLI options, YAML, sweep spaces): layers, hidden, heads,
kv_heads, ffn, vocab, seq, norm (rms | layer), activation (swiglu | gelu | relu |
relu2),
positional (rope | learned), tie_embeddings, head_dim; mixture of experts (flint.models.moe):
experts, top_k, moe_ffn, shared_experts, first_dense (leading dense layers of `ffn`),
capacity_factor (0 = dropless); multi-head latent attention: q_lora, kv_lora, rope_dim,
v_head_dim (head_dim is then the non-rotary query/key dim). `base` starts from a named
model. A Hugging Face config is only read (never fetched); Mixtral, Qwen2/3-MoE, DeepSeek-V2/V3
and GPT-OSS expert keys are understood.

Presets are the models of the public training tables, shaped from their public
configurations (the paper or model card named beside each).
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict
from pathlib import Path

from flint.errors import FlintError
from flint.models.decoder import ZOO, DecoderConfig

# user key -> DecoderConfig field
DIM_KEYS = {"layers": "n_layers", "hidden": "d_model", "heads": "n_heads",
            "kv_heads": "n_kv_heads", "ffn": "d_ff", "vocab": "vocab", "seq": "seq_len",
            "norm": "norm", "activation": "mlp", "positional": "pos",
            "tie_embeddings": "tie_embeddings", "head_dim": "head_size",
            "experts": "n_experts", "top_k": "top_k", "moe_ffn": "moe_ffn",
            "shared_experts": "n_shared_experts", "first_dense": "first_dense",
            "capacity_factor": "capacity_factor", "q_lora": "q_lora", "kv_lora": "kv_lora",
            "rope_dim": "rope_dim", "v_head_dim": "v_head"}
# keys that may be 0 (feature off); capacity_factor is a number >= 0
ZERO_OK = {"head_size", "n_experts", "top_k", "moe_ffn", "n_shared_experts", "first_dense",
           "q_lora", "kv_lora", "rope_dim", "v_head"}
CHOICES = {"norm": ("rms", "layer"), "mlp": ("swiglu", "gelu", "relu", "relu2"),
           "pos": ("rope", "learned")}


def _gpt(name, layers, hidden, heads, seq=2048, vocab=51200):
    """Megatron GPT: LayerNorm, GeLU MLP of 4h, learned positions, tied embeddings,
    vocab padded to 51200 (Megatron-LM's padding of GPT-2's 50257 tokens)."""
    return DecoderConfig(name, vocab, hidden, layers, heads, heads, 4 * hidden, seq,
                         norm="layer", mlp="gelu", pos="learned", tie_embeddings=True)


def _llama(name, layers, hidden, heads, kv, ffn, vocab, seq):
    return DecoderConfig(name, vocab, hidden, layers, heads, kv, ffn, seq)


def _nemotron(name, layers, hidden, heads, kv, ffn, seq=4096):
    """Nemotron-4 (arXiv 2402.16819, 2406.11704): squared-ReLU MLP, LayerNorm, RoPE,
    untied embeddings, 256k SentencePiece vocabulary."""
    return DecoderConfig(name, 256000, hidden, layers, heads, kv, ffn, seq, norm="layer",
                         mlp="relu2")


def _moe(name, layers, hidden, heads, kv, experts, top_k, moe_ffn, vocab, seq=4096, **kw):
    """A SwiGLU/RMSNorm/RoPE decoder whose MLPs are routed experts (dropless)."""
    return DecoderConfig(name, vocab, hidden, layers, heads, kv, kw.pop("ffn", moe_ffn), seq,
                         n_experts=experts, top_k=top_k, moe_ffn=moe_ffn, **kw)


PRESETS = {c.name: c for c in (
    # GPT-3 (Brown et al. 2020, Table 2.1): 175B = 96 layers, d 12288, 96 heads, ctx 2048.
    _gpt("gpt3-175b", 96, 12288, 96),
    # NeMo's GPT3-5B / 20B configs (NeMo conf/llm/gpt3: 24 x 4096 x 32 heads; 44 x 6144 x 48)
    _gpt("gpt3-5b", 24, 4096, 32),
    _gpt("gpt3-20b", 44, 6144, 48),
    # Korthikanti et al. 2022 (arXiv 2205.05198) Table 3: heads, hidden, layers, vocab 51200.
    _gpt("gpt-22b", 48, 6144, 64),
    _gpt("gpt-530b", 105, 20480, 128),
    _gpt("gpt-1t", 128, 25600, 160),
    # Narayanan et al. 2021 (arXiv 2104.04473) Table 1, the weak-scaling GPTs (layers,
    # hidden, heads; vocab 51200, seq 2048); its 529.6B and 1008B rows are the two above.
    _gpt("gpt-1.7b", 24, 2304, 24),
    _gpt("gpt-3.6b", 30, 3072, 32),
    _gpt("gpt-7.5b", 36, 4096, 32),
    _gpt("gpt-18.4b", 40, 6144, 48),
    _gpt("gpt-39.1b", 48, 8192, 64),
    _gpt("gpt-76.1b", 60, 10240, 80),
    _gpt("gpt-145.6b", 80, 12288, 96),
    _gpt("gpt-310.1b", 96, 16384, 128),
    # Llama 2 (Touvron et al. 2023, Table 1 + HF config.json): vocab 32000, ctx 4096.
    _llama("llama2-7b", 32, 4096, 32, 32, 11008, 32000, 4096),
    _llama("llama2-13b", 40, 5120, 40, 40, 13824, 32000, 4096),
    _llama("llama2-70b", 80, 8192, 64, 8, 28672, 32000, 4096),
    # Llama 3 herd (arXiv 2407.21783, Table 3): 405B = 126 layers, d 16384, FFN 53248,
    # 128 heads, 8 KV heads, vocab 128256.
    _llama("llama3.1-405b", 126, 16384, 128, 8, 53248, 128256, 8192),
    # Mistral 7B (arXiv 2310.06825, Table 1): 32 x 4096, 32 heads, 8 KV, FFN 14336, 32000.
    _llama("mistral-7b", 32, 4096, 32, 8, 14336, 32000, 8192),
    # Nemotron-4 15B (arXiv 2402.16819 Table 1): 32 layers, 6144, 48 heads, 8 KV, FFN 4x.
    _nemotron("nemotron-15b", 32, 6144, 48, 8, 24576),
    # Nemotron-4 340B (arXiv 2406.11704 Table 1): 96 layers, 18432, 96 heads, 8 KV, FFN 73728.
    _nemotron("nemotron-340b", 96, 18432, 96, 8, 73728),
    # NeMo's Nemotron-8B / 22B configs (NeMo conf/llm/nemotron: 32 x 4096 x 32 heads, FFN
    # 16384; 40 x 6144 x 48 heads, FFN 24576), multi-head attention.
    _nemotron("nemotron-8b", 32, 4096, 32, 32, 16384),
    _nemotron("nemotron-22b", 40, 6144, 48, 48, 24576),
    # Mixture of experts (flint.models.moe); seq 4096 as the training tables run them.
    # Mixtral 8x7B (arXiv 2401.04088 Table 1; HF mistralai/Mixtral-8x7B-v0.1 config.json):
    # 32 layers, d 4096, 32 heads, 8 KV, expert FFN 14336, 8 experts, top-2, vocab 32000.
    _moe("mixtral-8x7b", 32, 4096, 32, 8, 8, 2, 14336, 32000),
    # Mixtral 8x22B (HF mistralai/Mixtral-8x22B-v0.1 config.json): 56 layers, d 6144, 48
    # heads, 8 KV, expert FFN 16384, 8 experts, top-2, vocab 32768.
    _moe("mixtral-8x22b", 56, 6144, 48, 8, 8, 2, 16384, 32768),
    # Qwen3-30B-A3B (HF Qwen/Qwen3-30B-A3B config.json; Qwen3 report arXiv 2505.09388
    # Table 2): 48 layers, d 2048, 32 heads of 128, 4 KV, 128 experts of 768, top-8, no
    # shared experts, vocab 151936. QK-norm (two tiny RMSNorms) is left out.
    _moe("qwen3-30b-a3b", 48, 2048, 32, 4, 128, 8, 768, 151936, head_size=128),
    # Qwen3-235B-A22B (HF Qwen/Qwen3-235B-A22B config.json): 94 layers, d 4096, 64 heads of
    # 128, 4 KV, 128 experts of 1536, top-8, vocab 151936.
    _moe("qwen3-235b-a22b", 94, 4096, 64, 4, 128, 8, 1536, 151936, head_size=128),
    # DeepSeek-V3 (arXiv 2412.19437 section 4.2; HF deepseek-ai/DeepSeek-V3 config.json):
    # 61 layers, d 7168, 128 heads, MLA (q_lora 1536, kv_lora 512, nope 128, rope 64, v 128),
    # first 3 layers dense with FFN 18432, then 256 routed experts of 2048 (top-8) and 1
    # shared, vocab 129280. Multi-token prediction is left out (as "w/o MTP" rows run).
    _moe("deepseek-v3", 61, 7168, 128, 128, 256, 8, 2048, 129280, ffn=18432,
         n_shared_experts=1, first_dense=3, head_size=128, q_lora=1536, kv_lora=512,
         rope_dim=64, v_head=128),
    # GPT-OSS-120B (OpenAI gpt-oss model card, arXiv 2508.10925 Table 1; HF openai/
    # gpt-oss-120b config.json): 36 layers, d 2880, 64 heads of 64, 8 KV, 128 experts of
    # 2880, top-4, vocab 201088. Its alternating 128-token sliding-window layers, attention
    # sinks and biases are left out (full causal attention in every layer).
    _moe("gpt-oss-120b", 36, 2880, 64, 8, 128, 4, 2880, 201088, head_size=64),
)}


# How practitioners lay out a preset on a GPU cluster when the user gives no mesh: the
# built-in showcase (Llama-3-8B) trains without tensor parallelism, as torchtitan's
# llama3_8b.toml recipe does (FSDP only, TP 1), with FSDP inside each 8-GPU NVLink host
# and data parallelism across hosts (HSDP; PyTorch FSDP's HYBRID_SHARD, MaxText's
# ici_fsdp + dcn_data), one 8192-token sequence per GPU, and full rematerialization (an
# 8B model's states are 16 B/param / 8 = 16 GB per GPU; layer inputs only, ~2 GB, are
# kept for the backward). Models without a recipe use the generic default mesh.
RECIPES = {"llama3-8b": {"fsdp_per_host": 8, "remat": "full"}}


def recipe_mesh(model: str | None, devices: int, devices_per_host: int = 8) -> tuple[str, str] | None:
    """(mesh, remat) of the model's recipe on `devices` GPUs, or None without one (or on a
    cluster that is not whole hosts)."""
    r = RECIPES.get(model or "")
    per_host = r["fsdp_per_host"] if r else 0
    if not r or devices < per_host or devices % per_host or devices_per_host % per_host:
        return None
    hosts = devices // per_host
    return (f"data={hosts},fsdp={per_host}" if hosts > 1 else f"fsdp={per_host}"), r["remat"]


def known_models() -> dict[str, DecoderConfig]:
    return {**ZOO, **PRESETS}


def resolve_model(spec, overrides: dict | None = None) -> DecoderConfig:
    """A DecoderConfig from a name, a YAML/JSON path, a mapping or a config, with dims
    overrides (user keys) applied and the result checked."""
    if isinstance(spec, DecoderConfig):
        cfg = spec
    elif isinstance(spec, dict):
        cfg = from_mapping(spec, "model mapping")
    elif isinstance(spec, str) and spec.endswith((".yaml", ".yml", ".json")):
        cfg = from_file(spec)
    elif isinstance(spec, str) and spec in known_models():
        cfg = known_models()[spec]
    else:
        raise FlintError(f"unknown model {spec!r}; known: {', '.join(sorted(known_models()))}"
                         f" (or a .yaml of dims, or a Hugging Face config.json)")
    if overrides:
        cfg = _apply(cfg, overrides, "model options")
    return check(cfg)


def from_file(path: str) -> DecoderConfig:
    p = Path(path)
    if not p.is_file():
        raise FlintError(f"model file not found: {path}")
    text = p.read_text(errors="replace")
    if p.suffix == ".json":
        try:
            doc = json.loads(text)
        except ValueError as e:
            raise FlintError(f"{path}: not valid JSON: {e}") from None
        if not isinstance(doc, dict):
            raise FlintError(f"{path}: a config.json must hold a JSON object")
        return from_hf(doc, p.parent.name or p.stem)
    import yaml

    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise FlintError(f"{path}: not valid YAML: {str(e).splitlines()[0]}") from None
    if not isinstance(doc, dict):
        raise FlintError(f"{path}: a model YAML must hold a mapping of dims")
    return from_mapping({"name": p.stem, **doc}, path)


def from_mapping(doc: dict, where: str) -> DecoderConfig:
    """`{base: llama3-8b, layers: 16}` or a complete set of dims."""
    doc = dict(doc)
    base = doc.pop("base", None)
    name = str(doc.pop("name", base or "custom"))
    if base is not None:
        if base not in known_models():
            raise FlintError(f"{where}: unknown base model {base!r}")
        cfg = known_models()[base].with_(name=name)
    else:
        missing = [k for k in ("layers", "hidden", "heads", "ffn", "vocab", "seq") if k not in doc]
        if missing:
            raise FlintError(f"{where}: missing {missing[0]!r} (or give a base model)")
        cfg = DecoderConfig(name, 1, 1, 1, 1, 1, 1, 1)
        doc.setdefault("kv_heads", doc["heads"])
    return _apply(cfg, doc, where)


def _apply(cfg: DecoderConfig, doc: dict, where: str) -> DecoderConfig:
    changes = {}
    for key, value in doc.items():
        if key not in DIM_KEYS:
            raise FlintError(f"{where}: unknown model key {key!r}; known: "
                             f"{', '.join(list(DIM_KEYS) + ['base', 'name'])}")
        field = DIM_KEYS[key]
        if field in CHOICES or field == "tie_embeddings":
            changes[field] = value
        elif field == "capacity_factor":
            if isinstance(value, bool) or not isinstance(value, (int, float)) or \
                    not 0 <= value <= 64:
                raise FlintError(f"{where}: capacity_factor must be a number in 0..64 "
                                 f"(0 = dropless), got {value!r}")
            changes[field] = float(value)
        elif field in ZERO_OK:
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise FlintError(f"{where}: {key} must be an integer >= 0, got {value!r}")
            changes[field] = value
        else:
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise FlintError(f"{where}: {key} must be a positive integer, got {value!r}")
            changes[field] = value
    return cfg.with_(**changes)


def check(cfg: DecoderConfig) -> DecoderConfig:
    for f, allowed in CHOICES.items():
        if getattr(cfg, f) not in allowed:
            key = next(k for k, v in DIM_KEYS.items() if v == f)
            raise FlintError(f"model {cfg.name}: {key} must be one of {'|'.join(allowed)}, "
                             f"got {getattr(cfg, f)!r}")
    if not isinstance(cfg.tie_embeddings, bool):
        raise FlintError(f"model {cfg.name}: tie_embeddings must be true or false")
    if cfg.d_model % cfg.n_heads and not cfg.head_size:
        raise FlintError(f"model {cfg.name}: hidden {cfg.d_model} is not a multiple of "
                         f"{cfg.n_heads} heads (give head_dim)")
    _check_moe(cfg)
    if cfg.n_heads % cfg.n_kv_heads:
        raise FlintError(f"model {cfg.name}: {cfg.n_heads} heads are not a multiple of "
                         f"{cfg.n_kv_heads} KV heads")
    if cfg.pos == "rope" and cfg.head_dim % 2:
        raise FlintError(f"model {cfg.name}: RoPE needs an even head dim, got {cfg.head_dim}")
    return cfg


def _check_moe(cfg: DecoderConfig) -> None:
    if cfg.n_experts:
        if not 1 <= cfg.top_k <= cfg.n_experts:
            raise FlintError(f"model {cfg.name}: top_k must be in 1..{cfg.n_experts} experts, "
                             f"got {cfg.top_k}")
        if cfg.moe_ffn < 1:
            raise FlintError(f"model {cfg.name}: a MoE model needs moe_ffn >= 1")
        if cfg.first_dense >= cfg.n_layers:
            raise FlintError(f"model {cfg.name}: first_dense {cfg.first_dense} leaves no MoE "
                             f"layer of {cfg.n_layers}")
    elif cfg.top_k or cfg.n_shared_experts or cfg.first_dense:
        raise FlintError(f"model {cfg.name}: top_k/shared_experts/first_dense need experts")
    if cfg.kv_lora and (cfg.rope_dim % 2 or cfg.rope_dim < 2 or cfg.v_head < 1):
        raise FlintError(f"model {cfg.name}: latent attention needs an even rope_dim >= 2 and "
                         f"v_head_dim >= 1")


_MOE_KEYS = ("num_local_experts", "n_routed_experts", "num_experts", "moe_num_experts")
_ACTIVATIONS = {"silu": "swiglu", "swiglu": "swiglu", "gelu": "gelu", "gelu_new": "gelu",
                "gelu_pytorch_tanh": "gelu", "gelu_fast": "gelu", "relu2": "relu2",
                "squared-relu": "relu2", "relu_squared": "relu2"}


def from_hf(doc: dict, name: str = "hf-model") -> DecoderConfig:
    """A Hugging Face `config.json` (Llama/Mistral/Qwen2/Nemotron/GPT-2/GPT-NeoX style).
    Gated (SwiGLU) MLPs are the `silu` activation of Llama-style models; GPT-2-style models
    (n_layer/n_embd keys) use LayerNorm, GeLU and learned positions. Vocabularies are padded
    to a multiple of 128 (as Megatron-LM and nanoGPT do) so vocab-parallel layers divide."""
    def get(*keys, default=None):
        for k in keys:
            if doc.get(k) is not None:
                return doc[k]
        if default is None:
            raise FlintError(f"{name}: config.json has none of {', '.join(keys)}")
        return default

    gpt2_style = "n_embd" in doc or doc.get("model_type") in ("gpt2", "gpt_bigcode")
    hidden = int(get("hidden_size", "n_embd", "d_model"))
    heads = int(get("num_attention_heads", "n_head"))
    act = str(get("hidden_act", "activation_function", "hidden_activation",
                  default="gelu" if gpt2_style else "silu"))
    if act not in _ACTIVATIONS:
        raise FlintError(f"{name}: unsupported activation {act!r}")
    mlp = _ACTIVATIONS[act]
    if doc.get("model_type") in ("gpt_neox", "nemotron") and mlp == "swiglu":
        mlp = "gelu"      # ungated MLPs despite a silu-family name
    norm = "layer" if (gpt2_style or "layer_norm_eps" in doc or "layer_norm_epsilon" in doc
                       or "norm_eps" in doc and doc.get("model_type") == "nemotron") else "rms"
    learned = gpt2_style or doc.get("position_embedding_type") == "absolute" and \
        "rope_theta" not in doc
    vocab = int(get("vocab_size"))
    experts = _hf_experts(doc, get, name)
    return check(DecoderConfig(
        name=str(doc.get("_name_or_path") or name), vocab=math.ceil(vocab / 128) * 128,
        d_model=hidden, n_layers=int(get("num_hidden_layers", "n_layer")), n_heads=heads,
        n_kv_heads=int(get("num_key_value_heads", "num_attention_heads", "n_head")),
        d_ff=int(get("intermediate_size", "n_inner", "ffn_hidden_size", default=4 * hidden)),
        seq_len=int(get("max_position_embeddings", "n_positions", "seq_length")),
        norm=norm, mlp=mlp, pos="learned" if learned else "rope",
        tie_embeddings=bool(doc.get("tie_word_embeddings", gpt2_style)),
        head_size=int(doc.get("qk_nope_head_dim") or doc.get("head_dim") or 0), **experts))


def _hf_experts(doc: dict, get, name: str) -> dict:
    """MoE and MLA keys of Mixtral / Qwen-MoE / DeepSeek-V2/V3 / GPT-OSS configs."""
    out: dict = {}
    experts = next((int(doc[k]) for k in _MOE_KEYS if doc.get(k)), 0)
    if experts:
        top_k = doc.get("num_experts_per_tok") or doc.get("experts_per_token") or \
            doc.get("moe_top_k")
        if not top_k:
            raise FlintError(f"{name}: a MoE config without num_experts_per_tok")
        out.update(n_experts=experts, top_k=int(top_k),
                   moe_ffn=int(get("moe_intermediate_size", "intermediate_size")),
                   n_shared_experts=int(doc.get("n_shared_experts") or 0),
                   first_dense=int(doc.get("first_k_dense_replace") or 0))
    if doc.get("kv_lora_rank"):
        out.update(q_lora=int(doc.get("q_lora_rank") or 0), kv_lora=int(doc["kv_lora_rank"]),
                   rope_dim=int(get("qk_rope_head_dim")), v_head=int(get("v_head_dim")))
    return out


def to_mapping(cfg: DecoderConfig) -> dict:
    """The model as a JSON-ready mapping that `resolve_model` reads back (sweep programs)."""
    d = asdict(cfg)
    out = {"name": d["name"]}
    for key, f in DIM_KEYS.items():
        # optional features left off (0) are omitted: a dense model's mapping, and so the
        # sweep/extraction cache keys built from it, stay what they were before MoE keys
        if not (f in ZERO_OK or f == "capacity_factor") or d[f]:
            out[key] = d[f]
    return out


def describe(cfg: DecoderConfig) -> str:
    moe = (f", {cfg.n_experts} experts of {cfg.moe_ffn} top-{cfg.top_k}"
           f"{f' + {cfg.n_shared_experts} shared' if cfg.n_shared_experts else ''}"
           f"{f', first {cfg.first_dense} layers dense' if cfg.first_dense else ''}, "
           + (f"capacity factor {cfg.capacity_factor:g}" if cfg.capacity_factor else "dropless")
           if cfg.n_experts else "")
    mla = (f", MLA (q_lora {cfg.q_lora}, kv_lora {cfg.kv_lora}, rope {cfg.rope_dim}, "
           f"v {cfg.v_head})" if cfg.kv_lora else "")
    return (f"{cfg.name}: {cfg.n_layers} layers, hidden {cfg.d_model}, {cfg.n_heads} heads "
            f"({cfg.n_kv_heads} KV, dim {cfg.head_dim}), FFN {cfg.d_ff} ({cfg.mlp}){moe}{mla}, "
            f"vocab {cfg.vocab}, seq {cfg.seq_len}, {cfg.norm} norm, {cfg.pos} positions"
            f"{', tied embeddings' if cfg.tie_embeddings else ''}")

