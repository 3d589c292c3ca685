"""Profile a torch zoo twin's real training step on this machine's CPU (torch.profiler),
for checking the torch front end against measurements: the same model, batch and
optimizer Flint traces with fake tensors at world size 1."""
from __future__ import annotations

from pathlib import Path


def profile_torch_zoo_step(name: str, out: Path, steps: int = 5, seq_len: int | None = None,
                           layers: int | None = None, seed: int = 0) -> Path:
    """Run `steps` eager training steps of the twin, each inside `ProfilerStep#N`, and
    write the Kineto (Chrome trace) JSON to `out`."""
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    from flint.models.torch_decoder import Decoder, config, cross_entropy

    torch.manual_seed(seed)
    cfg = config(name, seq_len=seq_len, n_layers=layers)
    model = Decoder(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1,
                            foreach=False, fused=False)
    tokens = torch.randint(0, cfg.vocab, (1, cfg.seq_len))
    targets = torch.randint(0, cfg.vocab, (1, cfg.seq_len))
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for i in range(steps):
            with record_function(f"ProfilerStep#{i}"):
                loss = cross_entropy(model(tokens), targets)
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
    prof.export_chrome_trace(str(out))
    return Path(out)
