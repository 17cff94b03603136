"""What the trace scripts share: a trace's events, when the first plan came into force, and a
copy's interval on the host clock.

A copy event's `t_ns` is when the copy began: residency records it at its landing less `dur_us`,
the copy's time on the device (docs/TRACE.md), so it ends `dur_us` later. Read here once, after
bench/trace_duplex.py took `t_ns` for the end (corrected in 41af287).
"""
import gzip
import json


def load(path):
    """The events of a trace (.jsonl, or .jsonl.gz), in the order of their t_ns."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        return sorted((json.loads(line) for line in f), key=lambda e: e["t_ns"])


def first_plan_ns(events):
    """When the first plan came into force (its event's t_ns), or None without a plan."""
    plans = [e["t_ns"] for e in events if e["ev"] == "plan"]
    return min(plans) if plans else None


def copy_interval(event):
    """A d2h's or h2d's (start, end) in ns on the host clock."""
    return event["t_ns"], event["t_ns"] + event["dur_us"] * 1e3


def overlap_ns(interval, others):
    """How much of `interval` the (start, end) intervals of `others` cover, summed."""
    start, end = interval
    return sum(max(0.0, min(end, b) - max(start, a)) for a, b in others)
