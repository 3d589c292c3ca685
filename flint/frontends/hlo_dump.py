"""HLO from any JAX/XLA, any target: an XLA dump directory or one optimized-HLO file ->
WorkloadGraph.

    flint extract dumps/                          # the train step of a dump directory
    flint extract dumps/:jit_train_step           # a module chosen by name
    flint extract module.after_optimizations.txt  # one file (text, HloModuleProto, HloProto)

The module is already partitioned and optimized by whatever compiler wrote it (a TPU v5p
AOT compile, a GPU run elsewhere, a newer JAX than Flint's), so nothing is recompiled: the
per-device HLO is lowered as the direct path lowers JAX's own compile. The cluster comes
from the module (see flint.hlo.dump) unless `mesh` says otherwise; `hardware` names what
it was compiled for, for the estimate (by default what the dump names: the host CPU, or
the GPU of its gpu_target_config; else an H100).
"""
from __future__ import annotations

import math
from pathlib import Path

from flint.cluster import Cluster, check_device_count, parse_mesh
from flint.errors import FlintError
from flint.frontends.targets import default_devices_per_host, resolve_target
from flint.hlo.dump import choose_module, dump_hardware, first_line, mesh_of_dump


def load_dump(target: str, *, devices: int | None = None, mesh=None,
              hardware: str | None = None, devices_per_host: int | None = None):
    """The WorkloadGraph of a dump's optimized module (see module docstring). `devices`
    and `mesh` (a tuple of (axis, size)) are only needed where the module does not say:
    a module partitioned for N devices is read for N devices."""
    from flint.hlo.loaders import copied_updates_beside, load_hlo
    from flint.passes.lower_hlo import lower_hlo
    from flint.validate.load import devices_named

    chosen = choose_module(target)
    try:
        module = load_hlo(chosen.path)
        if chosen.proto is not None and not module.copied_updates:
            module.copied_updates = copied_updates_beside(chosen.proto, module)
    except FlintError as e:
        raise FlintError(f"{chosen.path}: {e}") from None
    participants = module.num_partitions * module.replica_count
    if isinstance(mesh, (str, dict)):   # `data=4,model=2`: sized against what the module says
        mesh = parse_mesh(mesh, devices or (participants if participants > 1 else
                                            _named_size(mesh)))
    mesh_t = tuple(mesh) if mesh else None
    count = _device_count(module, participants, devices, mesh_t, devices_named(module),
                          chosen.path)
    if mesh_t is None:
        header = first_line(chosen.before) if chosen.before else ""
        found = mesh_of_dump([header, first_line(chosen.path)
                              if chosen.path.name.endswith(".txt") else ""])
        mesh_t = found if found and math.prod(s for _, s in found) == count else (
            ("devices", count),)
    target_hw = resolve_target(hardware or dump_hardware(chosen) or "h100-sxm")
    per_host = devices_per_host or default_devices_per_host(target_hw)
    cluster = Cluster(count, mesh_t, target_hw.spec, target_hw.platform,
                      min(per_host, count))
    graph = lower_hlo(module, cluster)
    from flint.frontends.model_flops import set_model_flops

    set_model_flops(graph)
    from flint.hlo.allocations import xla_memory_beside

    memory = xla_memory_beside(chosen.path)
    if memory:
        graph.meta["xla_memory"] = memory
    graph.meta.update(source="hlo-dump", dump_module=chosen.name,
                      dump_file=chosen.path.name,
                      mesh_from="given" if mesh else (
                          "module" if mesh_t[0][0] != "devices" or len(mesh_t) > 1
                          else "device count"))
    return graph


def _named_size(mesh) -> int:
    """The device count a mesh text names by itself (`data=4,model=2` -> 8)."""
    items = mesh.items() if isinstance(mesh, dict) else (
        part.partition("=")[::2] for part in str(mesh).split(","))
    try:
        return math.prod(int(size) for _, size in items)
    except ValueError:
        raise FlintError(f"bad mesh {mesh!r}: expected NAME=SIZE,...") from None


def _device_count(module, participants: int, devices: int | None, mesh, named: int,
                  path: Path) -> int:
    """Devices the module runs on: its partitions x replicas when > 1 (a given count or
    mesh must agree, or be whole slices of a Multislice program), else the given count,
    else as many as its collectives name."""
    from flint.passes.tpu_megascale import slices

    wanted = math.prod(s for _, s in mesh) if mesh else devices
    if participants > 1:
        # a Multislice program is one slice's: the job is as many slices as given
        if slices(module, wanted or participants, participants) > 1:
            return wanted
        if wanted is not None and wanted != participants:
            what = "the mesh has" if mesh is not None else "--devices is"
            raise FlintError(f"{path.name} is partitioned for {participants} devices "
                             f"(num_partitions x replica_count) but {what} {wanted}")
        return participants
    count = wanted or named
    if count < named:
        raise FlintError(f"{path.name}: its collectives name device {named - 1}, more than "
                         f"the {count} devices given")
    return check_device_count(count)
