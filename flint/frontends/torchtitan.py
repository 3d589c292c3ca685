"""torchtitan's own parallelize functions under Flint's fake process group.

torchtitan does not take a DeviceMesh: its `parallelize_<model>(model, parallel_dims=...,
training=..., parallelism=..., ...)` builds meshes itself from `ParallelDims`, with
`init_device_mesh(device_type)`, where `device_type` is what torchtitan detected ("cuda" on
a machine without GPUs, which has no CUDA runtime to create). Flint's parallelize hook
gets the DeviceMesh of the fake world; this adapter reads the degrees off its axis names
(`fsdp` -> data_parallel_shard, `dp`/`data` -> data_parallel_replicate, `tp`/`model` ->
tensor_parallel), builds torchtitan's meshes on the CPU device type against the same
fake process group, and calls the model's parallelize function with torchtitan's default
configs (mixed precision bf16 params / f32 reductions; no torch.compile, no activation
checkpointing unless given). `spmd_backend="partial_dtensor"` is torchtitan's DTensor TP
+ FSDP2 path; its newer backends need real devices.
"""
from __future__ import annotations

from flint.errors import FlintError

TP_NAMES = ("tp", "model")
FSDP_NAMES = ("fsdp",)
REPLICATE_NAMES = ("dp", "data", "dp_replicate")


def torchtitan_parallelize(spec, *, ac_config=None, training=None,
                           spmd_backend: str = "partial_dtensor"):
    """A Flint `parallelize(model, mesh)` that runs `spec.parallelize_fn` (a torchtitan
    ModelSpec's) for the mesh Flint built."""

    def parallelize(model, mesh):
        import tempfile

        import torchtitan.distributed.parallel_dims as parallel_dims_module
        from torchtitan.config import CompileConfig, ParallelismConfig, TrainingConfig

        sizes = dict(zip(mesh.mesh_dim_names, mesh.mesh.shape))
        unknown = [n for n in sizes if n not in TP_NAMES + FSDP_NAMES + REPLICATE_NAMES]
        if unknown:
            raise FlintError(f"torchtitan takes mesh axes fsdp, dp and tp; not {unknown}")

        def degree(names):
            return next((int(sizes[n]) for n in names if n in sizes), 1)

        parallelism = ParallelismConfig(
            data_parallel_replicate_degree=degree(REPLICATE_NAMES),
            data_parallel_shard_degree=degree(FSDP_NAMES),
            tensor_parallel_degree=degree(TP_NAMES), spmd_backend=spmd_backend)
        dims = parallel_dims_module.ParallelDims.from_config(parallelism,
                                                             int(mesh.mesh.numel()))
        detected = parallel_dims_module.device_type
        parallel_dims_module.device_type = "cpu"     # the fake process group's device
        try:
            dims.build_mesh()
        finally:
            parallel_dims_module.device_type = detected
        with tempfile.TemporaryDirectory() as dump_folder:
            return spec.parallelize_fn(
                model, parallel_dims=dims, training=training or TrainingConfig(),
                parallelism=parallelism, compile_config=CompileConfig(components=[]),
                ac_config=ac_config, dump_folder=dump_folder)

    return parallelize
