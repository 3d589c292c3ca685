"""Warnings for ambiguous programs (issue "No silent wrong answers", item 3), each one
line: f32 GEMMs in a step that asks for mixed precision, a data-parallel axis with no
gradient reduction, a sequence length taken from a config's maximum; and the torch path's
stderr holding only Flint's own lines (no native library noise)."""
import json

import pytest

torch = pytest.importorskip("torch")


class _HeadOutsideAutocast(torch.nn.Module):
    """Blocks in bf16 under autocast; the big LM head called after the region closed."""

    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.Sequential(*(torch.nn.Linear(256, 256) for _ in range(2)))
        self.head = torch.nn.Linear(256, 8192, bias=False)

    def forward(self, x):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            h = self.blocks(x)
        return self.head(h.float())


def _ddp(model, mesh):
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel(model, process_group=mesh.get_group())


def test_f32_gemms_under_mixed_precision_warn_with_the_culprit():
    import flint.torch as ft
    from flint.frontends.program_checks import ProgramWarning

    with pytest.warns(ProgramWarning) as caught:
        graph = ft.extract(_HeadOutsideAutocast, (torch.empty(64, 256, device="meta"),),
                           world_size=8, mesh={"dp": 8}, parallelize=_ddp)
    text = [str(w.message) for w in caught]
    assert len(text) == 1 and "float32" in text[0] and "head" in text[0]
    assert "autocast cuda:bfloat16" in text[0]
    assert graph.meta["program_warnings"] == text


def test_data_parallel_axis_without_gradient_reduction_warns():
    import torch.nn as nn

    import flint.torch as ft
    from flint.frontends.program_checks import ProgramWarning

    with pytest.warns(ProgramWarning, match="mesh axis dp .8 ways. is data-parallel"):
        ft.extract(lambda: nn.Linear(64, 64), (torch.empty(16, 64, device="meta"),),
                   world_size=8, mesh={"dp": 8})
    import warnings

    with warnings.catch_warnings():     # wrapped in DDP: reduced, nothing to say
        warnings.simplefilter("error", ProgramWarning)
        ft.extract(lambda: nn.Linear(64, 64), (torch.empty(16, 64, device="meta"),),
                   world_size=8, mesh={"dp": 8}, parallelize=_ddp)


def test_sequence_length_from_a_config_maximum_warns(tmp_path):
    import flint.torch as ft
    from flint.frontends.program_checks import ProgramWarning

    config = tmp_path / "config.json"
    config.write_text(json.dumps({
        "model_type": "llama", "hidden_size": 128, "intermediate_size": 256,
        "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2,
        "vocab_size": 512, "max_position_embeddings": 256}))
    with pytest.warns(ProgramWarning, match="max_position_embeddings"):
        graph = ft.zoo(str(config), 8, {"fsdp": 8})
    assert graph.meta["training"]["seq_len"] == 256
    from conftest import run_cli

    code, _, err = run_cli(["extract", "--model", config, "--devices", "8"])
    assert code == 2 and err.count("\n") == 1 and "--seq-len" in err


def test_torch_cli_prints_only_flint_lines_on_stderr():
    """No CUDA-plugin or absl lines ("Could not find cuda drivers") before Flint's own,
    in a fresh process as a user runs it; a warning is one `flint: warning:` line."""
    from conftest import run_flint

    r = run_flint("extract", "--framework", "torch", "--model", "tiny", "--devices", "8",
                  "--layers", "1", "--seq-len", "64", "--mesh", "data=8", "--json")
    assert r.returncode == 0, r.stderr
    assert all(line.startswith("flint: ") for line in r.stderr.splitlines()), r.stderr
    bad = run_flint("extract", "--framework", "torch", "--model", "no-such-model")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1, bad.stderr
