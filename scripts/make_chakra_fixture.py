"""Regenerate tests/data/chakra/torch_mlp.0.et: a real output of Chakra's PyTorch converter.

A two-layer MLP training step (forward, backward, gloo all-reduce of the gradients, SGD)
runs on the CPU under torch.profiler's ExecutionTraceObserver; `chakra_converter PyTorch`
(mlc-chakra) converts the host execution trace. Linking a Kineto device trace first
(`chakra_trace_link`) needs et_replay, which is not on PyPI, so the nodes are host-side
operators with no recorded durations.

    pip install torch==2.13.0 && python scripts/make_chakra_fixture.py
"""
import os
import subprocess
import sys
import tempfile
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "tests" / "data" / "chakra" / "torch_mlp.0.et"


def main() -> None:
    import torch
    import torch.distributed as dist
    from torch.profiler import ExecutionTraceObserver

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    dist.init_process_group("gloo", rank=0, world_size=1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(),
                                torch.nn.Linear(128, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(32, 64), torch.randint(0, 10, (32,))

    def step():
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
        opt.step()

    step()  # warm-up, not traced
    with tempfile.TemporaryDirectory() as tmp:
        host = Path(tmp) / "host_et.json"
        et = ExecutionTraceObserver()
        et.register_callback(str(host))
        et.start()
        step()
        et.stop()
        et.unregister_callback()
        dist.destroy_process_group()
        OUT.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "chakra.src.converter.converter", "--log-filename",
                        str(Path(tmp) / "debug.log"), "PyTorch", "--input", str(host),
                        "--output", str(OUT)], check=True)
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
