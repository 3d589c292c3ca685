"""Build the small graphs tests/test_astra_sim.py runs through ASTRA-sim, in one process
(one JAX start for every zoo model at both sizes): python tests/astra_sim_graphs.py OUT

Every zoo model with 2 layers (1 for the 70B) and sequence length 256 at 8 ranks (default
zoo mesh), and the torch twin of llama3-8b (2 layers) at 8 ranks; the tests rescale them
to 64 ranks (passes.rescale, weak scaling of the data-parallel axis)."""
import sys
from pathlib import Path

ZOO = {"gpt2-small": 2, "llama3-8b": 2, "llama3-70b": 1, "tiny": None, "mlp": None}
SIZES = (8,)


def main(out: Path) -> None:
    from flint.frontends.targets import prepare_environment

    prepare_environment()        # compile-only H100s, as the CLI does
    from flint.frontends import ExtractRequest, extract

    for model, layers in ZOO.items():
        for n in SIZES:
            # TP=8 as when these tolerances were set (the default mesh now keeps TP to a
            # divisor of the heads: GPT-2's 12 would get TP=4)
            graph, _ = extract(ExtractRequest(devices=n, mesh=f"fsdp={n // 8},model=8",
                                              model=model, layers=layers, seq_len=256))
            graph.save(out / f"{model}.{n}.json")
    import flint.torch as ft

    for n in SIZES:
        ft.zoo("llama3-8b", world_size=n, seq_len=256, layers=2).save(out / f"torch.{n}.json")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
