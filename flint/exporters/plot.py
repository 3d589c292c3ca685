"""PNG breakdown of a predicted step: where the time goes, by stream and by op class."""
from __future__ import annotations

import io

from flint.io import write_atomic


def pyplot():
    """matplotlib's pyplot on the file-only Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def png_bytes(fig) -> bytes:
    """The figure as PNG, byte-identical for identical input (no timestamp/version tag)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, metadata={"Software": None})
    pyplot().close(fig)
    return buf.getvalue()


def breakdown_png(estimate: dict) -> bytes:
    plt = pyplot()

    step_ms = estimate["step_time_s"] * 1e3
    exposed = estimate["exposed_communication_s"] * 1e3
    compute = estimate["compute_busy_s"] * 1e3
    other_idle = max(step_ms - compute - exposed, 0.0)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 3.8))
    left = 0.0
    for label, value, color in (("compute", compute, "#4C72B0"),
                                ("exposed communication", exposed, "#DD8452"),
                                ("other idle", other_idle, "#BBBBBB")):
        ax1.barh([0], [value], left=left, color=color, label=f"{label}: {value:.1f} ms")
        left += value
    ax1.set_yticks([])
    ax1.set_xlabel("time (ms)")
    ax1.set_title(f"Step {step_ms:.1f} ms on {estimate['devices']} x {estimate['hardware']}")
    ax1.legend(loc="upper center", bbox_to_anchor=(0.5, -0.25), ncol=1, fontsize=8)
    classes = sorted(estimate["by_class_s"].items(), key=lambda kv: kv[1])
    ax2.barh([k for k, _ in classes], [v * 1e3 for _, v in classes], color="#55A868")
    ax2.set_xlabel("time summed over the step (ms)")
    ax2.set_title("By op class")
    fig.tight_layout()
    return png_bytes(fig)


def write_breakdown(estimate: dict, path) -> None:
    write_atomic(path, breakdown_png(estimate))
