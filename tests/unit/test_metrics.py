"""The Prometheus endpoint listens on this host only unless the admin says otherwise."""

from __future__ import annotations

import socket

from icefrog_slurm.controller.metrics import ControllerMetrics
from icefrog_slurm.settings import Settings, settings_from_mapping


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_the_endpoint_binds_the_loopback_address_by_default() -> None:
    assert Settings().metrics.address == "127.0.0.1"
    port = _free_port()
    settings = settings_from_mapping({"metrics": {"port": port}})
    assert settings.metrics.port is not None
    metrics = ControllerMetrics()
    try:
        bound = metrics.serve(port=settings.metrics.port, address=settings.metrics.address)
        assert bound == ("127.0.0.1", port)  # not 0.0.0.0: no other host reaches it
    finally:
        metrics.close()
