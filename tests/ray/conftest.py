"""A local Ray instance for the tests of one module that drive worker groups with stand-in actors."""

from __future__ import annotations

import pytest
import ray


@pytest.fixture(scope="module")
def local_ray():
    ray.init(address="local", num_cpus=2, include_dashboard=False, configure_logging=False, log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()
