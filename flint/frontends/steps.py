"""What an ExtractRequest compiles: a zoo model's step, or a user's SCRIPT.py:FUNCTION
(JAX or PyTorch), or a StableHLO file (flint.frontends.request.extract calls in here)."""
from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

from flint.errors import FlintError
# ExtractRequest.attention -> the zoo decoder's attention option (flint.models.decoder)
from flint.models import ZOO_ATTENTION


def default_zoo_mesh(devices: int, model: str | None = None) -> str:
    """8-way tensor parallelism inside an 8-GPU host and FSDP across hosts; FSDP shards
    d_model, so beyond d_model ways the rest of the devices become data-parallel replicas
    of the FSDP group (hybrid sharding), which fits any power of two up to MAX_DEVICES.
    The TP degree divides the model's heads, KV heads, FFN and vocabulary (GPT-2's 12
    heads take TP=4)."""
    tp = _tp_degree(devices, model)
    rest = devices // tp
    fsdp = math.gcd(rest, _d_model(model)) if rest > _d_model(model) else rest
    axes = ([f"data={rest // fsdp}"] if fsdp < rest else []) + [f"fsdp={fsdp}"]
    return ",".join(axes + ([f"model={tp}"] if tp > 1 else []))


def _tp_degree(devices: int, model: str | None) -> int:
    """On clusters of whole 8-GPU hosts, the largest of 8, 4, 2, 1 that divides every
    dimension Megatron TP splits (heads, KV heads, FFN hidden, vocabulary for
    vocab-parallel embeddings); 1 on smaller clusters, as before."""
    from flint.models import mlp

    dims: tuple[int, ...] = ()
    if model in mlp.ZOO:
        dims = (mlp.ZOO[model]["d"],)
    else:
        from flint.models.describe import resolve_model

        try:
            cfg = resolve_model(model or "llama3-8b")
            dims = (cfg.n_heads, cfg.n_kv_heads, cfg.d_ff, cfg.vocab)
        except FlintError:
            dims = ()
    if devices < 8 or devices % 8:     # TP inside an 8-GPU host; none on smaller clusters
        return 1
    return next((tp for tp in (8, 4, 2) if all(d % tp == 0 for d in dims)), 1)


def _d_model(model: str | None) -> int:
    """The zoo model's d_model (what FSDP shards); 4096 (llama3-8b's) when unknown."""
    from flint.models import decoder, mlp

    if model in mlp.ZOO:
        return mlp.ZOO[model]["d"]
    cfg = decoder.ZOO.get(model or "")
    return int(getattr(cfg, "d_model", 0) or 4096)


def captured_step(request):
    """Return (Captured step, example args, label, model info) of a JAX ExtractRequest."""
    from flint.cluster import parse_mesh
    from flint.frontends.jax import Captured, capture

    target, devices, mesh, hardware = (request.target, request.device_count, request.mesh,
                                       request.target_hardware)
    devices_per_host, model = request.devices_per_host, request.model
    if target is None:
        from flint.models.train import build

        from flint.models.describe import recipe_mesh

        recipe = None if mesh or request.dims else recipe_mesh(model, devices,
                                                                devices_per_host or 8)
        mesh_t = parse_mesh(mesh or (recipe[0] if recipe else default_zoo_mesh(devices, model)),
                            devices)
        sequence_parallel = bool(request.sequence_parallel)
        remat = request.remat if request.remat is not None else (
            recipe[1] if recipe else "selective")
        scan = True if request.scan is None else request.scan
        w = build(model, mesh_t, request.batch_per_replica, request.seq_len, scan, remat,
                  sequence_parallel, request.layers, dims=request.dims or None,
                  gemm_precision=request.gemm_precision,
                  attention=ZOO_ATTENTION.get(request.attention or "flash"),
                  lora=tuple(request.lora))
        step = capture(w.step, devices=devices, mesh=dict(mesh_t), hardware=hardware,
                       in_specs=w.in_specs, out_specs=w.out_specs,
                       donate_argnums=w.donate_argnums, devices_per_host=devices_per_host,
                       compiler_options=dict(request.compiler_options))
        return step, w.args, w.name, w.info
    module, fn_name, fn = load_step(target)
    decorated = isinstance(fn, Captured)
    if decorated:     # the decorator's cluster, unless the request says otherwise
        devices = request.devices or fn.cfg.devices
        hardware = request.hardware or fn.cfg.hardware
    mesh_t = parse_mesh(mesh, devices) if mesh or not decorated else tuple(
        rescaled_mesh(fn.cfg.mesh, devices).items())
    from flint.frontends.targets import start_devices

    start_devices(hardware, devices, devices_per_host)
    args = example_args(module, request.args_fn, target, mesh_t)
    model_flops = getattr(module, "model_flops", None)
    if decorated:
        step = capture(fn.fn, devices=devices, mesh=dict(mesh_t), hardware=hardware,
                       in_specs=fn.cfg.in_specs, rules=fn.cfg.rules,
                       out_specs=fn.cfg.out_specs, static_argnums=fn.cfg.static_argnums,
                       donate_argnums=fn.cfg.donate_argnums,
                       devices_per_host=devices_per_host,
                       model_flops=fn.cfg.model_flops or model_flops,
                       compiler_options={**dict(fn.cfg.compiler_options),
                                         **dict(request.compiler_options)})
    else:
        step = capture(fn, devices=devices, mesh=dict(mesh_t), hardware=hardware,
                       in_specs=getattr(module, "in_specs", None),
                       rules=getattr(module, "rules", None), devices_per_host=devices_per_host,
                       model_flops=model_flops, compiler_options=dict(request.compiler_options))
    return step, args, fn_name, {}


def rescaled_mesh(mesh, devices: int) -> dict:
    """Keep a decorated step's mesh; when --devices differs, grow its first axis."""
    sizes = dict(mesh)
    total = math.prod(sizes.values())
    if total == devices:
        return sizes
    first = next(iter(sizes))
    rest = total // sizes[first]
    if devices % rest:
        raise FlintError(f"--devices {devices} is not a multiple of the step's other mesh "
                         f"axes ({rest} devices); pass --mesh")
    sizes[first] = devices // rest
    return sizes


def load_step(target: str):
    """(module, function name, function) of SCRIPT.py:FUNCTION."""
    module, fn_name = _load_script(target)
    fn = getattr(module, fn_name, None)
    if fn is None or not callable(fn):
        raise FlintError(f"{target.split(':')[0]} has no function {fn_name!r}")
    return module, fn_name, fn


def _load_script(target: str):
    path_text, sep, fn_name = target.rpartition(":")
    if not sep or not path_text or not fn_name:
        raise FlintError(f"target {target!r} must look like path/to/script.py:function")
    path = Path(path_text)
    if not path.is_file():
        raise FlintError(f"file not found: {path}")
    spec = importlib.util.spec_from_file_location(f"flint_user_{path.stem}", path)
    if spec is None or spec.loader is None:
        raise FlintError(f"{path} is not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(path.parent.resolve()))
    try:
        spec.loader.exec_module(module)
    except FlintError:
        raise
    except Exception as e:
        raise FlintError(f"{path} failed to import: {type(e).__name__}: "
                         f"{str(e).splitlines()[0] if str(e) else ''}") from None
    finally:
        sys.path.pop(0)
    return module, fn_name


def example_args(module, args_fn: str, target: str, mesh=None, torch: bool = False) -> tuple:
    """The script's example arguments. JAX: built inside flint.virtual_mesh (so models
    that annotate shardings at construction build); `example_args(mesh)` gets that
    AbstractMesh (`mesh.shape["data"]`, `mesh.size`), so the batch follows --devices.
    Torch (`torch=True`): the step's (model, optimizer, *batch); `example_args(mesh)` gets
    a dict of the mesh's axis sizes."""
    import contextlib
    import inspect

    source = getattr(module, args_fn, None)
    if source is None:
        what = "arguments (model, optimizer, *batch)" if torch else \
            "example arguments (ShapeDtypeStructs are fine)"
        raise FlintError(f"{target.split(':')[0]} defines no {args_fn}() giving the step's "
                         f"{what}")
    if not callable(source):
        args = source
    else:
        try:
            wants_mesh = any(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
                             and (p.name == "mesh" or p.default is p.empty)
                             for p in inspect.signature(source).parameters.values())
        except (TypeError, ValueError):
            wants_mesh = False
        mesh = mesh or ((("dp", 1),) if torch else (("data", 1),))
        if torch:
            context = contextlib.nullcontext(dict(mesh))
        else:
            from flint.frontends.virtual_mesh import virtual_mesh

            context = virtual_mesh(mesh)
        try:
            with context as given:
                args = source(given) if wants_mesh else source()
        except FlintError:
            raise
        except Exception as e:
            axes = [name for name, _ in mesh]
            if wants_mesh and isinstance(e, KeyError) and e.args \
                    and isinstance(e.args[0], str) and e.args[0] not in axes:
                # mesh.shape["fsdp"] on a mesh without that axis: name the flag to change
                raise FlintError(f"{args_fn}() reads mesh axis {e.args[0]!r}, which the mesh "
                                 f"does not have (axes: {', '.join(axes)}); name it in "
                                 f"--mesh") from None
            raise FlintError(f"{args_fn}() failed: {type(e).__name__}: "
                             f"{' '.join(str(e).split())[:600]}") from None
    return tuple(args) if isinstance(args, (tuple, list)) else (args,)
