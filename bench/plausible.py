"""Plausibility checks for the benchmark's figures (bench/report.py applies them before it writes any).

A figure that breaks physics or the harness's own bookkeeping is a broken measurement, not a result:
more router CPU than the machine's cores had in the interval, negative CPU, a loadgen that sent a
different number of requests than the harness asked for, percentiles out of order, more latency than
the loadgen's concurrency fits into its run, a ratio between rows measured in different rounds.
Each check records the figure it refuses (where it was measured, its name, the value, the bound it
broke) in a Verdicts; report.py prints them and exits non-zero instead of writing the report.
"""
import math
import re

# CPU readings come in clock ticks per process, so a reading may exceed the true time by a tick or
# two; the wall clock around it is read a few µs apart from the /proc snapshot. Both are far below
# what a broken reading (a wrong process, a lost tick count, a ×10 sum) adds.
CPU_SLACK_TICKS = 2
CPU_TOLERANCE = 0.05
# Little's law on a closed loop: Σ latency ≤ concurrency × duration; 1 % + 1 ms for the clocks.
LATENCY_TOLERANCE = 0.01
# throughput_rps is ok / duration_secs, computed by the loadgen in floating point.
RATE_TOLERANCE = 1e-6


class Verdicts:
    """The implausible figures found so far, each named by where it was measured."""

    def __init__(self):
        self.failures = []

    def fail(self, figure, value, bound):
        self.failures.append(f"implausible: {figure} = {show(value)} ({bound})")
        return False

    def ok(self):
        return not self.failures


def show(v):
    if isinstance(v, float):
        return f"{v:.6g}"
    return str(v)


def name(*parts):
    """A figure's full name: section / shape / path / ... / figure."""
    return " / ".join(str(p) for p in parts if p not in (None, ""))


def is_number(x):
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def finite(v, figure, x):
    """A number, not NaN, not infinite."""
    return True if is_number(x) else v.fail(figure, x, "must be a finite number")


def positive(v, figure, x):
    """A number above zero (a latency, a duration, an added hop's cost)."""
    if not finite(v, figure, x):
        return False
    return True if x > 0 else v.fail(figure, x, "must be > 0")


def cpu_seconds(v, figure, secs, wall_secs, cores, tick_secs):
    """A process's CPU time over an interval: ≥ 0 and ≤ cores × the interval's wall time."""
    if not finite(v, figure, secs) or not positive(v, figure + " (wall s of its interval)", wall_secs):
        return False
    if secs < 0:
        return v.fail(figure, secs, "CPU time over an interval must be ≥ 0")
    bound = cores * wall_secs * (1 + CPU_TOLERANCE) + CPU_SLACK_TICKS * tick_secs
    if secs > bound:
        return v.fail(figure, secs, f"> {bound:.6g} s = {cores} cores × {wall_secs:.6g} s wall of its interval "
                      f"(+{100 * CPU_TOLERANCE:g} % + {CPU_SLACK_TICKS} ticks)")
    return True


def count(v, figure, asked, sent):
    """The loadgen's own count of requests sent against the number the harness asked it for."""
    if asked != sent:
        return v.fail(figure, sent, f"the loadgen's count of requests sent; the harness asked for {asked}")
    return True


def summary(v, figure, s, n):
    """A loadgen latency summary (ms) over n answers: positive, finite, p50 ≤ p90 ≤ p99 ≤ max, mean ≤ max."""
    if s.get("count") != n:
        return v.fail(name(figure, "count"), s.get("count"), f"must equal the {n} answers it summarises")
    if n == 0:
        return True
    keys = ("p50", "p90", "p99", "max")
    good = all([positive(v, name(figure, k), s.get(k)) for k in keys + ("mean",)])
    if not good:
        return False
    for lo, hi in zip(keys, keys[1:]):
        if s[lo] > s[hi]:
            return v.fail(name(figure, lo), s[lo], f"must be ≤ {hi} {show(s[hi])}")
    if s["mean"] > s["max"]:
        return v.fail(name(figure, "mean"), s["mean"], f"must be ≤ max {show(s['max'])}")
    return True


CLOSED_RE = re.compile(r"^closed\((\d+)\)$")


def report(v, figure, r, asked=None):
    """One loadgen JSON report: its counts add up, its timings are possible. With asked, the number
    of requests the harness told it to send."""
    sent, ok = r.get("requests"), r.get("ok")
    errors = r.get("errors") or {}
    if not all(isinstance(x, int) and x >= 0 for x in [sent, ok, *errors.values()]):
        return v.fail(name(figure, "requests"), sent, f"counts must be whole numbers ≥ 0 (ok {ok}, errors {errors})")
    if ok + sum(errors.values()) != sent:
        return v.fail(name(figure, "requests"), sent, f"must equal ok {ok} + errors {sum(errors.values())}")
    if asked is not None and not count(v, name(figure, "requests"), asked, sent):
        return False
    if sent == 0:
        return True
    secs = r.get("duration_secs")
    if not positive(v, name(figure, "duration s"), secs):
        return False
    rps = r.get("throughput_rps")
    if not finite(v, name(figure, "req/s"), rps):
        return False
    if abs(rps - ok / secs) > RATE_TOLERANCE * max(1.0, rps):
        return v.fail(name(figure, "req/s"), rps, f"must equal ok {ok} / duration {show(secs)} s")
    good = summary(v, name(figure, "latency ms"), r.get("latency_ms") or {}, ok)
    ttfb = r.get("ttfb_ms") or {}
    if good and ttfb.get("count"):
        good = summary(v, name(figure, "TTFB ms"), ttfb, ttfb["count"]) and ttfb_within(v, figure, r)
    return good and littles_law(v, figure, r)


def ttfb_within(v, figure, r):
    """The first byte comes no later than the whole answer."""
    t, lat = r["ttfb_ms"], r["latency_ms"]
    if t["count"] > r["ok"]:
        return v.fail(name(figure, "TTFB ms", "count"), t["count"], f"must be ≤ ok {r['ok']}")
    if t["max"] > lat["max"]:
        return v.fail(name(figure, "TTFB ms", "max"), t["max"], f"must be ≤ latency max {show(lat['max'])}")
    return True


def littles_law(v, figure, r):
    """A closed loop of c requests in flight fits at most c × duration of latency into its run."""
    m = CLOSED_RE.match(r.get("mode", ""))
    if not m or not r["ok"]:
        return True
    conc = int(m.group(1))
    busy_ms = r["ok"] * r["latency_ms"]["mean"]
    bound = conc * 1000 * r["duration_secs"] * (1 + LATENCY_TOLERANCE) + 1
    if busy_ms > bound:
        return v.fail(name(figure, "latency ms", "mean"), r["latency_ms"]["mean"],
                      f"{r['ok']} answers × mean > {conc} in flight × {show(r['duration_secs'])} s duration")
    return True


def within_wall(v, figure, r, wall_secs):
    """The loadgen's own duration fits inside the wall time the harness measured around it."""
    if r.get("requests") and r["duration_secs"] > wall_secs + 0.001:
        return v.fail(name(figure, "duration s"), r["duration_secs"],
                      f"must be ≤ {show(wall_secs)} s, the harness's wall time around the loadgen")
    return True


def label_round(v, figure, label, rnd):
    """A report's label ends with the round the harness filed it under (…-<round>)."""
    if not str(label).endswith(f"-{rnd}"):
        return v.fail(name(figure, "round id"), rnd, f"the report's own label is {label!r}")
    return True


def same_rounds(v, figure, rounds, base_rounds, base):
    """A ratio or difference is taken only between rows measured in the same rounds."""
    if sorted(rounds) != sorted(base_rounds):
        return v.fail(name(figure, "round ids"), ",".join(map(str, rounds)),
                      f"must match {base}'s rounds {','.join(map(str, base_rounds))}")
    return True


def ratio(v, figure, num, den):
    """num / den between two positive figures (a ratio of a negative or zero cost means nothing)."""
    if not positive(v, name(figure, "numerator"), num) or not positive(v, name(figure, "denominator"), den):
        return None
    return num / den
