"""Front ends: a training step (JAX, PyTorch, StableHLO) or a saved graph -> WorkloadGraph.

    from flint.frontends import ExtractRequest, extract, load_graph
    graph, timings = extract(ExtractRequest(model="llama3-8b", devices=1024))
    graph = load_graph("graph.json")        # or a Chakra .et, or a directory of them
"""
from flint.frontends.request import ExtractRequest, extract
from flint.frontends.saved import load_graph

__all__ = ["ExtractRequest", "extract", "load_graph"]
