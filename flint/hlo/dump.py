"""XLA dump directories (`XLA_FLAGS=--xla_dump_to=DIR`): find the optimized module of a
step and what it was compiled for.

A dump holds, per compiled module, `module_NNNN.<name>.before_optimizations.txt` and the
optimized `module_NNNN.<name>.<target>after_optimizations.txt` (`.hlo.pb` with
`--xla_dump_hlo_as_proto`), where <target> is `cpu_`, `sm_9.0a_gpu_` or, from libtpu, a
`cl_NNN.` tag (on both files), beside
buffer-assignment reports, LLVM IR and PTX that Flint does not read. Any JAX/XLA writes
this layout, so a dump of a TPU AOT compile (MaxText's `train_compile.py`) or of a GPU run
on another machine is read as it is; nothing in it is executed.

What the module was compiled for comes from the module itself: the device count from its
`num_partitions` x `replica_count` header and the device ids its collectives name; the mesh
axis names and sizes from the Shardy mesh (`xla.sdy.meshes`) JAX records in the header of
the module before optimization.
"""
from __future__ import annotations

import glob
import re
from dataclasses import dataclass, replace
from pathlib import Path

from flint.errors import FlintError

_AFTER = re.compile(r"after_optimizations\.(txt|hlo\.pb)$")
_MODULE_PREFIX = re.compile(r"^(module_\d+\.[^.]+)\.")
_SDY_MESH = re.compile(r"#sdy\.mesh<\[([^\]]*)\]")
_SDY_AXIS = re.compile(r'"([A-Za-z_]\w*)"\s*=\s*(\d+)')
# A TPU dump does not say which generation compiled it; `--hardware` does, else this.
TPU_DEFAULT = "tpu-v5p"
_HLO_SUFFIXES = (".txt", ".hlo", ".pb", ".hlo.pb", ".xz", ".gz", ".pbtxt")


@dataclass(frozen=True)
class DumpModule:
    """One optimized module of a dump: its file, and the unoptimized sibling if any."""

    path: Path
    name: str                        # the dump's name for it, e.g. module_0003.jit_step
    before: Path | None = None
    size: int = 0                    # instructions (text) or bytes (proto): the ranking
    # the same module as an HloProto beside the text (`--xla_dump_hlo_as_proto`): it also
    # holds XLA's buffer assignment (hlo/buffer_assignment.py)
    proto: Path | None = None


def is_hlo_target(target: str | None) -> bool:
    """Is an `flint extract` TARGET an HLO dump (directory, or a text/proto file), as
    opposed to SCRIPT.py:FUNCTION or a StableHLO .mlir file?"""
    if not target:
        return False
    path, module = split_module(target)
    p = Path(path)
    return p.is_dir() or (p.is_file() and p.name.endswith(_HLO_SUFFIXES)
                          and not p.name.endswith(".py"))


def split_module(target: str) -> tuple[str, str | None]:
    """`DUMP_DIR:MODULE` (module chosen by name) -> (path, module); else (target, None)."""
    head, sep, tail = target.rpartition(":")
    if sep and head and tail and Path(head).is_dir() and not Path(target).exists():
        return head, tail
    return target, None


def dump_modules(directory: Path) -> list[DumpModule]:
    """The optimized modules of a dump directory, text preferred over proto per module."""
    by_name: dict[str, DumpModule] = {}
    for p in sorted(directory.iterdir()):
        m = _AFTER.search(p.name)
        if not m or not p.is_file():
            continue
        prefix = _MODULE_PREFIX.match(p.name)
        name = prefix.group(1) if prefix else p.name[:m.start()].rstrip("._")
        if name in by_name and by_name[name].path.name.endswith(".txt"):
            if not p.name.endswith(".txt"):
                by_name[name] = replace(by_name[name], proto=p)
            continue
        proto = by_name[name].path if name in by_name else None
        by_name[name] = DumpModule(p, name, _sibling_before(p), _size(p),
                                   proto if p.name.endswith(".txt") else None)
    return list(by_name.values())


def _size(path: Path) -> int:
    """Instructions in an HLO text file (lines with ` = `), or a proto's bytes / 64 (about
    one instruction per 64 bytes): the measure 'the train step' is chosen by."""
    if path.name.endswith(".txt"):
        with path.open("rb") as f:
            return sum(1 for line in f if b" = " in line)
    return path.stat().st_size // 64


def choose_module(target: str) -> DumpModule:
    """The module `flint extract DUMP[:MODULE]` reads: a file as given; in a directory the
    module named MODULE (a substring of its dump name), else the train step: the largest
    optimized module (most instructions), which in a training program is the step (the
    others are initializers, RNG and data-placement helpers)."""
    path_text, wanted = split_module(target)
    path = Path(path_text)
    if path.is_file():
        before = _sibling_before(path)
        return DumpModule(path, path.name, before, 0)
    if not path.is_dir():
        raise FlintError(f"HLO dump not found: {path}")
    modules = dump_modules(path)
    if not modules:
        raise FlintError(f"{path} holds no optimized HLO (*after_optimizations.txt or "
                         f"*.hlo.pb): was it written with XLA_FLAGS=--xla_dump_to=... "
                         f"--xla_dump_hlo_as_text?")
    if wanted is not None:
        hits = [m for m in modules if wanted in m.name]
        exact = [m for m in hits if m.name.split(".", 1)[-1] == wanted or m.name == wanted]
        hits = exact or hits
        if len(hits) != 1:
            names = ", ".join(m.name for m in (hits or modules)[:8])
            what = "matches several modules" if hits else "matches no module"
            raise FlintError(f"{path}: {wanted!r} {what}; modules: {names}")
        return hits[0]
    return max(modules, key=lambda m: (m.size, m.name))


def _sibling_before(path: Path) -> Path | None:
    """The same module's unoptimized text: `<prefix>.before_optimizations.txt`, or with a
    tag between (TPU dumps: `module_0000.jit_step.cl_933746096.before_optimizations.txt`)."""
    prefix = _MODULE_PREFIX.match(path.name)
    if not prefix:
        return None
    found = sorted(path.parent.glob(f"{glob.escape(prefix.group(1))}.*before_optimizations.txt"))
    return found[0] if found and found[0] != path else None


def mesh_of_dump(header_texts) -> tuple[tuple[str, int], ...] | None:
    """The Shardy mesh JAX recorded (`#sdy.mesh<["data"=4, "model"=2]>`), from the first
    text that has one; None when the program was partitioned without named axes."""
    for text in header_texts:
        if not text:
            continue
        m = _SDY_MESH.search(text)
        if m:
            axes = tuple((n, int(s)) for n, s in _SDY_AXIS.findall(m.group(1)))
            if axes:
                return axes
    return None


_DEVICE_DESCRIPTION = re.compile(r'device_description_str:\s*"([^"]*)"')


def dump_hardware(module: DumpModule) -> str | None:
    """The compile target a dump names: `cpu_after_optimizations` is the host CPU; a GPU
    module's `gpu_target_config.pbtxt` names the GPU, matched to Flint's GPU targets by
    their device description; TPU HLO (tiled layouts `{1,0:T(8,128)}`) names no
    generation, so it is taken as TPU_DEFAULT. None when the dump does not say."""
    from flint.frontends.targets import GPU_TARGETS_DIR

    name = module.path.name
    if "cpu_after_optimizations" in name:
        return "cpu"
    if name.endswith(".txt") and _has_tpu_layouts(module.path):
        return TPU_DEFAULT
    prefix = _MODULE_PREFIX.match(name)
    config = module.path.parent / f"{prefix.group(1)}.gpu_target_config.pbtxt" if prefix \
        else None
    if config is None or not config.is_file() or config.stat().st_size > 1 << 20:
        return None
    found = _DEVICE_DESCRIPTION.search(config.read_text(errors="replace"))
    if not found:
        return None
    for known in sorted(GPU_TARGETS_DIR.glob("*.pbtxt")):
        m = _DEVICE_DESCRIPTION.search(known.read_text())
        if m and m.group(1) == found.group(1):
            return known.stem
    return None


def _has_tpu_layouts(path: Path, limit: int = 1 << 20) -> bool:
    """TPU HLO prints tiled layouts (`bf16[8,128]{1,0:T(8,128)(2,1)}`); others do not."""
    with path.open("rb") as f:
        return b":T(" in f.read(limit)


def first_line(path: Path | None) -> str:
    """The header line of an HLO text file ('' for none)."""
    if path is None:
        return ""
    with path.open("rb") as f:
        return f.readline(1 << 20).decode(errors="replace")
