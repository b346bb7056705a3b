"""The pure parts of python/demo_vllm.py (make demo-vllm): a start's
timeline from its log lines, median and spread, and the SVG chart. No
vLLM here: the lines are those vLLM 0.32 prints with the demo's logging
config."""

import importlib.util
import os
import xml.etree.ElementTree as ET

import pytest

_spec = importlib.util.spec_from_file_location(
    "demo_vllm", os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "demo_vllm.py"))
demo = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(demo)

import time

T0 = 1796220600.0


def v(t, where, msg, proc="Worker pid=3", late=0.05):
    """(arrival, line): a vLLM record logged at t (printed to the second),
    read late seconds after."""
    return t + late, f"({proc}) INFO {time.strftime('%m-%d %H:%M:%S', time.localtime(t))} [{where}] {msg}"


LINES = [
    v(T0 + 9.0, "model.py:733", "Resolved architecture: LlamaForCausalLM", proc="APIServer pid=1"),
    v(T0 + 20.0, "cpu_model_runner.py:68", "Starting to load model /m..."),
    v(T0 + 20.1, "base_loader.py:82", "Initializing model took 0.10 seconds"),
    v(T0 + 21.5, "default_loader.py:501", "Loading weights took 1.40 seconds"),
    v(T0 + 21.7, "loader.py:115", "weightcache: hit, 147 tensors, 1538.2 MiB in 1.70 s from /tmp/x/main-host.sock"),
    (T0 + 24.0, "INFO:     Waiting for application startup."),
    (T0 + 24.25, "INFO:     Application startup complete."),
    (T0 + 24.5, "INFO:     127.0.0.1:1 - \"POST /v1/completions HTTP/1.1\" 200 OK"),
]


def test_timeline_from_the_boundary_lines():
    r = demo.parse_timeline(LINES, T0, T0 + 24.75)
    assert r["phases"] == pytest.approx([20.05, 1.5, 2.7, 0.5])  # each boundary when its line arrived
    assert r["total"] == pytest.approx(24.75)
    assert r["hit"] is True


def test_timeline_without_the_plugins_line_is_no_hit():
    r = demo.parse_timeline([ln for ln in LINES if "weightcache: hit" not in ln[1]], T0, T0 + 25)
    assert r["hit"] is False


def test_timeline_names_the_boundary_no_line_marked():
    with pytest.raises(ValueError, match="weights loaded"):
        demo.parse_timeline([ln for ln in LINES if "Loading weights took" not in ln[1]], T0, T0 + 25)
    with pytest.raises(ValueError, match="engine ready"):
        demo.parse_timeline([ln for ln in LINES if "startup complete" not in ln[1]], T0, T0 + 25)


def test_timeline_refuses_boundaries_out_of_order():
    with pytest.raises(ValueError, match="out of order"):
        demo.parse_timeline(LINES, T0, T0 + 1)  # a first token before the engine was ready


def test_a_message_quoting_a_marker_is_not_one():
    """Only a vLLM record whose message starts with the marker counts."""
    lines = [v(T0 + 5, "x.py:1", "said: Starting to load model again")] + LINES
    assert demo.parse_timeline(lines, T0, T0 + 24.75)["phases"][0] == pytest.approx(20.05)


def test_a_boundary_line_that_came_late_is_refused():
    """vLLM's own time for the line bounds how late it may be read."""
    lines = [v(T0 + 21.5, "default_loader.py:501", "Loading weights took 1.40 seconds", late=4.0)
             if "Loading weights" in ln else (a, ln) for a, ln in LINES]
    with pytest.raises(ValueError, match="weights loaded: the line came 4"):
        demo.parse_timeline(lines, T0, T0 + 26)


def test_median_and_spread():
    assert demo.median_spread([3.0, 1.0, 2.0]) == (2.0, 1.0, 3.0)
    assert demo.median_spread([4.0, 1.0, 2.0, 3.0]) == (2.5, 1.0, 4.0)
    assert demo.median_spread([5.0]) == (5.0, 5.0, 5.0)
    with pytest.raises(ValueError):
        demo.median_spread([])


def test_svg_has_one_stacked_bar_per_start_scaled_alike():
    rows = [("1 auto", [20.0, 2.0, 3.0, 0.5]), ("2 weightcache", [20.0, 0.5, 3.0, 0.5])]
    svg = demo.svg_timeline(rows, "a <title> & more")
    root = ET.fromstring(svg)  # well-formed, title escaped
    ns = "{http://www.w3.org/2000/svg}"
    bars = [e for e in root.iter(ns + "rect") if e.get("class") == "phase"]
    assert [b.get("data-phase") for b in bars] == list(demo.PHASES) * 2
    ys = sorted({b.get("y") for b in bars})
    assert len(ys) == 2  # one row per start
    scale = float(bars[0].get("width")) / 20.0
    for b, d in zip(bars, rows[0][1] + rows[1][1]):
        assert float(b.get("width")) == pytest.approx(d * scale, abs=0.01)
    for row in (bars[:4], bars[4:]):  # stacked: each phase starts where the one before ended
        for a, b in zip(row, row[1:]):
            assert float(b.get("x")) == pytest.approx(float(a.get("x")) + float(a.get("width")), abs=0.01)
        assert float(row[0].get("x")) == float(bars[0].get("x"))
    texts = [t.text for t in root.iter(ns + "text")]
    assert "a <title> & more" in texts and "25.5 s" in texts and "24.0 s" in texts
    assert all(p in texts for p in demo.PHASES)  # the legend
