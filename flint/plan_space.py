"""What `flint plan` searches: every layout of one model on a cluster that can run, before
any pricing.

    request = PlanRequest(model="llama3-70b", devices=(1024,), seq_len=8192,
                          global_batch=1024, hardware="h100-sxm")
    space = enumerate_space(request)      # space.candidates, space.counts

A candidate is a TrainingRun's layout fields (tp, cp, pp, vp, ep, zero/hsdp, micro-batch,
remat, precision) on top of the request's fixed fields (model, devices, sequence, global
batch, spec). Candidates are checked here with the same divisibility rules as
flint.run_checks (tests/test_plan.py holds the two to the same verdicts) but without
building a TrainingRun each (building one validates the model and the spec: ~15 ms, too
slow for tens of thousands), so only the candidates that get priced become runs.

The planner's default values per axis (each rule overridable by giving the axis' values):
- tp: divisors of the device count, at most the spec's scale-up domain (tensor
  parallelism moves every layer's activations: outside NVLink it never pays), with
  sequence parallelism on (Megatron-Core's default with TP);
- cp: 1 and powers of two up to 32 that leave each rank >= 1024 tokens of the sequence
  (two load-balanced chunks of >= 512: below that a rank's attention blocks are too few
  to hide the key/value exchange);
- pp: divisors of devices / (tp x cp) up to the layer count; vp: 1..16 chunks per stage,
  pp x vp <= layers (interleaved 1F1B needs micro-batches divisible by pp);
- ep (MoE only): powers of two dividing the expert count and the data-parallel ranks;
- zero: 1 (Megatron's distributed optimizer) and 3 (FSDP over all data-parallel ranks);
- micro_batch: 1, 2, 4, 8; remat: none, selective, full; precision: bf16 unless allowed.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import asdict, dataclass, fields
from typing import Optional

from flint.errors import FlintError

DEFAULT_REMATS = ("none", "selective", "full")
DEFAULT_MICRO_BATCHES = (1, 2, 4, 8)
DEFAULT_ZERO = (1, 3)
MAX_VP = 16
MAX_CP = 32
MIN_CP_TOKENS = 1024
# Layout axes a user may pin (`--tp 8`, `--zero 1,3`, ...): the rest follow the rules above.
AXES = ("tp", "cp", "pp", "vp", "ep", "zero", "hsdp", "micro_batch", "remat", "precision")
MAX_CANDIDATES = 2_000_000       # before pruning: a bound on the work of one plan


@dataclass(frozen=True)
class PlanRequest:
    """What to plan: the fixed fields of every candidate run and the axes' allowed
    values (None: the planner's rule). `global_batch` in sequences."""

    model: object                       # as TrainingRun.model (a name, path or mapping)
    devices: tuple
    seq_len: int
    global_batch: int
    hardware: str = "h100-sxm"
    devices_per_host: int = 0
    dispatcher: str = "alltoall"
    framework: str = "megatron"
    routing: str = "balanced"
    what_if: tuple = ()                 # spec overrides every candidate is priced under
    tp: Optional[tuple] = None
    cp: Optional[tuple] = None
    pp: Optional[tuple] = None
    vp: Optional[tuple] = None
    ep: Optional[tuple] = None
    zero: Optional[tuple] = None
    hsdp: Optional[tuple] = None
    micro_batch: Optional[tuple] = None
    remat: Optional[tuple] = None
    precision: tuple = ("bf16",)

    def with_(self, **changes) -> "PlanRequest":
        from dataclasses import replace

        return replace(self, **changes)

    def to_json(self) -> dict:
        d = asdict(self)
        d["model"] = dict(self.model) if isinstance(self.model, tuple) else self.model
        return {k: list(v) if isinstance(v, tuple) else v for k, v in d.items()}


@dataclass(frozen=True, order=True)
class Candidate:
    """One layout of the request on `devices` devices."""

    devices: int
    tp: int
    cp: int
    pp: int
    vp: int
    ep: int
    zero: int
    hsdp: int
    micro_batch: int
    remat: str
    precision: str

    @property
    def dp(self) -> int:
        return self.devices // (self.tp * self.cp * self.pp)

    def microbatches(self, global_batch: int) -> int:
        return global_batch // (self.dp * self.micro_batch)

    def run_fields(self, request: PlanRequest) -> dict:
        """The TrainingRun fields of this candidate (TrainingRun.from_json takes them)."""
        return {"model": dict(request.model) if isinstance(request.model, tuple)
                else request.model, "devices": self.devices, "seq_len": request.seq_len,
                "hardware": request.hardware, "devices_per_host": request.devices_per_host,
                "tp": self.tp, "sp": self.tp > 1, "cp": self.cp, "pp": self.pp, "vp": self.vp,
                "schedule": "interleaved" if self.vp > 1 else "1f1b", "ep": self.ep,
                "dispatcher": request.dispatcher, "zero": self.zero, "hsdp": self.hsdp,
                "micro_batch": self.micro_batch, "global_batch": request.global_batch,
                "remat": self.remat, "precision": self.precision,
                "framework": request.framework, "routing": request.routing}

    def run(self, request: PlanRequest):
        from flint.run import TrainingRun

        return TrainingRun.from_json(self.run_fields(request), "plan candidate")

    def program_signature(self, request: PlanRequest, devices_per_node: int) -> tuple:
        """What the stage program (flint.stage.stage_program) depends on, computed
        without building the run: runs with one signature share one compile."""
        rest = self.dp // self.ep
        if self.zero == 3:
            shard = self.hsdp or rest
            data = ((rest // shard), shard)
        else:
            data = (min(rest, 2),)     # flint.stage.COMPILED_DATA replicas are compiled
        stage = math.prod(data) * self.ep * self.cp * self.tp
        return (self.tp, self.cp, self.ep, self.zero == 3, data, self.micro_batch,
                self.remat, self.precision, min(request.devices_per_host or devices_per_node,
                                                stage))

    def short(self) -> str:
        """The layout in a few words (tables and the why)."""
        parts = [f"tp{self.tp}"] + [f"{k}{v}" for k, v in (
            ("cp", self.cp), ("pp", self.pp), ("vp", self.vp), ("ep", self.ep)) if v > 1]
        parts.append(f"dp{self.dp}")
        parts.append(("fsdp" if self.zero == 3 else f"zero{self.zero}")
                     + (f"/hsdp{self.hsdp}" if self.hsdp else ""))
        parts += [f"mb{self.micro_batch}", self.remat, self.precision]
        return " ".join(parts)

    def key(self) -> tuple:
        return tuple(getattr(self, f.name) for f in fields(self))


@dataclass
class Space:
    candidates: list            # valid Candidates, in a fixed order
    counts: dict                # raw, invalid (by reason), valid
    rejected: dict              # reason -> count


def model_config(request: PlanRequest):
    from flint.models.describe import resolve_model

    spec = dict(request.model) if isinstance(request.model, tuple) else request.model
    try:
        return resolve_model(spec).with_(seq_len=request.seq_len)
    except FlintError as e:
        raise FlintError(f"model: {e}") from None


def enumerate_space(request: PlanRequest) -> Space:
    """Every candidate of the request that passes the divisibility rules, with counts."""
    from flint.hardware_models.spec import load_spec

    cfg = model_config(request)
    spec = load_spec(request.hardware, list(request.what_if))
    _check_request(request, cfg, spec)
    rejected: dict[str, int] = {}
    out: list[Candidate] = []
    raw = 0
    for devices in request.devices:
        axes = _axes(request, cfg, spec, devices)
        raw += math.prod(len(v) for v in axes.values())
        if raw > MAX_CANDIDATES:
            raise FlintError(f"plan: more than {MAX_CANDIDATES} candidates before pruning; "
                             f"pin some axes (--tp, --pp, ...)")
        for values in itertools.product(*axes.values()):
            c = dict(zip(axes, values))
            why = invalid_reason(request, cfg, devices, c)
            if why:
                rejected[why] = rejected.get(why, 0) + 1
                continue
            out.append(Candidate(devices=devices, **c))
    counts = {"raw": raw, "invalid": raw - len(out), "valid": len(out)}
    return Space(out, counts, rejected)


def _check_request(request: PlanRequest, cfg, spec) -> None:
    if not request.devices:
        raise FlintError("plan: no device count")
    if request.global_batch < 1:
        raise FlintError("plan: global batch must be at least one sequence")
    from flint.run_checks import check_precision

    for precision in request.precision:
        check_precision(precision, spec)
    for name in ("ep",):
        values = getattr(request, name)
        if values and any(v > 1 for v in values) and not cfg.n_experts:
            raise FlintError(f"ep: {cfg.name} has no experts to shard")


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _powers_of_two(top: int) -> list[int]:
    out, v = [], 1
    while v <= top:
        out.append(v)
        v *= 2
    return out


def _axes(request: PlanRequest, cfg, spec, devices: int) -> dict:
    """Each axis' values for one device count (the request's, else the rule)."""
    def given(name, rule):
        v = getattr(request, name)
        return tuple(v) if v else tuple(rule)

    tp = given("tp", [d for d in _divisors(devices) if d <= spec.scale_up_domain])
    cp = given("cp", [c for c in _powers_of_two(MAX_CP) if c == 1 or
                      request.seq_len // c >= MIN_CP_TOKENS])
    pp = given("pp", [d for d in _divisors(devices) if d <= cfg.n_layers])
    vp = given("vp", range(1, MAX_VP + 1))
    ep = given("ep", _powers_of_two(cfg.n_experts) if cfg.n_experts else [1])
    zero = given("zero", DEFAULT_ZERO)
    hsdp = given("hsdp", [0])
    mb = given("micro_batch", DEFAULT_MICRO_BATCHES)
    remat = given("remat", DEFAULT_REMATS)
    return {"tp": tp, "cp": cp, "pp": pp, "vp": vp, "ep": ep, "zero": zero, "hsdp": hsdp,
            "micro_batch": mb, "remat": remat, "precision": tuple(request.precision)}


def invalid_reason(request: PlanRequest, cfg, devices: int, c: dict) -> str:
    """Why a layout cannot run ("" if it can): flint.run_checks' rules, in its order."""
    tp, cp, pp, vp, ep = c["tp"], c["cp"], c["pp"], c["vp"], c["ep"]
    per = tp * cp * pp
    if devices % per:
        return "devices do not split into tp x cp x pp"
    dp = devices // per
    if dp % ep:
        return "ep does not divide the data-parallel ranks"
    if c["hsdp"]:
        if c["zero"] == 0:
            return "hsdp needs a sharded optimizer (zero 1/2) or FSDP (zero 3)"
        if (dp // ep) % c["hsdp"]:
            return "hsdp does not divide the data-parallel ranks"
    if request.global_batch % (dp * c["micro_batch"]):
        return "global batch is not a multiple of dp x micro-batch"
    if cp > 1 and request.seq_len % (2 * cp):
        return "sequence does not split into 2 x cp chunks"
    if pp * vp > cfg.n_layers:
        return "pp x vp exceeds the layers"
    if vp > 1:
        if pp < 2:
            return "virtual stages need pp > 1"
        if (request.global_batch // (dp * c["micro_batch"])) % pp:
            return "interleaved 1F1B needs micro-batches divisible by pp"
    for n in (cfg.n_heads, cfg.n_kv_heads, cfg.d_ff, cfg.vocab):
        if n % tp:
            return "tp does not divide the heads, FFN or vocabulary"
    if ep > 1 and not cfg.n_experts:
        return "ep without experts"
    if cfg.n_experts and cfg.n_experts % ep:
        return "ep does not divide the experts"
    return ""
