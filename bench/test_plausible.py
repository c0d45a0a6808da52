"""Unit tests of bench/plausible.py (no servers; `python3 -m unittest discover -s bench`)."""
import copy
import unittest

import plausible as P


def good_report(n=100, conc=16, secs=0.5, label="throughput-mmrouter-kv-true-text-1"):
    """A consistent loadgen report: n answers, all ok, at concurrency conc over secs."""
    lat = {"count": n, "mean": 40.0, "p50": 38.0, "p90": 50.0, "p99": 70.0, "max": 75.0}
    ttfb = {"count": n, "mean": 30.0, "p50": 28.0, "p90": 40.0, "p99": 60.0, "max": 65.0}
    return {
        "label": label, "mode": f"closed({conc})", "requests": n, "ok": n, "errors": {},
        "duration_secs": secs, "throughput_rps": n / secs, "latency_ms": lat, "ttfb_ms": ttfb,
    }


def failures(check, *args):
    v = P.Verdicts()
    check(v, *args)
    return v.failures


class CpuSeconds(unittest.TestCase):
    def test_within_cores_times_wall(self):
        self.assertEqual(failures(P.cpu_seconds, "cpu", 0.26, 0.4, 2, 0.01), [])
        self.assertEqual(failures(P.cpu_seconds, "cpu", 0.0, 0.4, 2, 0.01), [])

    def test_more_than_the_cores_had_fails_naming_it(self):
        # The figure: 23 540 µs × 500 requests in one ~0.19 s run on 2 cores.
        f = failures(P.cpu_seconds, "throughput / unique-2000 / mmrouter / router CPU s", 11.77, 0.19, 2, 0.01)
        self.assertEqual(len(f), 1)
        self.assertIn("throughput / unique-2000 / mmrouter / router CPU s = 11.77", f[0])
        self.assertIn("2 cores", f[0])

    def test_negative_fails(self):
        f = failures(P.cpu_seconds, "router CPU s", -6.2, 2.0, 2, 0.01)
        self.assertEqual(len(f), 1)
        self.assertIn("≥ 0", f[0])

    def test_tick_granularity_is_tolerated(self):
        # Two ticks over a run whose wall time is shorter than a tick on one core.
        self.assertEqual(failures(P.cpu_seconds, "cpu", 0.02, 0.005, 1, 0.01), [])

    def test_nan_and_missing_wall_fail(self):
        self.assertEqual(len(failures(P.cpu_seconds, "cpu", float("nan"), 1.0, 2, 0.01)), 1)
        self.assertEqual(len(failures(P.cpu_seconds, "cpu", 0.1, 0.0, 2, 0.01)), 1)


class Report(unittest.TestCase):
    def test_consistent_report_passes(self):
        self.assertEqual(failures(P.report, "r", good_report(), 100), [])

    def test_count_differs_from_the_harness(self):
        f = failures(P.report, "overhead / text / mmrouter / round 1", good_report(), 120)
        self.assertEqual(len(f), 1)
        self.assertIn("round 1 / requests = 100", f[0])
        self.assertIn("asked for 120", f[0])

    def test_errors_must_be_accounted(self):
        r = good_report()
        r["ok"] = 90
        r["latency_ms"]["count"] = r["ttfb_ms"]["count"] = 90
        r["throughput_rps"] = 90 / r["duration_secs"]
        self.assertIn("ok 90 + errors 0", failures(P.report, "r", r)[0])
        r["errors"] = {"timeout": 10}
        self.assertEqual(failures(P.report, "r", r, 100), [])

    def test_percentiles_out_of_order(self):
        r = good_report()
        r["latency_ms"]["p50"] = 2 * r["latency_ms"]["p99"]
        f = failures(P.report, "r", r)
        self.assertEqual(len(f), 1)
        self.assertIn("r / latency ms / p50 = 140", f[0])

    def test_negative_or_nan_latency(self):
        for bad in (-1.0, float("nan"), float("inf"), None):
            r = good_report()
            r["latency_ms"]["mean"] = bad
            self.assertEqual(len(failures(P.report, "r", r)), 1, bad)

    def test_rate_must_match_ok_over_duration(self):
        r = good_report()
        r["throughput_rps"] *= 10
        self.assertIn("req/s", failures(P.report, "r", r)[0])

    def test_more_latency_than_the_concurrency_fits(self):
        # 100 answers of 40 ms at concurrency 1 cannot finish in 0.5 s.
        r = good_report(conc=1)
        self.assertIn("latency ms / mean", failures(P.report, "r", r)[0])

    def test_ttfb_after_the_answer(self):
        r = good_report()
        r["ttfb_ms"].update(p99=80.0, max=90.0)
        self.assertIn("TTFB ms / max", failures(P.report, "r", r)[0])

    def test_empty_run_is_plausible(self):
        r = good_report()
        r.update(requests=0, ok=0, duration_secs=0.0, throughput_rps=0.0)
        r["latency_ms"] = {"count": 0, "mean": None, "p50": None, "p90": None, "p99": None, "max": None}
        r["ttfb_ms"] = copy.deepcopy(r["latency_ms"])
        self.assertEqual(failures(P.report, "r", r, 0), [])

    def test_duration_within_the_harness_wall(self):
        self.assertEqual(failures(P.within_wall, "r", good_report(), 0.6), [])
        self.assertIn("duration s", failures(P.within_wall, "r", good_report(), 0.3)[0])


class Rounds(unittest.TestCase):
    def test_label_names_the_round(self):
        self.assertEqual(failures(P.label_round, "r", "overhead-direct-text-3", "3"), [])
        self.assertIn("round id = 2", failures(P.label_round, "r", "overhead-direct-text-3", "2")[0])

    def test_rows_of_different_rounds(self):
        self.assertEqual(failures(P.same_rounds, "x", ["2", "1"], ["1", "2"], "direct"), [])
        f = failures(P.same_rounds, "x", ["1", "2", "2"], ["1", "2", "3"], "direct")
        self.assertIn("x / round ids = 1,2,2", f[0])

    def test_ratio_of_a_negative_cost(self):
        v = P.Verdicts()
        self.assertIsNone(P.ratio(v, "CPU ratio", 87.0, -411.0))
        self.assertIn("CPU ratio / denominator = -411", v.failures[0])
        self.assertAlmostEqual(P.ratio(P.Verdicts(), "x", 87.0, 151.0), 87 / 151)


if __name__ == "__main__":
    unittest.main()
