"""Schema checking at Flint's input boundaries, with pydantic.

Each boundary declares its schema once (flint/graph_schema.py for graph JSON,
hardware_models/spec_schema.py for spec YAML and --set, flint/sweep_space.py for sweep
spaces, flint/frontends/chakra.py for Flint's Chakra records, flint/validate/trace_events.py
for trace events) and calls `validated(Model, data, where)`: the data, or one FlintError
line naming the file, the field path, the problem and, for a misspelt key, the nearest known
key.

    class Point(Strict):
        x: PositiveInt
    validated(Point, {"y": 1}, "p.yaml")
    # FlintError: p.yaml: unknown key 'y' (did you mean 'x'?)
"""
from __future__ import annotations

import difflib
import re
import typing
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, Strict as StrictFlag, ValidationError

from flint.errors import FlintError


class Strict(BaseModel):
    """A record with no unknown keys; fields use the strict types below (no "12" for 12)."""

    model_config = ConfigDict(extra="forbid", frozen=True)


# Strict scalars: JSON/YAML numbers only (an int is a fine float; a bool is no number).
Int = Annotated[int, StrictFlag()]
NonNegInt = Annotated[int, StrictFlag(), Field(ge=0)]
PositiveInt = Annotated[int, StrictFlag(), Field(gt=0)]
Number = Annotated[float, StrictFlag(), Field(allow_inf_nan=False)]
NonNegNumber = Annotated[float, StrictFlag(), Field(ge=0, allow_inf_nan=False)]
PositiveNumber = Annotated[float, StrictFlag(), Field(gt=0, allow_inf_nan=False)]
Str = Annotated[str, StrictFlag()]
Bool = Annotated[bool, StrictFlag()]


def validated(model: type[BaseModel], data: Any, where: str):
    """`model.model_validate(data)`, or a one-line FlintError starting with `where`."""
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise FlintError(f"{where}: {describe(e, model)}") from None
    except RecursionError:
        raise FlintError(f"{where}: nested too deeply") from None


def describe(e: ValidationError, model: type[BaseModel]) -> str:
    """The first problem of a ValidationError as words (and how many more there are)."""
    errors = e.errors(include_url=False)
    # A union (one value or a list of them) reports every member's failure: the deepest
    # one is the member the input was meant as.
    first = max(errors, key=lambda err: len(err.get("loc", ())))
    loc = tuple(first.get("loc", ()))
    path = location(loc[:-1] if first["type"] == "extra_forbidden" else loc)
    if first["type"] == "extra_forbidden":
        key = str(loc[-1]) if loc else "?"
        text = f"unknown key {key!r}" + (f" in {path}" if path else "")
        text += did_you_mean(key, _fields_at(model, loc[:-1]))
    elif first["type"] == "missing":
        text = f"missing {path}"
    elif first["type"] == "value_error":
        text = f"{path or 'value'}: {first['msg'].removeprefix('Value error, ')}"
    else:
        value = _short(first.get("input"))
        msg = re.sub(r" or instance of \w+", "", first["msg"]).rstrip(".")
        text = f"{path or 'value'}: {msg}" + (f", got {value}" if value else "")
    more = len({location(tuple(err.get("loc", ()))[:1]) for err in errors}) - 1
    return text + (f" (and {more} more problem{'s' * (more > 1)})" if more else "")


_UNION_TAG = re.compile(r"^(_\w+|str|int|float|bool|dict|list|tuple|none|constrained-\w+|"
                        r"\w+\[.*\]|(function|tagged|union|json|literal)[-\w]*(\[.*)?)$")


def location(loc: tuple) -> str:
    """('nodes', 3, 'flops') -> 'nodes[3].flops' (pydantic's union-member tags left out)."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif _UNION_TAG.match(str(part)):
            continue
        else:
            out += ("." if out else "") + str(part)
    return out


def did_you_mean(word: str, known) -> str:
    close = difflib.get_close_matches(str(word), sorted(known), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else \
        (f" (known: {', '.join(sorted(known))})" if known and len(known) <= 24 else "")


def _fields_at(model, loc: tuple) -> list[str]:
    """Field names of the (sub)model that `loc` points into."""
    current: Any = model
    for part in loc:
        if isinstance(part, int) or current is None:
            continue
        fields = getattr(current, "model_fields", None)
        if fields is None or part not in fields:
            current = None
            break
        current = _model_in(fields[part].annotation)
    fields = getattr(current, "model_fields", None)
    return list(fields) if fields else []


def _model_in(annotation):
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def _short(value) -> str:
    if isinstance(value, (dict, list)) and len(value) > 3:
        return type(value).__name__
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
