"""Convolution flops as XLA's HloCostAnalysis counts them: only kernel taps that land on real
(unpadded, undilated-hole-free) input positions do a multiply-add."""
from __future__ import annotations

from flint.hlo.shapes import Shape


def parse_window(text: str | None) -> list[dict]:
    """`{size=3x3 stride=2x2 pad=1_1x1_1 lhs_dilate=1x1 rhs_dilate=1x1}` -> one dict per dim."""
    fields: dict[str, list[str]] = {}
    for part in (text or "").strip("{}").split():
        key, _, value = part.partition("=")
        fields[key] = value.split("x")
    dims = len(fields.get("size", []))
    out = []
    for i in range(dims):
        pad = fields.get("pad", ["0_0"] * dims)[i].split("_")
        out.append({"size": int(fields["size"][i]),
                    "stride": int(fields.get("stride", ["1"] * dims)[i]),
                    "pad_lo": int(pad[0]), "pad_hi": int(pad[1]),
                    "lhs_dilate": int(fields.get("lhs_dilate", ["1"] * dims)[i]),
                    "rhs_dilate": int(fields.get("rhs_dilate", ["1"] * dims)[i])})
    return out


def valid_positions(in_size: int, out_size: int, w: dict) -> int:
    """(kernel tap, output position) pairs that read a real input element, in one dim."""
    k, stride, lo, hi = w["size"], w["stride"], w["pad_lo"], w["pad_hi"]
    lhs_d, rhs_d = w["lhs_dilate"], w["rhs_dilate"]
    # XLA's two closed forms: a "reduce the whole dim" window and its transpose.
    if (in_size == out_size == k == lhs_d and rhs_d == 1 and stride == max(1, in_size - 1)
            and lo == hi == 0):
        return in_size
    if (in_size == 1 and k == out_size and rhs_d == lhs_d == stride == 1
            and lo == hi == out_size - 1):
        return out_size
    count = 0
    for tap in range(k):
        if stride == 1 and lhs_d == 1:
            shift = lo - tap * rhs_d
            count += max(min(in_size + shift, out_size) - max(shift, 0), 0)
            continue
        for o in range(out_size):
            u = o * stride - lo + tap * rhs_d
            if u % lhs_d == 0 and 0 <= u // lhs_d < in_size:
                count += 1
    return count


def convolution_flops(lhs: Shape, out: Shape, window: str | None, dim_labels: str | None,
                      feature_groups: int = 1, batch_groups: int = 1) -> float:
    labels = (dim_labels or "").replace("->", "_").split("_")
    if len(labels) != 3 or len(labels[0]) != len(lhs.dims) or len(labels[2]) != len(out.dims):
        return 2.0 * out.num_elements  # unlabelled: conservative one tap per output
    lhs_l, _, out_l = labels
    batch = lhs.dims[lhs_l.index("b")]
    in_features = lhs.dims[lhs_l.index("f")]
    out_features = out.dims[out_l.index("f")]
    positions = 1
    for i, w in enumerate(parse_window(window)):
        positions *= valid_positions(lhs.dims[lhs_l.index(str(i))],
                                     out.dims[out_l.index(str(i))], w)
    fma = (in_features // feature_groups) * out_features * (batch // batch_groups) * positions
    return 2.0 * fma


def conv_flops_of(ins, lhs: Shape, out: Shape) -> float:
    return convolution_flops(lhs, out, ins.attr("window"), ins.attr("dim_labels"),
                             int(ins.attr("feature_group_count") or 1),
                             int(ins.attr("batch_group_count") or 1))

