"""How the published tables are read: the ```csv blocks of a markdown file, the names tables
give the columns the harness reads (COLUMN_ALIASES, display headers such as `# GPUs` or
`Throughput (T/s/GPU)`), the published figure a row gives as seconds per step, and what
a row states in words (its sharding, its overlaps). scripts/published_rows.py turns the
rows into runs."""
from __future__ import annotations

import csv
import io
import re
from pathlib import Path


def first_number(cell) -> float | None:
    m = re.match(r"\s*([\d.]+)", str(cell or ""))
    return float(m.group(1)) if m else None


# other names tables give the columns the harness reads (lowercase, "_" for spaces/dashes)
COLUMN_ALIASES = {
    "gpus": ("num_gpus", "n_gpus", "gpu_count", "total_gpus", "number_of_gpus", "world_size"),
    "tp": ("tensor_parallel", "tensor_parallel_size", "tp_size", "tensor_model_parallel_size"),
    "pp": ("pipeline_parallel", "pipeline_parallel_size", "pp_size",
           "pipeline_model_parallel_size"),
    "cp": ("context_parallel", "context_parallel_size", "cp_size"),
    "vp": ("vpp", "virtual_pipeline", "virtual_pipeline_model_parallel_size"),
    "mbs": ("micro_batch_size", "micro_batch", "microbatch", "microbatch_size",
            "local_batch", "batch_per_gpu", "per_gpu_batch"),
    "gbs": ("global_batch_size", "global_batch"),    # a bare "batch size" may be per GPU
    "seq": ("seq_len", "seq_length", "sequence_length", "context_length"),
    "precision": ("dtype", "mixed_precision", "data_type"),
    "system": ("gpu", "gpu_type", "accelerator", "device"),
    "layers": ("num_layers", "n_layers"), "hidden": ("hidden_size", "d_model"),
    "heads": ("attention_heads", "num_attention_heads", "n_heads"),
    "kv_heads": ("num_query_groups", "n_kv_heads"), "ffn": ("ffn_hidden_size", "d_ff"),
    "vocab": ("vocab_size",),
    # LoRA fine-tuning's adapters, as fine-tuning tables and configs name them
    "lora_rank": ("lora_dim", "adapter_dim", "lora_r", "peft_dim"),
    "lora_targets": ("target_modules", "lora_target_modules"),
    # the published figure (STEP_FIGURES) under benchmark tables' names
    "tok_s_gpu": ("throughput_t_s_gpu", "throughput_tokens_s_gpu", "tokens_s_gpu",
                  "tokens_sec_gpu", "tokens_per_sec_per_gpu"),
    "tokens_s": ("throughput_t_s", "tokens_sec"),
    "samples_s": ("throughput_s_s", "throughput_samples_s", "samples_sec"),
    "step_time_s": ("step_time", "iteration_time", "time_per_step_s", "sec_per_step"),
}
_ALIAS = {alias: name for name, aliases in COLUMN_ALIASES.items() for alias in aliases}


def column_keys(name: str) -> tuple[str, ...]:
    """The snake_case keys a column header may mean, most specific first: `# GPUs` ->
    num_gpus, `MicroBatchSize` -> micro_batch_size, `Throughput (T/s/GPU)` ->
    throughput_t_s_gpu, `SeqLen (T)` -> seq_len_t, then seq_len (a unit in parentheses
    dropped)."""
    text = str(name).strip().replace("#", " num ")
    text = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", text)      # camelCase -> camel_Case
    full = re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_")
    bare = re.sub(r"[^a-z0-9]+", "_", re.sub(r"\(.*?\)", " ", text).lower()).strip("_")
    return (full, bare) if bare and bare != full else (full,)


def with_aliases(record: dict) -> dict:
    """`record` plus each column under its snake_case key (column_keys) and, under the
    harness's names, the columns a table names otherwise (a column of the harness's own
    name wins)."""
    out = dict(record)
    for key, value in record.items():
        out.setdefault(column_keys(key)[0], value)
    for key, value in record.items():
        for k in column_keys(key):
            name = _ALIAS.get(k) or (k if k in COLUMN_ALIASES or k in _FIGURE_NAMES else None)
            if name:
                if name not in record:
                    out.setdefault(name, value)
                break
    return out


def tables(path: Path):
    """(heading, rows as dicts) for every ```csv block, other names of the columns the
    harness reads added under its own (with_aliases)."""
    heading, lines, out = "", path.read_text().splitlines(), []
    i = 0
    while i < len(lines):
        if lines[i].startswith("#"):
            heading = lines[i].lstrip("# ").strip()
        if lines[i].strip() == "```csv":
            j = i + 1
            while lines[j].strip() != "```":
                j += 1
            out.append((heading, [with_aliases(r) for r in csv.DictReader(
                io.StringIO("\n".join(lines[i + 1:j])))]))
            i = j
        i += 1
    return out


# the published figure, under the names tables give it: (columns, seconds per step from
# the value); per-GPU and whole-cluster token rates, sequence rates, step times in s or ms
STEP_FIGURES = (
    (("step_time_s", "step_s_median", "step_s", "iter_s_seqpar+selective", "iter_time_s",
      "iteration_time_s", "seconds_per_iteration",
      # a table's own conversion of a TFLOP/s figure under the FLOP count of the code that
      # printed it (published.md 2a: MaxText's 2023 calculate_training_tflops)
      "derived_step_s"), lambda v, row: v),
    (("step_time_ms", "iter_time_ms", "iteration_time_ms", "elapsed_time_per_iteration_ms"),
     lambda v, row: v / 1e3),
    (("tok_s_gpu", "tokens_s_device", "tokens_s_per_gpu", "tokens_per_s_per_gpu", "wps",
      "tokens_per_gpu_per_s"), lambda v, row: row.gbs * row.seq / (v * row.gpus)),
    (("tokens_s", "tokens_per_s", "throughput_tokens_s", "tokens_per_second"),
     lambda v, row: row.gbs * row.seq / v),
    (("samples_s", "samples_per_s", "sequences_per_s", "samples_per_second"),
     lambda v, row: row.gbs / v),
)


_FIGURE_NAMES = frozenset(c for columns, _ in STEP_FIGURES for c in columns)


def published_step(r: dict, row) -> float:
    """Seconds per step from the first figure the row gives (0.0: none); `row` (a
    published_rows.Row) gives the batch, sequence and GPUs a rate converts with."""
    for columns, seconds in STEP_FIGURES:
        for c in columns:
            v = first_number(r.get(c))
            if v:
                return seconds(v, row)
    return 0.0


# Megatron-LM's --DDP-impl: torch (PyTorch DistributedDataParallel, whose reducer
# all-reduces each gradient bucket as the backward fills it) or local (megatron/model/
# distributed.py, allreduce_gradients after the backward, from train_step)
DDP_OVERLAP = {"torch": True, "local": False}
YES_NO = {"true": True, "yes": True, "on": True, "false": False, "no": False, "off": False}
# (column, its words' meanings, Row field, why a word it does not know stops the row)
WORD_COLUMNS = (("tp_comm_overlap", YES_NO, "tp_comm_overlap",
                 "tp_comm_overlap {} is not true or false"),
                ("ddp", DDP_OVERLAP, "overlap_grad_reduce",
                 "data-parallel wrapper {} not modelled"))


SHARDING_COLUMN = re.compile(r"shard|zero|fsdp|strateg|data[_ ]parallel|dp[_ ]type", re.I)


def stated_sharding(r: dict) -> dict:
    """The data-parallel flavour a row states in words (PyTorch FSDP's ShardingStrategy,
    DeepSpeed's ZeRO stage, DDP): {} when it states none. FULL_SHARD and ZeRO-3 shard the
    parameters and gather them per layer twice (forward, backward); SHARD_GRAD_OP keeps
    the gathered parameters from forward to backward (FSDP docs: 'parameters are not
    freed after forward'); HYBRID_SHARD does either within a host and all-reduces across
    hosts; ZeRO-2 shards gradients and optimizer, ZeRO-1 the optimizer; NO_SHARD and DDP
    all-reduce the gradients."""
    columns = [c for c in r if c and SHARDING_COLUMN.search(c)]
    text = " ".join(str(r.get(c) or "") for c in columns if first_number(r.get(c)) is None)
    text = re.sub(r"[\s-]+", "_", text.lower())
    stage = next((int(first_number(r[c])) for c in columns if "zero" in c.lower()
                  and first_number(r.get(c)) is not None), None)
    out: dict = {}
    if "no_shard" in text or re.search(r"(^|_)ddp($|_)", text) or stage == 0:
        out["zero"] = 0
    elif "hybrid" in text or "hsdp" in text:
        out.update(zero=3, hybrid=True, reshard_after_forward="zero2" not in text)
    elif "shard_grad_op" in text:
        out.update(zero=3, reshard_after_forward=False)
    elif "full_shard" in text or re.search(r"zero_?3|fsdp", text) or stage == 3:
        out["zero"] = 3
    elif re.search(r"zero_?2", text) or stage == 2:
        out["zero"] = 2
    elif re.search(r"zero_?1|distributed_optimizer", text) or stage == 1:
        out["zero"] = 1
    return out
