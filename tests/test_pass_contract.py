"""The pass contract: every graph pass is a frozen dataclass in the registry with a class-level
name, options convert by type hint (units included), the graph is checked after every
pass, and the pipeline that ran is recorded on the graph and prints back to its string."""
import dataclasses
import typing

import pytest

from flint.cluster import Cluster
from flint.errors import FlintError
from flint.models.synthetic import uniform_layers
from flint.passes import parse_pipeline, pipeline_text, registry, run_pipeline


def test_every_pass_is_registered_with_a_class_level_name():
    passes = registry()
    assert {"fuse-pointwise", "collapse-attention", "expand-loops", "pipeline", "place",
            "layer-template", "rescale", "anonymize"} <= set(passes)
    for name, cls in passes.items():
        assert cls.name == name and dataclasses.is_dataclass(cls)
        assert cls.__dataclass_params__.frozen, name
        assert "name" not in {f.name for f in dataclasses.fields(cls)}, name
        assert typing.get_type_hints(cls)["name"] == typing.ClassVar[str], name


def test_options_convert_by_type_hint_with_units():
    (place,) = parse_pipeline("place{devices=4,memory_limit=40GB}")
    assert place.devices == 4 and place.memory_limit == 40e9
    (place,) = parse_pipeline("place{memory_limit=64GiB}")
    assert place.memory_limit == 64 * 2**30
    for bad, says in [("place{memory_limit=40}", "no unit"),
                      ("place{memory_limit=40Gb/s}", "memory_limit"),
                      ("place{cost_model=x}", "no option"),
                      ("expand-loops{max_nodes=1.5}", "bad value"),
                      ("fuse-pointwise{x=1}", "no option")]:
        with pytest.raises(FlintError, match=says):
            parse_pipeline(bad)


@pytest.mark.parametrize("text", [
    "expand-loops{max_nodes=1000},fuse-pointwise",
    "place{algorithm=m-etf,devices=4,memory_limit=40GB}",
    "pipeline{stages=2,microbatches=4,schedule=gpipe,split=time,hardware=h100-sxm}",
    "anonymize{perturb=0.05,seed=7},layer-template{layers=4}"])
def test_pipeline_prints_back_to_a_string_that_parses_to_the_same_passes(text):
    passes = parse_pipeline(text)
    assert parse_pipeline(pipeline_text(passes)) == passes


def test_run_pipeline_records_what_ran_and_checks_each_output():
    graph = uniform_layers(4, Cluster(1, (("data", 1),), "h100-sxm"))
    text = "expand-loops,pipeline{stages=2,microbatches=2}"
    out = run_pipeline(graph, parse_pipeline(text))
    assert out.meta["passes"] == text
    assert parse_pipeline(out.meta["passes"]) == parse_pipeline(text)

    @dataclasses.dataclass(frozen=True)
    class Corrupting:
        name: typing.ClassVar[str] = "corrupting"

        def run(self, g):
            g.nodes[0].inputs.append(1)      # a dependency that points forwards
            return g

    with pytest.raises(FlintError, match="after pass 'corrupting'.*depends on"):
        run_pipeline(uniform_layers(2, Cluster(1, (("data", 1),), "h100-sxm")), [Corrupting()])
