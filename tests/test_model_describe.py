"""Models described from the CLI / YAML / HF config.json, and the fused-attention node."""
import json
import re

import pytest

from flint.errors import FlintError
from flint.models.describe import PRESETS, resolve_model
from tests.conftest import run_flint

LLAMA_HF = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
            "intermediate_size": 14336, "num_attention_heads": 32, "num_hidden_layers": 32,
            "num_key_value_heads": 8, "vocab_size": 128256, "max_position_embeddings": 8192,
            "hidden_act": "silu", "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
            "tie_word_embeddings": False}
GPT2_HF = {"model_type": "gpt2", "n_embd": 768, "n_head": 12, "n_layer": 12, "n_positions": 1024,
           "vocab_size": 50257, "activation_function": "gelu_new", "n_inner": None}


def test_hf_config_json(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(LLAMA_HF))
    cfg = resolve_model(str(path))
    assert (cfg.n_layers, cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.d_ff, cfg.vocab,
            cfg.seq_len, cfg.norm, cfg.mlp, cfg.pos, cfg.tie_embeddings) == \
        (32, 4096, 32, 8, 14336, 128256, 8192, "rms", "swiglu", "rope", False)
    path.write_text(json.dumps(GPT2_HF))
    cfg = resolve_model(str(path), {"layers": 2})
    assert (cfg.n_layers, cfg.d_ff, cfg.vocab, cfg.norm, cfg.mlp, cfg.pos, cfg.tie_embeddings) \
        == (2, 3072, 50304, "layer", "gelu", "learned", True)     # vocab padded to 128
    path.write_text(json.dumps({**LLAMA_HF, "num_local_experts": 8}))
    with pytest.raises(FlintError, match="num_experts_per_tok"):      # MoE needs its top-k
        resolve_model(str(path))


def test_yaml_mapping_and_presets(tmp_path):
    path = tmp_path / "m.yaml"
    path.write_text("base: llama3-8b\nlayers: 4\nseq: 2048\nactivation: relu2\n")
    cfg = resolve_model(str(path))
    assert (cfg.n_layers, cfg.seq_len, cfg.mlp, cfg.d_model) == (4, 2048, "relu2", 4096)
    with pytest.raises(FlintError, match="heads"):
        resolve_model({"base": "tiny", "heads": 3})
    with pytest.raises(FlintError, match="unknown model key"):
        resolve_model({"base": "tiny", "hiddden": 3})
    big = PRESETS["llama3.1-405b"]
    from flint.models.decoder import param_count
    assert 400e9 < param_count(big) < 410e9          # "405B"
    assert 174e9 < param_count(PRESETS["gpt3-175b"]) < 176e9


def _graph(**dims):
    from flint.frontends.request import ExtractRequest
    from flint.frontends.steps import captured_step

    step, args, _, info = captured_step(ExtractRequest(
        devices=1, mesh="fsdp=1", model="tiny", batch_per_replica=2, remat="none", dims=dims))
    return step.lower(*args).compile().workload(), info


def test_described_model_flops_and_attention_contract():
    dims = dict(layers=2, hidden=256, heads=4, kv_heads=2, ffn=512, vocab=1024, seq=128)
    graph, info = _graph(**dims)
    b, s, h, d, layers = 2, 128, 4, 64, 2
    # hand count: 6 x matmul params x tokens (q, k, v, o, gate, up, down, LM head) + the
    # causal attention core: 2*B*H*S^2*D forward, 2.5x that backward, per layer
    matmul_params = layers * (256 * 256 * 2 + 2 * 256 * 128 + 3 * 256 * 512) + 256 * 1024
    attn_fwd = 4 * b * h * s * s * d / 2
    hand = 6 * matmul_params * b * s + layers * 3.5 * attn_fwd
    counted = sum(n.flops * n.repeat for n in graph.nodes if n.op_class in ("gemm", "attention"))
    assert counted == pytest.approx(hand, rel=0.02)
    attn = [n for n in graph.nodes if n.op_class == "attention"]
    assert sorted(n.meta["attention"]["backward"] for n in attn) == [False, True]
    assert graph.meta.get("attention_uncollapsed") is None
    for n in attn:
        m = n.meta["attention"]
        assert {k: m[k] for k in ("batch", "heads", "kv_heads", "seq_q", "seq_kv", "head_dim",
                                  "causal", "dtype")} == dict(batch=b, heads=h, kv_heads=2,
                                                             seq_q=s, seq_kv=s, head_dim=d,
                                                             causal=True, dtype="bf16")
        assert n.repeat == layers
        qo, kv = b * s * h * d * 2, b * s * 2 * d * 2
        if m["backward"]:
            assert n.flops == 2.5 * attn_fwd
            assert n.bytes_written == qo + 2 * kv                      # dQ, dK, dV
        else:
            assert n.flops == attn_fwd
            assert (n.bytes_read, n.bytes_written) == (qo + 2 * kv, qo + b * h * s * 4)
    # no per-layer S x S f32 scores left outside the attention nodes (XLA hoists the
    # broadcast causal mask out of the layer loop: one buffer per step, repeat 1)
    scores = re.compile(rf"f32\[(\d+,)+{s},{s}\]")
    assert not any(scores.match(o) for n in graph.nodes if n.op_class != "attention"
                   and n.repeat > 1 for o in n.outputs)


def test_cli_dims_and_bad_dims(tmp_path):
    out = tmp_path / "g.json"
    r = run_flint("extract", "--model", "tiny", "--devices", "2", "--hardware", "h100-sxm",
                  "--mesh", "fsdp=2", "--n-layers", "1", "--hidden", "64", "--heads", "2",
                  "--kv-heads", "1", "--ffn", "128", "--vocab", "256", "--seq-len", "32",
                  "--out", str(out), "--json")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["summary"]["flops_per_device"] > 0
    r = run_flint("extract", "--model", "tiny", "--devices", "2", "--hardware", "h100-sxm",
                  "--heads", "3", "--out", str(tmp_path / "bad.json"))
    assert r.returncode == 2 and "heads" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "bad.json").exists()


def test_plain_relu_mlp():
    """A non-gated ReLU MLP (the 2023 MaxText decoder, published.md 2a): one up and one
    down projection, ReLU between them, in the JAX zoo and the torch twin."""
    import jax
    import jax.numpy as jnp
    import torch

    from flint.models.decoder import _mlp, param_count
    from flint.models.torch_decoder import MLP

    cfg = resolve_model({"base": "tiny", "activation": "relu"})
    assert cfg.mlp == "relu"
    assert param_count(cfg) == param_count(cfg.with_(mlp="gelu"))    # one up, one down
    assert param_count(cfg) < param_count(cfg.with_(mlp="swiglu"))
    d, f = cfg.d_model, cfg.d_ff
    x = jax.random.normal(jax.random.PRNGKey(0), (2, 3, d), jnp.float32)
    p = {"w_up": jax.random.normal(jax.random.PRNGKey(1), (d, f)) / d ** 0.5,
         "w_down": jnp.eye(f, d)}
    got = _mlp(x, p, cfg.with_(compute_dtype="float32"))
    want = jax.nn.relu(x @ p["w_up"]) @ p["w_down"]
    assert jnp.allclose(got, want, atol=1e-5) and float(jnp.min(x @ p["w_up"])) < 0
    mlp = MLP(cfg)
    assert not hasattr(mlp, "w_gate")
    t = torch.randn(2, 3, d)
    assert torch.allclose(mlp(t), mlp.w_down(torch.relu(mlp.w_up(t))))
