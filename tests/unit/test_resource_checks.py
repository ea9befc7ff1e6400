"""CPU ranks are checked against the machine's cores before anything starts."""

from __future__ import annotations

import pytest

from grpo_dist.config.loader import compose, to_typed
from grpo_dist.trainer.build import check_cpu_ranks


def cfg(*overrides):
    return to_typed(compose(list(overrides)), list(overrides))


def test_more_cpu_ranks_than_cores_is_refused_with_what_fits():
    c = cfg("trainer.device=cpu", "trainer.n_gpus_per_node=64")
    with pytest.raises(ValueError, match=r"= 64 CPU ranks, but this machine has 2 cores.*trainer.n_gpus_per_node=2"):
        check_cpu_ranks(c, 2)


def test_ranks_that_fit_and_cluster_runs_pass():
    check_cpu_ranks(cfg("trainer.device=cpu", "trainer.n_gpus_per_node=2"), 2)
    check_cpu_ranks(cfg("trainer.device=cpu", "trainer.n_gpus_per_node=64", "ray_kwargs.ray_init.address=auto"), 2)
    check_cpu_ranks(cfg("trainer.device=cpu", "trainer.n_gpus_per_node=64"), None)
