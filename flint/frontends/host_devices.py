"""N host-CPU devices in this process, for the CPU target (and the tests).

JAX sizes its CPU backend once, when the backend starts: `jax_num_cpu_devices` must be set
before that. XLA's CPU compiler refuses programs over more than 2048 devices unless CPU
collectives are enabled, which in turn need a (one-process) distributed runtime; with it,
compiling for 16384 devices works (measured here: backend start 12 s, 2.2 GB).
"""
from __future__ import annotations

import socket

from flint.errors import FlintError

MAX_PLAIN_CPU_DEVICES = 2048
_started_distributed = False


def host_devices(count: int) -> list:
    import jax
    from jax._src import xla_bridge

    if not xla_bridge.backends_are_initialized():
        jax.config.update("jax_num_cpu_devices", max(count, 1))
        if count > MAX_PLAIN_CPU_DEVICES:
            _start_cpu_collectives()
    devices = jax.devices("cpu")
    if len(devices) < count:
        raise FlintError(
            f"this process already started JAX's CPU backend with {len(devices)} devices, "
            f"fewer than {count}; start a new process (the flint CLI does) or call "
            f"jax.config.update('jax_num_cpu_devices', {count}) before using JAX")
    if count > MAX_PLAIN_CPU_DEVICES and not _started_distributed \
            and jax.config.jax_cpu_collectives_implementation != "gloo":
        raise FlintError(f"compiling for {count} > {MAX_PLAIN_CPU_DEVICES} CPU devices needs "
                         f"CPU collectives set up before JAX starts; use a fresh process")
    return list(devices[:count])


def needs_hard_exit() -> bool:
    """A process that started the distributed runtime must leave with os._exit."""
    return _started_distributed


def _start_cpu_collectives() -> None:
    global _started_distributed
    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=1,
                               process_id=0)
    _started_distributed = True
