"""torchtitan's own Llama 3 and its own `parallelize_llama` (TP, FSDP2, flex attention with
a torch.compile'd block-mask builder, complex rotary embeddings), extracted by Flint:

    flint extract examples/torchtitan_llama.py:llama --framework torch --devices 4096 \\
        --mesh fsdp=512,tp=8

torchtitan builds its meshes itself (ParallelDims, on its detected `device_type`, "cuda"
on a machine without GPUs); `flint.torch.torchtitan_parallelize` runs them on the CPU
against Flint's fake process group and maps Flint's mesh axes to torchtitan's degrees
(`fsdp` -> data_parallel_shard, `dp` -> data_parallel_replicate, `tp`). Needs torchtitan
(0.3.0; it imports triton) beside torch==2.13.0.
"""
import contextlib

import torch
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import loss_parallel

FLAVOR = "debugmodel"    # torchtitan's llama3 flavors: debugmodel, 1B, 3B, 8B, 70B, 405B
SEQ = 2048
LAYERS = None            # override the flavor's layer count (tests shrink it)
ATTENTION = "flex"       # flex | flex_flash | varlen (torchtitan's choices)


def llama():
    from types import SimpleNamespace

    import flint.torch as ft
    from torchtitan.config import ParallelismConfig
    from torchtitan.models.llama3 import model_registry

    spec = model_registry(FLAVOR, attn_backend=ATTENTION)
    if LAYERS is not None:
        spec.model.layers = spec.model.layers[:LAYERS]
    # what torchtitan's trainer does before building: the modules' sharding configs
    # (TP plans, sequence parallelism), resolved against the meshes at parallelize time
    spec.model.update_from_config(config=SimpleNamespace(parallelism=ParallelismConfig(
        spmd_backend="partial_dtensor")))

    def train_step(model, optimizer, tokens, labels):
        positions = torch.arange(tokens.shape[1]).expand(tokens.shape[0], -1)
        masks = model.get_attention_masks(positions)     # torch.compile'd in torchtitan
        logits = model(tokens, positions=positions, attention_masks=masks)
        # vocab-parallel logits under TP: torchtitan's trainer runs loss and backward
        # under loss_parallel, as here
        parallel = isinstance(logits, DTensor)
        with loss_parallel() if parallel else contextlib.nullcontext():
            loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(),
                                                     labels.flatten(0, 1))
            loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return loss

    tokens = torch.empty(1, SEQ, dtype=torch.long, device="meta")
    return ft.TorchStep(model=spec.model.build, example_inputs=(tokens, tokens),
                        parallelize=ft.torchtitan_parallelize(spec), step_fn=train_step)
