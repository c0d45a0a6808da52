"""report.py on made-up run directories: a plausible run is written, an implausible figure stops it
(no servers; `python3 -m unittest discover -s bench`)."""
import json
import os
import subprocess
import sys
import tempfile
import unittest

REPORT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "report.py")
PATHS = (("direct", "direct"), ("mmrouter kv exact", "throughput-mmrouter-kv-true"),
         ("sglang-router", "throughput-sgl"))


def loadgen_report(label, n, secs, conc, lat_ms):
    lat = {"count": n, "mean": lat_ms, "p50": lat_ms, "p90": lat_ms * 1.2, "p99": lat_ms * 1.5, "max": lat_ms * 2}
    return {"label": label, "mode": f"closed({conc})", "requests": n, "ok": n, "errors": {},
            "duration_secs": secs, "throughput_rps": n / secs, "latency_ms": lat, "ttfb_ms": dict(lat)}


class Run:
    """A run directory with the TSVs run.sh writes for the overhead and throughput sections."""

    def __init__(self, tmp):
        self.dir = tmp
        self.over, self.thru, self.empty = (os.path.join(tmp, f) for f in ("o.tsv", "t.tsv", "e.tsv"))
        for f in (self.over, self.thru, self.empty):
            open(f, "w").close()

    def write_report(self, name, r):
        path = os.path.join(self.dir, name + ".json")
        with open(path, "w") as f:
            json.dump(r, f)
        return path

    def overhead(self, added_us, rounds=5, n=100, ids=None):
        """One row per path; each round's mean latency = 160 µs + the path's added µs."""
        for title, stem in PATHS:
            stem = stem.replace("throughput", "overhead")
            files = []
            for k in range(1, rounds + 1):
                lat = (160 + added_us[title]) / 1000
                files.append(self.write_report(f"{stem}-text-{k}", loadgen_report(
                    f"{stem}-text-{k}", n, n * lat / 1000 * 1.05, 1, lat)))
            rids = ids.get(title) if ids and title in ids else ",".join(map(str, range(1, rounds + 1)))
            self.append(self.over, title, "text", "ok", ",".join(files), rids, n)

    def throughput(self, cpu_ticks, rps=2688.0, n=500, runs=5, wall_us=None):
        """One row per path; cpu_ticks[title] = the router's ticks per run (None for direct)."""
        for title, stem in PATHS:
            files, ticks = [], []
            for k in range(1, runs + 1):
                files.append(self.write_report(f"{stem}-unique-2000-{k}", loadgen_report(
                    f"{stem}-unique-2000-{k}", n, n / rps, 16, 4.0)))
                t = cpu_ticks.get(title)
                ticks.append("-" if t is None else str(t))
            wall = wall_us or int(1e6 * n / rps) + 2000
            self.append(self.thru, title, "unique-2000", "ok", ",".join(files), ",".join(map(str, range(1, runs + 1))),
                        ",".join(ticks), ",".join([str(wall)] * runs), n)

    @staticmethod
    def append(path, *cols):
        with open(path, "a") as f:
            f.write("\t".join(map(str, cols)) + "\n")

    def report(self, *extra):
        cmd = [sys.executable, REPORT, "--rows", self.empty, "--overhead", self.over, "--throughput", self.thru,
               "--params", "test", "--ttft-base-ms", "5", "--prefill-us", "20", "--cores", "2", "--clk-tck", "100",
               *extra]
        return subprocess.run(cmd, capture_output=True, text=True)


ADDED = {"direct": 0, "mmrouter kv exact": 200, "sglang-router": 270}
CPU = {"direct": None, "mmrouter kv exact": 5, "sglang-router": 8}  # ticks per run of ~0.19 s


class ReportChecks(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.run = Run(self.tmp.name)

    def tearDown(self):
        self.tmp.cleanup()

    def test_plausible_run_is_written(self):
        self.run.overhead(ADDED)
        self.run.throughput(CPU)
        p = self.run.report()
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("| text, cache hit (one body repeated) | mmrouter kv exact | 360 | 360 | +200 | 0.74× ", p.stdout)
        # 5 ticks = 50 ms over 500 requests: 100 µs each; against 160 µs: 0.62×.
        self.assertIn("| 2688 | 2688–2688 (5 runs) | 1.00× | 100 | 0.62× | - |", p.stdout)

    def test_the_issues_cpu_figure_fails_naming_it(self):
        # 23 540 µs per request at 2 688 req/s: 1 177 ticks in a 0.19 s run on 2 cores.
        self.run.throughput({**CPU, "mmrouter kv exact": 1177})
        p = self.run.report()
        self.assertEqual(p.returncode, 2)
        self.assertEqual(p.stdout, "")
        self.assertIn("implausible: throughput / unique-2000 / mmrouter kv exact / run 1 / router CPU s = 11.77 "
                      "(> 0.414823 s = 2 cores × 0.188011 s wall of its interval", p.stderr)

    def test_negative_cpu_fails_and_no_negative_ratio_is_written(self):
        self.run.throughput({**CPU, "sglang-router": -41})
        p = self.run.report()
        self.assertEqual(p.returncode, 2)
        self.assertIn("throughput / unique-2000 / sglang-router / run 1 / router CPU s = -0.41", p.stderr)
        self.assertNotIn("×", p.stdout)

    def test_requests_the_loadgen_did_not_send(self):
        self.run.throughput(CPU)
        with open(self.run.thru) as f:
            lines = f.read().replace("\t500\n", "\t501\n", 1)
        with open(self.run.thru, "w") as f:
            f.write(lines)
        p = self.run.report()
        self.assertEqual(p.returncode, 2)
        self.assertIn("throughput / unique-2000 / direct / round 1 / requests = 500", p.stderr)
        self.assertIn("asked for 501", p.stderr)

    def test_added_latency_between_different_rounds(self):
        self.run.overhead(ADDED, ids={"mmrouter kv exact": "2,2,3,4,5"})
        p = self.run.report()
        self.assertEqual(p.returncode, 2)
        self.assertIn("overhead / text / mmrouter kv exact / round 2 / round id = 2", p.stderr)
        self.assertIn("overhead / text / mmrouter kv exact / added µs / round ids", p.stderr)

    def test_negative_added_latency(self):
        self.run.overhead({**ADDED, "mmrouter kv exact": -50})
        p = self.run.report()
        self.assertEqual(p.returncode, 2)
        self.assertIn("overhead / text / mmrouter kv exact / added µs (mean) = -50", p.stderr)

    def test_loadgen_slower_than_the_harness_wall(self):
        self.run.throughput(CPU, wall_us=1000)
        p = self.run.report()
        self.assertEqual(p.returncode, 2)
        self.assertIn("throughput / unique-2000 / direct / run 1 / duration s", p.stderr)

    def test_precise_table_shows_cached_by_route_and_rounds_ahead(self):
        """Precise against approximate: per-route cached shares from loadgen's route_tokens, and how
        many rounds precise mode was as good or better in, beside the medians' verdict."""
        prec = os.path.join(self.tmp.name, "precise.tsv")
        # (mode, round) -> (sims' hits of 1000 prompt tokens, p50 ms, exact cached, fallback cached of 100 each)
        runs = {("approximate", 1): (500, 100, 50, 60), ("precise", 1): (520, 90, 52, 70),
                ("approximate", 2): (510, 100, 50, 60), ("precise", 2): (505, 95, 50, 55),
                ("approximate", 3): (500, 100, 50, 60), ("precise", 3): (530, 110, 54, 66)}
        for (mode, rnd), (hits, p50, exact, fb) in runs.items():
            r = loadgen_report(f"precise-c8-{mode}-{rnd}", 10, 1.0, 8, p50)
            r["route_tokens"] = {"exact": {"prompt_tokens": 100, "cached_tokens": exact},
                                 "text_prefix": {"prompt_tokens": 100, "cached_tokens": fb}}
            path = self.run.write_report(f"precise-c8-{mode}-{rnd}", r)
            Run.append(prec, 8, mode, rnd, "ok", path, hits, 1000, "250,250,250,250")
            # Conversation "a": three turns, listed out of order; precise mode moves its second turn in
            # every round and its third in rounds 2 and 3, approximate mode never. Conversation "b": one
            # turn (no follow-up). A failed turn is skipped.
            precise = mode == "precise"
            workers = ["w0", "w1" if precise else "w0", "w2" if precise and rnd > 1 else "w1" if precise else "w0"]
            lines = [{"line": 1, "conversation": "a", "status": "ok", "worker": workers[0]},
                     {"line": 2, "conversation": "b", "status": "ok", "worker": "w3"},
                     {"line": 4, "conversation": "a", "status": "ok", "worker": workers[2]},
                     {"line": 3, "conversation": "a", "status": "ok", "worker": workers[1]},
                     {"line": 5, "conversation": "a", "status": "timeout", "worker": None}]
            with open(path[: -len(".json")] + ".requests.jsonl", "w") as f:
                f.writelines(json.dumps(line) + "\n" for line in lines)
        p = self.run.report("--precise", prec)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("| 8 | precise | 30/30 | 52.0% | 95.0 |", p.stdout)
        self.assertIn("| 52.0% / 66.0% | 2 of 2 |", p.stdout)  # precise: 1, 2, 2 moved
        self.assertIn("| 50.0% / 60.0% | 0 of 2 |", p.stdout)
        self.assertIn("cached (sims) 52.0% vs 50.0% (holds; precise as good or better in 2 of 3 rounds)", p.stdout)
        self.assertIn("p50 ms 95.0 ms vs 100.0 ms (holds; precise as good or better in 2 of 3 rounds)", p.stdout)

    def disagg_run(self, rounds=(1, 2), residency_queries=(25, 25, 25, 25)):
        """disagg.tsv with both comparisons: per (comparison, row) the mean TTFT (ms), the prefill sims'
        cached tokens of 1000, the encode sims' hits (queries per encoder: 25 each unless given)."""
        tsv = os.path.join(self.tmp.name, "disagg.tsv")
        rows = {("prefill", "kv"): (100, 600, None), ("prefill", "text"): (110, 500, None),
                ("prefill", "rr"): (150, 200, None), ("encode", "residency"): (80, None, 80),
                ("encode", "rr"): (100, None, 40), ("encode", "ring"): (90, None, 80)}
        for rnd in rounds:
            for (cmp, row), (ttft, cached, hits) in rows.items():
                name = f"disagg-{cmp}-{row}-{rnd}"
                path = self.run.write_report(name, loadgen_report(name, 10, 1.0, 4, ttft))
                scrapes = []
                roles = ["prefill", "prefill", "decode", "encode", "encode", "encode", "encode"]
                for k, role in enumerate(roles):
                    lines = ['sim_role_info{role="%s"} 1' % role]
                    if role == "prefill" and cached is not None:
                        lines += ['vllm:prefix_cache_hits_total{model_name="m",engine="0"} %d' % (cached // 2),
                                  'vllm:prompt_tokens_total{model_name="m",engine="0"} 500']
                    if role == "encode":
                        q = residency_queries[k - 3] if row == "residency" else 25
                        lines += ['sim_encoder_cache_queries_total{model_name="m",engine="0"} %d' % q,
                                  'sim_encoder_cache_hits_total{model_name="m",engine="0"} %d' % ((hits or 0) // 4)]
                    prom = os.path.join(self.tmp.name, f"{name}-sim{k}.prom")
                    with open(prom, "w") as f:
                        f.write("# HELP x\n" + "\n".join(lines) + "\n")
                    scrapes.append(f"{role}={prom}")
                router = os.path.join(self.tmp.name, f"{name}-router.prom")
                with open(router, "w") as f:
                    f.write('mmrouter_disagg_fallback_total{leg="prefill",reason="failed"} 1\n'
                            'mmrouter_disagg_fallback_total{leg="encode",reason="cached_prefix"} 3\n'
                            'mmrouter_disagg_legs_total{leg="encode",outcome="served"} 7\n'
                            'mmrouter_worker_legs_total{worker="sim10",leg="prefill"} 4\n'
                            'mmrouter_worker_legs_total{worker="sim1",leg="prefill"} 6\n'
                            'mmrouter_worker_legs_total{worker="sim2",leg="decode"} 10\n')
                Run.append(tsv, cmp, row, f"title {cmp} {row}", rnd, "ok", path, 10, ",".join(scrapes), router)
        return tsv

    def test_disagg_table_ratios_and_goals(self):
        """The disagg section: both comparisons against round-robin of the same round, the goals' verdicts."""
        p = self.run.report("--disagg", self.disagg_run())
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("## Disaggregated serving (2 round(s))", p.stdout)
        # kv: 600 of 1000 prompt tokens cached, prefill legs 6 on sim1 and 4 on sim10 (in worker order),
        # 7 encode legs and 3 skipped (cached prefix, not a fallback), 1 other fallback a round, TTFT 100 / 150 ms.
        self.assertIn("| title prefill kv | 20/20 | 100.0 | 100.0 | 150.0 | 1.00 | 60.0% | 6/4 | 7 / 3 | 2 "
                      "| 0.667× (0.67–0.67) | 1.000× | 3.000× |", p.stdout)
        self.assertIn("| title prefill rr | 20/20 | 150.0 | 150.0 | 225.0 | 1.00 | 20.0% | 6/4 | 7 / 3 | 2 | 1 (baseline) ",
                      p.stdout)
        self.assertIn("| title encode residency | 20/20 | 80.0 | 80.0 | 120.0 | 1.00 | 80 (80.0%) | 25/25/25/25 "
                      "| 1.00 (max 1.00) | 0.800× (0.80–0.80) | 1.000× | 2.000× |", p.stdout)
        self.assertIn("encoder-cache hits 2.00× round-robin's (goal ≥ 1.8: holds); busiest encoder 1.00× the mean "
                      "in the worst round (goal ≤ 1.5: holds); mean TTFT 0.800× round-robin's (goal < 1: holds; lower "
                      "in 2 of 2 rounds); mean TTFT 0.889× the hash ring's (goal < 1: holds; lower in 2 of 2 rounds)",
                      p.stdout)
        self.assertIn("the exact-overlap prefill caches 1.200× the text-prefix policy's share (goal ≥ 1: holds; "
                      "as much or more in 2 of 2 rounds)", p.stdout)

    def test_disagg_unbalanced_encoders_miss_the_goal(self):
        p = self.run.report("--disagg", self.disagg_run(residency_queries=(50, 20, 20, 30)))
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("| 50/20/20/30 | 1.67 (max 1.67) |", p.stdout)
        self.assertIn("busiest encoder 1.67× the mean in the worst round (goal ≤ 1.5: MISSED)", p.stdout)

    def test_disagg_more_hits_than_queries_is_implausible(self):
        tsv = self.disagg_run()
        bad = os.path.join(self.tmp.name, "disagg-encode-rr-1-sim3.prom")
        with open(bad, "a") as f:
            f.write('sim_encoder_cache_hits_total{model_name="m",engine="1"} 100\n')
        p = self.run.report("--disagg", tsv)
        self.assertEqual(p.returncode, 2)
        self.assertIn("implausible: disagg / encode / rr / round 1 / sim3 (encode) / encoder-cache hits = 110 "
                      "(must be ≤ its queries 25)", p.stderr)


if __name__ == "__main__":
    unittest.main()
