"""Hugging Face Qwen2 (built from its config, nothing fetched) trained with FSDP2 and a
MixedPrecisionPolicy, as a user writes it: `fully_shard` on every decoder layer and on
the root, bf16 parameters for compute, fp32 gradient reduce-scatters.

    flint extract examples/hf_qwen2_fsdp2.py:qwen2 --framework torch --devices 64 --mesh fsdp=64 --estimate

The config is Qwen2-0.5B's published shape (HF Qwen/Qwen2-0.5B config.json: 24 layers,
hidden 896, 14 heads of 64 with 2 KV heads, FFN 4864, vocabulary 151936, tied
embeddings); the tests shrink it. Needs `pip install '.[ecosystem]'` (transformers).
"""
import torch
import torch.nn.functional as F

SEQ, SEQS_PER_RANK = 4096, 1
QWEN2 = dict(vocab_size=151936, hidden_size=896, intermediate_size=4864,
             num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
             max_position_embeddings=32768, rope_theta=1000000.0, tie_word_embeddings=True)


def causal_lm_loss(out, labels):
    return F.cross_entropy(out.logits.flatten(0, 1).float(), labels.flatten(0, 1))


def fsdp2(model, mesh):
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh["fsdp"], mp_policy=mp)
    fully_shard(model, mesh=mesh["fsdp"], mp_policy=mp)
    return model


def qwen2(**overrides):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    import flint.torch as ft

    config = Qwen2Config(**{**QWEN2, **overrides}, attn_implementation="sdpa")
    tokens = torch.empty(SEQS_PER_RANK, SEQ, dtype=torch.long, device="meta")
    return ft.TorchStep(model=lambda: Qwen2ForCausalLM(config), example_inputs=(tokens,),
                        targets=(tokens,), loss_fn=causal_lm_loss, optimizer="adamw",
                        parallelize=fsdp2)
