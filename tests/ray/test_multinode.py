"""Two Ray nodes on one machine: the driver attaches to the cluster and spreads ranks over both."""

from __future__ import annotations

import json

import pytest

from tests import shared_ray
from tests.e2e.helpers import base_args, read_metrics, run_main

pytestmark = pytest.mark.slow


@pytest.fixture
def two_node_cluster():
    from ray.cluster_utils import Cluster

    # One CPU per node: each node's placement group (one bundle per rank) fills one node.
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    try:
        yield cluster
    finally:
        cluster.shutdown()


def test_two_nodes_train(two_node_cluster, tiny_model_dir, reverse_data, tmp_path):
    out = tmp_path / "run"
    args = [a for a in base_args(tiny_model_dir, reverse_data, out, steps=2) if not a.startswith("trainer.n_gpus_per_node")]
    args += ["trainer.nnodes=2", "trainer.n_gpus_per_node=1", f"ray_kwargs.ray_init.address={two_node_cluster.address}",
             "trainer.val_before_train=false", "trainer.test_freq=-1"]
    proc = run_main(args, env=shared_ray.warm_env())  # its workers forked from the session's warm process, if any
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    placement = json.loads((out / "placement.json").read_text())
    nodes = placement["actor_rank_nodes"]
    assert len(nodes) == 2 and len(set(nodes)) == 2, f"actor ranks not on two nodes: {nodes}"
    assert "2 rank(s) on 2 node(s)" in proc.stdout
    m = read_metrics(out)
    assert sorted(m) == [1, 2]
