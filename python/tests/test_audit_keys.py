"""weightcache audit checks --model-loader-extra-config for --load-format
weightcache against audit/facts/weightcache-plugin.json (made by
make audit-facts): this holds that copy to the plugin's parse_options."""

import dataclasses
import json
import os

import pytest

from weightcache.vllm import Options, parse_options

FACTS = os.path.join(os.path.dirname(__file__), "..", "..", "audit", "facts", "weightcache-plugin.json")
KEYS = json.load(open(FACTS))["keys"]
GOOD = {"bool": False, "seconds": 2.5, "string": "/run/x"}


def test_same_keys():
    assert sorted(KEYS) == sorted(f.name for f in dataclasses.fields(Options))


@pytest.mark.parametrize("key", sorted(KEYS))
def test_key_accepted_as_typed(key):
    spec = KEYS[key]
    for value in spec.get("choices") or [GOOD[spec["type"]]]:
        opts, rest = parse_options({key: value})
        assert rest == {} and getattr(opts, key) == value
    with pytest.raises(ValueError):
        parse_options({key: [] if spec["type"] != "choice" else "no-such-choice"})
