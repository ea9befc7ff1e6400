"""A local Ray instance for the tests of one module that drive worker groups with stand-in actors."""

from __future__ import annotations

import pytest
import ray

from tests import shared_ray


@pytest.fixture(scope="module")
def local_ray():
    # the actors' processes forked from the session's warm process where there is one (tests/warm_workers.py)
    ray.init(address="local", num_cpus=2, include_dashboard=False, configure_logging=False, log_to_driver=False,
             runtime_env=shared_ray.warm_runtime_env())
    try:
        yield
    finally:
        ray.shutdown()
