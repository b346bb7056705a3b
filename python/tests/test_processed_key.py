"""processed_key, the publish-only daemon a vLLM rank publishes into and
attaches from, is the device the launcher gives that rank: checked against
the ready line of a real `weightcache preload --publish-only` (device i
serves dp_rank i / tp, tp_rank i % tp; internal/launcher/ranks.go Map)."""

import pytest

from weightcache.vllm import Rank, processed_key


def test_both_sizes_above_one():
    # With either size 1, a formula with TP and DP swapped gives the same keys.
    assert processed_key(Rank(tp_size=2, tp_rank=1, dp_size=2, dp_rank=0)) == "host:1"
    assert processed_key(Rank(tp_size=2, tp_rank=0, dp_size=2, dp_rank=1)) == "host:2"


@pytest.mark.parametrize("tp,dp", [(2, 2), (2, 3), (4, 2)])
def test_processed_key_is_the_launchers_device(model, daemon, tp, dp):
    devices = [f"host:{i}" for i in range(tp * dp)]
    d = daemon(model, "--publish-only", "--tensor-parallel-size", str(tp), "--data-parallel-size", str(dp),
               "--devices", ",".join(devices))
    ranks = d.ready["ranks"]
    assert sorted(r["device"] for r in ranks) == sorted(devices)
    for r in ranks:
        key = processed_key(Rank(tp_size=tp, tp_rank=r["tp_rank"], dp_size=dp, dp_rank=r["dp_rank"]))
        assert key == r["device"], r


def test_a_node_of_a_multi_node_data_parallel_engine(model, daemon):
    """DP 4 over two nodes, this node serving DP ranks 2 and 3: the launcher
    numbers its devices from host:0, so the key follows vLLM's local DP rank
    (data_parallel_rank_local), not the global one."""
    d = daemon(model, "--publish-only", "--tensor-parallel-size", "2", "--data-parallel-size", "4",
               "--data-parallel-start-rank", "2", "--devices", "host:0,host:1,host:2,host:3")
    for r in d.ready["ranks"]:
        assert r["dp_rank"] in (2, 3)
        key = processed_key(Rank(tp_size=2, tp_rank=r["tp_rank"], dp_size=4, dp_rank=r["dp_rank"],
                                 dp_rank_local=r["dp_rank"] - 2))
        assert key == r["device"], r
