"""Test session: JAX on 8 host CPU devices (set before any backend starts)."""
import json
import os
import subprocess
import sys
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")
# one stage-program cache for the session (the engine's compiled templates), never the
# user's own ~/.cache/flint
if "FLINT_CACHE" not in os.environ:
    import tempfile

    os.environ["FLINT_CACHE"] = tempfile.mkdtemp(prefix="flint-test-cache-")
os.environ.setdefault("JAX_SKIP_CUDA_CONSTRAINTS_CHECK", "1")

import jax  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)

REPO = Path(__file__).resolve().parents[1]
SHARED_TRACES = REPO.parent / "shared" / "traces"
# A Llama-shaped model small enough to compile whole: GQA, SwiGLU, RMSNorm, RoPE.
LLAMA6 = {"base": "llama3-8b", "layers": 6, "seq": 2048, "vocab": 32000}


def run_libtpu_process(args: list, timeout: int):
    """subprocess.run of a Python process that compiles for a TPU target, one at a time
    across the test workers: libtpu holds a lock per process (/tmp/libtpu_lockfile), so two
    such processes at once fail."""
    import fcntl
    import tempfile

    with open(Path(tempfile.gettempdir()) / "flint-tests-libtpu.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return subprocess.run([sys.executable, *args], capture_output=True, text=True,
                              timeout=timeout)


def prediction_text(p) -> str:
    """What `flint predict` prints for prediction `p`, as text."""
    import io

    from rich.console import Console

    from flint.prediction_report import render_prediction

    buf = io.StringIO()
    render_prediction(p.to_json(), Console(file=buf, width=200))
    return buf.getvalue()


def run_flint(*args, cwd=None, timeout=600):
    """Run the CLI in a fresh process (as a user would)."""
    return subprocess.run([sys.executable, "-m", "flint.cli", *args], capture_output=True,
                          text=True, cwd=cwd, timeout=timeout)


def run_cli(argv) -> tuple[int, str, str]:
    """Run the CLI in this process: (exit code, stdout, stderr)."""
    import contextlib
    import io

    from flint.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main([str(a) for a in argv])
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
    return code, out.getvalue(), err.getvalue()


def communicator(spec_text: str, n: int):
    """The Communicator of replica groups `spec_text` over n devices on a mesh of data x
    model (8 per node), as an extracted graph carries it."""
    from flint.graph import Communicator
    from flint.hlo.replica_groups import mesh_axes_spanned, parse_replica_groups

    g = parse_replica_groups(spec_text, n)
    return Communicator(0, "groups", spec_text, n, g.shape[1], g.shape[0],
                        mesh_axes_spanned(g, [("data", n // 8), ("model", 8)]))


def cli_json_per(argv, flag: str, values) -> dict:
    """`argv` (a --json command) run once per value of `flag`, each exiting 0: its JSON
    output by value."""
    out = {}
    for value in values:
        code, stdout, stderr = run_cli(list(argv) + [flag, value])
        assert code == 0, stderr
        out[value] = json.loads(stdout)
    return out


@pytest.fixture(scope="session")
def maxtext_archive():
    path = SHARED_TRACES / "jaxtoolbox_maxtext_fsdp4_4xH100.data.zip"
    if not path.exists():
        pytest.skip("shared MaxText archive not present")
    return path


@pytest.fixture(scope="session")
def ray_session():
    """One local Ray instance for the session (starting one takes ~15 s): the executors
    (flint.sweep_ray) use a running instance and leave it running."""
    ray = pytest.importorskip("ray")
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    if started:
        ray.shutdown()
