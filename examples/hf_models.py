"""Hugging Face transformers models built from configs (nothing fetched from the hub),
parallelized by the user's own FSDP2 / DTensor TP code, extracted by Flint's torch front
end without changes:

    flint extract examples/hf_models.py:llama --framework torch --devices 4096 \\
        --mesh fsdp=512,model=8
    flint extract examples/hf_models.py:gpt2 --framework torch --devices 4096 --mesh fsdp=4096

Each function returns a flint.torch.TorchStep: a zero-argument model factory (built on the
meta device), one rank's batch, a loss and the parallelize function. Needs
`pip install '.[ecosystem]'` (transformers).
"""
import torch
import torch.nn.functional as F

SEQ = 2048
# A Llama-3-shaped model, scaled down (the layer count is what the tests shrink)
LLAMA = dict(vocab_size=128256, hidden_size=2048, intermediate_size=8192,
             num_hidden_layers=4, num_attention_heads=16, num_key_value_heads=8,
             max_position_embeddings=SEQ, rope_theta=500000.0, tie_word_embeddings=False)
GPT2 = dict(vocab_size=50304, n_positions=1024, n_embd=768, n_layer=12, n_head=12)


def causal_lm_loss(out, labels):
    logits = out.logits
    return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(0, 1))


def fsdp2(layers_of):
    """FSDP2 over the mesh's `fsdp` dimension: each decoder layer, then the root."""
    def parallelize(model, mesh):
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        sub = mesh["fsdp"]
        for layer in layers_of(model):
            fully_shard(layer, mesh=sub, mp_policy=mp)
        fully_shard(model, mesh=sub, mp_policy=mp)
        return model
    return parallelize


def llama_tp_fsdp(model, mesh):
    """Megatron TP over `model` (column-parallel q/k/v/gate/up and LM head, row-parallel
    o/down; HF attention reshapes with -1 heads, so local shards work), then FSDP2 over
    `fsdp`."""
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   parallelize_module)

    if "model" in mesh.mesh_dim_names and mesh["model"].size() > 1:
        from torch.distributed.tensor import Replicate

        col, row = ColwiseParallel(), RowwiseParallel()
        # vocab-parallel LM head; logits gathered for the user's plain cross entropy
        parallelize_module(model, mesh["model"], {
            "lm_head": ColwiseParallel(output_layouts=Replicate())})
        for layer in model.model.layers:
            parallelize_module(layer, mesh["model"], {
                "self_attn.q_proj": col, "self_attn.k_proj": col, "self_attn.v_proj": col,
                "self_attn.o_proj": row, "mlp.gate_proj": col, "mlp.up_proj": col,
                "mlp.down_proj": row})
    return fsdp2(lambda m: m.model.layers)(model, mesh)


def _step(build, config, parallelize, seqs=1, seq=SEQ):
    import flint.torch as ft

    tokens = torch.empty(seqs, seq, dtype=torch.long, device="meta")
    return ft.TorchStep(model=lambda: build(config), example_inputs=(tokens,),
                        targets=(tokens,), loss_fn=causal_lm_loss, optimizer="adamw",
                        parallelize=parallelize)


def llama(**overrides):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(**{**LLAMA, **overrides}, attn_implementation="sdpa")
    return _step(LlamaForCausalLM, config, llama_tp_fsdp)


def gpt2(**overrides):
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(**{**GPT2, **overrides}, attn_implementation="sdpa")
    return _step(GPT2LMHeadModel, config, fsdp2(lambda m: m.transformer.h),
                 seq=config.n_positions)
