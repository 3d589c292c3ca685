"""An unfused attention core's score path as the framework runs it: Megatron-LM's dropout on
the probabilities and its 2019 eager scale / mask / softmax (passes.score_path), and the
torch twin's eager score path (flint.models.torch_attention.eager_core)."""
from __future__ import annotations

import pytest
from conftest import run_cli

from flint.errors import FlintError
from flint.run import TrainingRun

GPT = {"base": "gpt3-6.7b", "layers": 2, "hidden": 256, "heads": 4, "kv_heads": 4,
       "ffn": 1024, "seq": 512, "vocab": 4096}
SEQ, MB, TP = 512, 2, 2
SCORES = MB * (4 // TP) * SEQ * SEQ                   # elements of one call's scores


def _scored(run, tmp_path):
    """The run's stage graph through the passes the engine runs before the score path's,
    then the score path's (None where the engine runs none)."""
    from flint.engine import stage_program
    from flint.passes.expand_loops import ExpandLoops
    from flint.passes.kernel_population import KernelPopulation
    from flint.passes.score_path import ScorePath
    from flint.template_cache import TemplateCache

    template, _ = TemplateCache(tmp_path).get(stage_program(run))
    graph = KernelPopulation(run.framework).run(ExpandLoops().run(template))
    return graph, ScorePath(run.seq_len, SCORES, run.score_path,
                            run.attention_dropout).run(graph)


def _run(**kw):
    return TrainingRun(model=GPT, seq_len=SEQ, devices=2, tp=TP, sp=False, micro_batch=MB,
                       global_batch=MB, remat="none", attention="unfused",
                       hardware="a100-80gb-sxm", **kw)


def test_dropout_adds_one_kernel_each_way_per_call(tmp_path):
    """Megatron's unfused core: the compiled fusions stand for FusedScaleMaskSoftmax, and
    dropout adds native_dropout (scores in, scores and a bool mask out) to each forward and
    native_dropout_backward (scores and the mask in, scores out) to each backward."""
    plain, unchanged = _scored(_run(), tmp_path)
    _, dropped = _scored(_run(attention_dropout=0.1), tmp_path)
    assert unchanged is plain                      # nothing to add: the graph as compiled
    layers = 2
    assert dropped.meta["score_paths"] == 2 * layers
    assert len(dropped.nodes) == len(plain.nodes) + 2 * layers
    fwd = [n for n in dropped.nodes if n.op == "native_dropout"]
    bwd = [n for n in dropped.nodes if n.op == "native_dropout_backward"]
    assert len(fwd) == len(bwd) == layers
    assert fwd[0].bytes_read == 2 * SCORES and fwd[0].bytes_written == 3 * SCORES
    assert bwd[0].bytes_read == 3 * SCORES and bwd[0].bytes_written == 2 * SCORES
    assert {n.meta["kernel_source"] for n in fwd + bwd} == {"eager"}
    # each dropout sits between its softmax and the GEMM that reads the probabilities
    users = dropped.users
    assert all(any(dropped.nodes[u].op_class == "gemm" for u in users[n.id]) for n in fwd)


def test_eager_score_path_replaces_the_compiled_fusions(tmp_path):
    """Megatron-LM 2019: divide, mask multiply, mask subtract and softmax forward; softmax,
    multiply and divide backward, each its own PyTorch kernel."""
    from flint.engine import predict

    _, eager = _scored(_run(score_path="eager"), tmp_path)
    ops = [n.op for n in eager.nodes if n.meta.get("score_path") == "eager"]
    assert ops[:4] == ["div", "mul", "sub", "_softmax"]          # layer 0's forward first
    assert ops.count("_softmax_backward_data") == 2 and ops.count("_softmax") == 2
    softmax = next(n for n in eager.nodes if n.op == "_softmax")
    assert softmax.bytes_read == 3 * 2 * SCORES              # three reads of bf16 scores
    fused = predict(_run(), cache=tmp_path)
    dropped = predict(_run(attention_dropout=0.1), cache=tmp_path)
    eager_p = predict(_run(score_path="eager", attention_dropout=0.1), cache=tmp_path)
    assert fused.step_time_s < dropped.step_time_s < eager_p.step_time_s
    assert fused.program_key == dropped.program_key == eager_p.program_key


@pytest.mark.parametrize("fields, words", [
    ({"attention": "flash", "attention_dropout": 0.1}, "attention_dropout"),
    ({"framework": "xla", "attention_dropout": 0.1}, "attention_dropout"),
    ({"score_path": "eager", "framework": "torch-eager", "tp": 1, "devices": 1},
     "score_path: eager"),
    ({"score_path": "eager", "attention": "flash"}, "score_path: eager"),
    ({"attention_dropout": 0.1, "cp": 2, "devices": 4}, "cp 2"),
])
def test_what_cannot_apply_is_one_line(fields, words):
    base = dict(model=GPT, seq_len=SEQ, devices=2, tp=2, sp=False, micro_batch=MB,
                global_batch=MB, attention="unfused", hardware="a100-80gb-sxm")
    base.update(fields)
    with pytest.raises(FlintError, match=words):
        TrainingRun(**base)


def test_a_graph_without_the_score_path_is_refused(tmp_path):
    """Asked for kernels it cannot place, the pass says so instead of pricing without them."""
    from flint.passes.score_path import ScorePath

    graph, _ = _scored(_run(), tmp_path)
    with pytest.raises(FlintError, match="no attention call's GEMM writes S x S scores"):
        ScorePath(SEQ, SCORES * 2, "fused", 0.1).run(graph)


def test_torch_twin_runs_the_eager_score_path():
    """One aten op per step, scores and probabilities in bf16 (autocast off around them,
    as Megatron-LM 2019's half model), the GPU's fused dropout with a bool mask."""
    import flint.torch as ft

    graph = ft.zoo("tiny", 1, (("data", 1),), seq_len=64, hardware="a100-80gb-sxm",
                   fuse=False, attention="eager", attention_dropout=0.1)
    ops = {n.op: n for n in graph.nodes if "attention" in str(n.meta.get("scope", ""))}
    assert "_scaled_dot_product_flash_attention_for_cpu" not in ops
    assert {"div", "mul", "sub", "_softmax", "native_dropout",
            "native_dropout_backward", "_softmax_backward_data"} <= set(ops)
    assert ops["_softmax"].outputs[0].startswith("bf16[")
    assert ops["native_dropout"].outputs[1].startswith("pred[")


def test_cli_prices_a_torch_run_on_a_v100(tmp_path, monkeypatch):
    """Volta has no fused attention: a torch run there runs the twin's eager core (it was
    refused before the twin had one), and the report says so."""
    monkeypatch.setenv("FLINT_CACHE", str(tmp_path))
    code, out, err = run_cli(["predict", "--model", "tiny", "--seq-len", "64", "--devices", "8",
                              "--hardware", "v100-sxm2", "--framework", "torch-eager",
                              "--zero", "0", "--attention-dropout", "0.1"])
    assert code == 0, err
    assert "score path" in out and "dropout 0.1" in out
    code, _, err = run_cli(["predict", "--model", "tiny", "--seq-len", "64", "--devices", "8",
                            "--score-path", "eager", "--attention", "flash"])
    assert code == 2 and "score_path" in err and err.count("\n") == 1, err


def test_extract_takes_the_twin_s_unfused_core(tmp_path):
    """`flint extract --framework torch --attention unfused --attention-dropout P` (README);
    the JAX zoo, whose unfused core is compiled by XLA, refuses the dropout in one line."""
    from flint.graph import WorkloadGraph

    out = tmp_path / "g.json"
    code, _, err = run_cli(["extract", "--framework", "torch", "--model", "tiny", "--devices",
                            "1", "--seq-len", "64", "--attention", "unfused",
                            "--attention-dropout", "0.1", "--out", str(out)])
    assert code == 0, err
    ops = {n.op for n in WorkloadGraph.load(out).nodes}
    assert {"native_dropout", "_softmax", "bmm"} <= ops
    code, _, err = run_cli(["extract", "--model", "tiny", "--devices", "1", "--attention",
                            "unfused", "--attention-dropout", "0.1"])
    assert code == 2 and "--attention-dropout" in err and err.count("\n") == 1, err


def test_nodes_the_compiler_put_inside_a_path_run_in_order():
    """Between a path's first and last node: one that reads the path and feeds it is part
    of it (a reduction's reciprocal the normalization reads); one that only reads it runs
    after the chain; one that neither reads nor feeds it stays where it was."""
    from types import SimpleNamespace

    from flint.passes.score_path import _placed

    inputs = {0: [], 1: [0], 2: [1], 3: [1], 4: [0], 5: [2, 4], 6: [5, 3]}
    graph = SimpleNamespace(nodes=[SimpleNamespace(inputs=inputs[i], control=[])
                                   for i in range(7)])
    users = {i: [j for j, ins in inputs.items() if i in ins] for i in inputs}
    assert _placed(graph, users, [1, 5]) == ([1, 2, 5], [3])
