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
