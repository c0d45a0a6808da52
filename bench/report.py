#!/usr/bin/env python3
"""Builds bench/results/latest.md from the loadgen JSON reports written by bench/run.sh.

rows.tsv:       name, title, status ("ok" or "n/a (reason)"), report json, fallback count, sim TTFT ms,
                prompt tokens per sim (comma-separated)
overhead.tsv:   title, shape ("-" when the path did not start), status, report jsons (comma-separated
                rounds), round ids (comma-separated, one per report), requests asked per round
throughput.tsv: title, shape ("-" when the path did not start), status, report jsons (comma-separated
                runs), round ids, router CPU clock ticks per run ("-" without a router, "gone" when a
                reading failed), wall µs around each run's two CPU readings, requests asked per run

Every figure passes bench/plausible.py's checks first; with any implausible one nothing is printed,
the figures are named on stderr and the exit status is 2.
replicas.tsv:   mode, row, title, round, status, report json, Σ sims' cached tokens, Σ sims' prompt
                tokens, prompt tokens per sim (comma-separated), the replicas' /metrics scrapes after the
                run (comma-separated files), the replicas' mmrouter_cluster_peers before the load
precise.tsv:    concurrency, mode, round, status, report json, Σ sims' cached tokens, Σ sims' prompt tokens,
                prompt tokens per sim (comma-separated)
affinity.tsv:   workload, row, title, round, status, report json, Σ sims' cached tokens, Σ sims' prompt
                tokens, prompt tokens per sim, Σ processor-cache queries, Σ hits, Σ encoder-cache
                queries, Σ hits
disagg.tsv:     comparison (prefill or encode), row, title, round, status, report json, requests asked, the
                sims' /metrics scrapes after the run (comma-separated ROLE=FILE), the router's scrape
"""
import argparse
import json
import os
import re
import statistics
import sys

import plausible as P

PEER = "sglang-router"  # the row every ratio is taken against
# Every implausible figure met while building the report; main() writes nothing when there is one.
V = P.Verdicts()


def load(path, where):
    """A loadgen report, checked for plausibility under the figure name `where`; None when absent."""
    if not path or not os.path.exists(path):
        return None
    with open(path) as f:
        r = json.load(f)
    P.report(V, where, r)
    return r


def ms(v):
    return "-" if v is None else f"{v:.1f}"


def us(v):
    return "-" if v is None else f"{1000 * v:.0f}"


def counts(m):
    return " ".join(f"{k}:{v}" for k, v in sorted(m.items())) or "-"


def shares(split):
    try:
        vals = [float(v) for v in split.split(",") if v]
    except ValueError:
        return "-"
    total = sum(vals)
    return "/".join(f"{100 * v / total:.0f}" for v in vals) + " %" if total > 0 else "-"


STAGES = ("intake", "account", "plan", "select", "forward_ttfb")
STAGE_RE = re.compile(r'^mmrouter_stage_duration_seconds_(sum|count)\{stage="([a-z_]+)"\} (\S+)$')


def stage_totals(path):
    """{(stage, "sum"|"count"): value} from a saved /metrics scrape, or None."""
    if not os.path.exists(path):
        return None
    totals = {}
    with open(path) as f:
        for line in f:
            m = STAGE_RE.match(line.strip())
            if m:
                totals[(m.group(2), m.group(1))] = float(m.group(3))
    return totals


def stage_means_us(report_paths, where):
    """Mean µs per stage over the measured requests (scrapes taken before the first round and after the
    last: `<name>-<shape>.before.prom` beside the rounds' `<name>-<shape>-<round>.json`)."""
    prefix = re.sub(r"-\d+\.json$", "", report_paths.split(",")[0])
    before = stage_totals(prefix + ".before.prom")
    after = stage_totals(prefix + ".after.prom")
    if before is None or after is None:
        return None
    means = {}
    for st in STAGES:
        n = after.get((st, "count"), 0) - before.get((st, "count"), 0)
        total = after.get((st, "sum"), 0) - before.get((st, "sum"), 0)
        # Counters only grow within one router process: a drop means the scrapes are not of one process.
        figure = P.name(where, f"stage {st}")
        if n < 0 or total < 0:
            V.fail(figure, f"count {n:g}, sum {total:g} s", "counter differences over the run must be ≥ 0")
        elif n > 0:
            means[st] = 1e6 * total / n
    return means


def read_tsv(path, width):
    with open(path) as f:
        return [(line.rstrip("\n").split("\t") + [""] * width)[:width] for line in f if line.strip()]


def main_table(a, out):
    rows = read_tsv(a.rows, 7)
    # The sims' vLLM-named TTFT histogram includes prefill queueing; without it only an uncontended
    # estimate from usage is possible, which ignores exactly the queueing the kv policy trades against.
    measured = any(r[5] for r in rows)
    ttft_head = "sim TTFT mean ms" if measured else "uncontended TTFT est. ms"
    out += [
        "| run | ok/sent | errors | req/s | p50 ms | p99 ms | TTFB p50 | TTFB p99 | cached prompt tokens "
        f"| {ttft_head} | fallbacks | routes | prompt tokens per sim |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, title, status, path, fallbacks, ttft, split in rows:
        r = load(path, P.name("routing", name)) if status == "ok" else None
        if r is None:
            reason = status if status != "ok" else "n/a (no report)"
            out.append(f"| {title} | {reason} |" + " |" * 11)
            continue
        if measured:
            sim_ttft = f"{float(ttft):.1f}" if ttft else "-"
        elif r["ok"]:
            uncached = (r["prompt_tokens"] - r["cached_tokens"]) / r["ok"]
            sim_ttft = f"{a.ttft_base_ms + a.prefill_us * uncached / 1000:.1f}"
        else:
            sim_ttft = "-"
        cached = f"{100 * r['cached_ratio']:.1f}%"
        if r.get("usage_missing"):
            # Answers without usage would silently lower the ratio: say how many there were.
            cached += f" ({r['usage_missing']} without usage)"
        out.append(
            f"| {title} | {r['ok']}/{r['requests']} | {counts(r['errors'])} | {r['throughput_rps']:.2f} "
            f"| {ms(r['latency_ms']['p50'])} | {ms(r['latency_ms']['p99'])} | {ms(r['ttfb_ms']['p50'])} "
            f"| {ms(r['ttfb_ms']['p99'])} | {cached} | {sim_ttft} "
            f"| {fallbacks or '-'} | {counts(r['routes'])} | {shares(split)} |"
        )
    out += [
        "",
        "cached prompt tokens = Σ usage.prompt_tokens_details.cached_tokens / Σ usage.prompt_tokens over "
        "the answers that carry usage (those without are counted beside it); "
        "TTFB = time to the first streamed chunk, which the sims send after the (contended) prefill, so it is "
        "the measured time to first token through each path; fallbacks = Σ mmrouter_mm_fallback_total; "
        "routes = x-mmrouter-route counts (- when absent); prompt tokens per sim = each sim's share of "
        "vllm:prompt_tokens_total (how the router spread the work).",
    ]
    if measured:
        out.append("sim TTFT mean = Σ/count of the sims' vllm:time_to_first_token_seconds.")
    else:
        out.append(
            f"uncontended TTFT est. = {a.ttft_base_ms:g} ms + {a.prefill_us:g} µs × mean uncached prompt "
            "tokens per request: the sims' timing model as if each prefill ran alone. The sims queue "
            "concurrent prefills (prefill contention) and export no TTFT histogram, so this is a lower bound "
            "that only restates the cached ratio; the measured TTFB columns are the real ones."
        )


SHAPE_TITLES = {
    "text": "text, cache hit (one body repeated)",
    "image": "150 KB image, cache hit (one body repeated)",
    "unique-500": "unique ~500-token prompts",
    "unique-2000": "unique ~2000-token prompts",
    "unique-8000": "unique ~8000-token prompts",
    "multi-turn": "multi-turn (history resent, one new ~200-token turn)",
}


def shape_title(shape):
    return SHAPE_TITLES.get(shape, shape)


def in_order(keys):
    """Shapes in the order they were run (first appearance)."""
    seen = []
    for k in keys:
        if k not in seen:
            seen.append(k)
    return seen


def shape_rows(rows, data, out):
    """(shape, title, data[(title, shape)]) in run order; a path that did not start, or has no data for
    a shape, gets a placeholder row in `out` instead."""
    titles = in_order(r[0] for r in rows)
    unavailable = {r[0]: r[2] for r in rows if r[1] == "-"}
    for shape in in_order(r[1] for r in rows if r[1] != "-"):
        for title in titles:
            value = data.get((title, shape))
            if title in unavailable or value is None:
                out.append(f"| {shape_title(shape)} | {title} | {unavailable.get(title, 'n/a')} |" + " |" * 5)
                continue
            yield shape, title, value


def measured_rounds(section, title, shape, paths, ids, asked):
    """{round id: report} of one path and shape; each report checked against the count the harness
    asked for and against the round its label names."""
    paths, ids = [p for p in paths.split(",") if p], [i for i in ids.split(",") if i]
    where = P.name(section, shape, title)
    if len(paths) != len(ids):
        V.fail(P.name(where, "round ids"), ",".join(ids), f"one per report ({len(paths)} reports)")
        return {}
    reps = {}
    for path, rnd in zip(paths, ids):
        fig = P.name(where, f"round {rnd}")
        r = load(path, fig)
        if r is None:
            continue
        P.count(V, P.name(fig, "requests"), int(asked), r["requests"])
        P.label_round(V, fig, r["label"], rnd)
        if rnd in reps:
            V.fail(P.name(fig, "round id"), rnd, "filed twice for one path and shape")
        reps[rnd] = r
    return reps


def overhead_table(a, out):
    out += [
        "",
        "## Proxy overhead (latency minus direct; one zero-time sim, one non-streaming request at a time)",
        "",
        "| shape | path | mean µs | p50 µs | added µs (mean) | ratio to sglang-router | added µs (p50) "
        "| p50 ratio to sglang-router |",
        "|---|---|---|---|---|---|---|---|",
    ]
    rows = read_tsv(a.overhead, 6)
    rounds = {}  # (title, shape) -> {round id: report}
    for title, shape, status, paths, ids, asked in rows:
        if status != "ok":
            continue
        reps = measured_rounds("overhead", title, shape, paths, ids, asked)
        if reps and all(r is not None and r["ok"] for r in reps.values()):
            rounds[(title, shape)] = reps
    median = statistics.median
    added = {}  # (title, shape, "mean"|"p50") -> median over rounds of (path − direct in that round), ms
    for (title, shape), reps in rounds.items():
        base = rounds.get(("direct", shape))
        if base is None or title == "direct":
            continue
        if not P.same_rounds(V, P.name("overhead", shape, title, "added µs"), list(reps), list(base), "direct"):
            continue
        for stat in ("mean", "p50"):
            d = median(r["latency_ms"][stat] - base[k]["latency_ms"][stat] for k, r in reps.items())
            # A router is one more hop than direct: what it adds is a cost above zero.
            if P.positive(V, P.name("overhead", shape, title, f"added µs ({stat})"), 1000 * d):
                added[(title, shape, stat)] = d
    for shape, title, by_round in shape_rows(rows, rounds, out):
        reps = list(by_round.values())
        failed = sum(r["requests"] - r["ok"] for r in reps)
        err = f" ({failed} failed)" if failed else ""
        cells = []
        for stat in ("mean", "p50"):
            if title == "direct":
                cells += ["0 (baseline)", "-"]
                continue
            d = added.get((title, shape, stat))
            peer = added.get((PEER, shape, stat))
            rel = None
            if d is not None and peer is not None and P.same_rounds(
                    V, P.name("overhead", shape, title, f"ratio to {PEER} ({stat})"),
                    list(by_round), list(rounds[(PEER, shape)]), PEER):
                rel = P.ratio(V, P.name("overhead", shape, title, f"ratio to {PEER} ({stat})"), d, peer)
            cells += ["-" if d is None else f"{1000 * d:+.0f}", "-" if rel is None else f"{rel:.2f}×"]
        mean_us = us(median(r["latency_ms"]["mean"] for r in reps))
        p50_us = us(median(r["latency_ms"]["p50"] for r in reps))
        out.append(f"| {shape_title(shape)} | {title} | {mean_us}{err} | {p50_us} | " + " | ".join(cells) + " |")
    out += [
        "",
        "Each path has its own sim; the measured requests go in 5 rounds, each round sending the same slice "
        "through every path in turn (rotated order), after an unmeasured warm-up. mean / p50 µs = median over "
        "the rounds of each round's mean / median latency; added µs = median over the rounds of (the path's "
        "figure − direct's in the same round); ratio to sglang-router = added µs / sglang-router's added µs "
        "(below 1 is less overhead). The p50 columns resist the stalls a shared 2-vCPU machine adds to a few "
        "requests.",
    ]
    for title in in_order(r[0] for r in rows):
        if not title.startswith("mmrouter"):
            continue
        parts = []
        for t, shape, status, path, _, _ in rows:
            means = stage_means_us(path, P.name("overhead", shape, t)) if t == title and status == "ok" else None
            if not means:
                continue
            own = sum(v for k, v in means.items() if k != "forward_ttfb")
            cells = ", ".join(f"{k} {means[k]:.0f}" for k in STAGES if k in means and k != "forward_ttfb")
            fwd = f"; forward_ttfb {means['forward_ttfb']:.0f}" if "forward_ttfb" in means else ""
            parts.append(f"{shape}: {cells} (Σ {own:.0f}){fwd}")
        if parts:
            out.append(
                f"{title}, its own stages per measured request (mean µs, mmrouter_stage_duration_seconds; "
                "forward_ttfb = upstream send to the worker's first byte): " + "; ".join(parts) + "."
            )


def times(v):
    return "-" if v is None else f"{v:.2f}×"


def router_cpu_us(a, where, reps, ids, cpus, walls):
    """The router's CPU µs per request sent over the runs (None for direct): each run's CPU seconds
    checked against cores × the wall time around it, divided by the loadgen's own request counts."""
    ids, cpus, walls = ids.split(","), cpus.split(","), walls.split(",")
    if len(cpus) != len(ids) or len(walls) != len(ids):
        V.fail(P.name(where, "router CPU"), ",".join(cpus), f"one reading and one wall time per run ({len(ids)} runs)")
        return None
    secs = sent = 0
    for rnd, ticks, wall_us in zip(ids, cpus, walls):
        fig = P.name(where, f"run {rnd}")
        wall = int(wall_us) / 1e6
        if rnd in reps:
            P.within_wall(V, fig, reps[rnd], wall)
        if ticks == "-":
            return None
        if ticks == "gone":
            V.fail(P.name(fig, "router CPU s"), ticks, "the router process was gone at a reading")
            continue
        cpu = int(ticks) / a.clk_tck
        if P.cpu_seconds(V, P.name(fig, "router CPU s"), cpu, wall, a.cores, 1 / a.clk_tck) and rnd in reps:
            secs += cpu
            sent += reps[rnd]["requests"]
    return 1e6 * secs / sent if sent else None


def throughput_table(a, out):
    out += [
        "",
        "## Proxy throughput (closed loop, concurrency 16, two zero-time sims, non-streaming)",
        "",
        "Loadgen, both sims and the router share this machine's cores, so every router row is capped well "
        "below the router's own ceiling, and all rows alike; the direct row is the loadgen + sims ceiling. "
        "The sims compute each prompt with mmrouter's own pipeline (they tokenize too), so on the unique "
        "shapes they take a larger share of the cores.",
        "",
        "| shape | path | req/s (median) | runs min–max | ratio to sglang-router | router CPU µs/req "
        "| CPU ratio to sglang-router | errors |",
        "|---|---|---|---|---|---|---|---|",
    ]
    rows = read_tsv(a.throughput, 8)
    stats = {}  # (title, shape) -> (median, min, max, errors, runs, cpu µs/req, round ids)
    for title, shape, status, paths, ids, cpus, walls, asked in rows:
        if status != "ok":
            continue
        reps = measured_rounds("throughput", title, shape, paths, ids, asked)
        if not reps:
            continue
        rps = [r["throughput_rps"] for r in reps.values()]
        errors = sum(r["requests"] - r["ok"] for r in reps.values())
        cpu_us = router_cpu_us(a, P.name("throughput", shape, title), reps, ids, cpus, walls)
        stats[(title, shape)] = (statistics.median(rps), min(rps), max(rps), errors, len(reps), cpu_us, list(reps))
    for shape, title, s in shape_rows(rows, stats, out):
        peer = stats.get((PEER, shape))
        med, lo, hi, errors, runs, cpu, ids = s
        rel = cpu_rel = None
        if peer and P.same_rounds(V, P.name("throughput", shape, title, f"ratio to {PEER}"), ids, peer[6], PEER):
            rel = P.ratio(V, P.name("throughput", shape, title, f"req/s ratio to {PEER}"), med, peer[0])
            if cpu is not None and peer[5] is not None:
                cpu_rel = P.ratio(V, P.name("throughput", shape, title, f"CPU ratio to {PEER}"), cpu, peer[5])
        cpu_cell = "-" if cpu is None else f"{cpu:.0f}"
        out.append(
            f"| {shape_title(shape)} | {title} | {med:.0f} | {lo:.0f}–{hi:.0f} ({runs} runs) "
            f"| {times(rel)} | {cpu_cell} | {times(cpu_rel)} | {errors or '-'} |"
        )
    out += [
        "",
        "Every path runs at once with its own sims; run r of each path, in a rotated order, comes before run "
        "r+1 of any (paths measured seconds apart, not minutes). "
        "req/s = successful requests / wall time of one run (first send to last answer), median over the runs "
        "after an unmeasured warm-up; ratio = median / sglang-router's median; router CPU µs/req = user + "
        "system CPU time of the router process (and its children) over the measured runs / requests sent: "
        "its own cost per request, which does not depend on how the cores are shared; CPU ratio = that / "
        "sglang-router's (below 1 is cheaper). On the unique shapes no request repeats within one router "
        "process (each run starts where the previous stopped).",
    ]


REPL_BASE = "one"  # the row the replicas ratios are taken against
REPL_GOAL_CACHED = 0.97  # issue 24: 3 replicas + [cluster] keep ≥ 0.97× the one router's cached ratio
REPL_GOAL_TIME = 1.05  # ... and finish the same load within 1.05× its completion time
CLUSTER_RE = re.compile(r'^mmrouter_cluster_([a-z_]+)(?:\{([^}]*)\})? (\S+)$')


def cluster_series(path):
    """{(name without the prefix, labels): value} of the mmrouter_cluster_* series in one scrape."""
    series = {}
    if path and os.path.exists(path):
        with open(path) as f:
            for line in f:
                m = CLUSTER_RE.match(line.strip())
                if m:
                    series[(m.group(1), m.group(2) or "")] = float(m.group(3))
    return series


def num(v):
    return f"{v:.0f}" if v == int(v) else f"{v:g}"


def cluster_summary(rounds):
    """One line per round of the cluster row: per-replica gauges, counters summed over the replicas."""
    lines = []
    for rnd in rounds:
        per = [cluster_series(p) for p in rnd["proms"]]
        if not any(per):
            lines.append(f"round {rnd['round']}: no mmrouter_cluster_* series in the replicas' /metrics")
            continue
        gauges = ("peers", "nats_connected", "remote_bookings")
        parts = [f"peers before the load {rnd['peers'] or '-'}"]
        for g in gauges:
            parts.append(f"{g} after the run " + ",".join(num(s[(g, "")]) if (g, "") in s else "-" for s in per))
        totals = {}
        for s in per:
            for (name, labels), v in s.items():
                if name in gauges or name.startswith("bootstrap"):
                    continue
                totals[(name, labels)] = totals.get((name, labels), 0) + v
        parts += [f"{name}{{{labels}}} {num(v)}" for (name, labels), v in sorted(totals.items()) if v]
        settled = [cluster_series(p[:-len(".prom")] + ".settled.prom") for p in rnd["proms"]]
        if any(settled):
            parts.append("remote_bookings 2.5 s after the run " + ",".join(
                num(s[("remote_bookings", "")]) if ("remote_bookings", "") in s else "-" for s in settled))
        boot = ",".join(next((k[1].split('"')[1] for k, v in s.items() if k[0] == "bootstrap" and v == 1), "-")
                        for s in per)
        parts.append(f"bootstrap {boot}")
        lines.append(f"round {rnd['round']}: " + "; ".join(parts))
    return lines


def replicas_table(a, out):
    rows = read_tsv(a.replicas, 11)
    data = {}  # (mode, row) -> [round dicts]
    titles = {}
    for mode, row, title, rnd, status, path, hits, prompt, split, proms, peers in rows:
        titles[row] = title
        r = load(path, P.name("replicas", mode, row, f"round {rnd}")) if status == "ok" else None
        d = {"round": rnd, "status": status, "report": r, "split": split, "proms": [p for p in proms.split(",") if p],
             "peers": peers}
        if r is not None:
            d["cached"] = int(hits) / int(prompt) if prompt and int(prompt) > 0 else None
            d["time"] = r["duration_secs"]
        data.setdefault((mode, row), []).append(d)
    median = statistics.median

    def measured(rounds):
        return [d for d in rounds if d["report"] is not None]

    def round_ratios(mode, row, key):
        """row / the baseline row in the same round, per round both were measured in."""
        base = {d["round"]: d for d in measured(data.get((mode, REPL_BASE), []))}
        return [d[key] / base[d["round"]][key] for d in measured(data.get((mode, row), []))
                if d["round"] in base and d.get(key) and base[d["round"]].get(key)]

    def ratio_to_base(mode, row, key):
        """Median over the rounds of row / the baseline row in the same round."""
        vals = round_ratios(mode, row, key)
        return median(vals) if vals else None

    def ratio_cell(mode, row, key):
        vals = round_ratios(mode, row, key)
        if not vals:
            return "-"
        spread = f" ({min(vals):.2f}–{max(vals):.2f})" if len(vals) > 1 else ""
        return f"{median(vals):.3f}×{spread}"

    nrounds = len(in_order(r[3] for r in rows))
    out += [
        "",
        f"## Replicas (one address spreading requests round-robin over 3 routers; {nrounds} round(s))",
        "",
        "| mode | row | ok/sent | failed | cached (sims) | cached (answers) | completion s | p50 ms | p99 ms "
        "| TTFB p99 | prompt tokens per sim | cached × 1 router | time × 1 router |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    modes = in_order(r[0] for r in rows)
    order = in_order(r[1] for r in rows)
    order = [REPL_BASE] + [o for o in ("lone", "cluster", "sgl") if o in order] + \
        [o for o in order if o not in (REPL_BASE, "lone", "cluster", "sgl")]
    for mode in modes:
        for row in order:
            rounds = data.get((mode, row), [])
            if not rounds:
                continue
            ok_rounds = measured(rounds)
            bad = [d["status"] for d in rounds if d["report"] is None]
            if not ok_rounds:
                out.append(f"| {mode} | {titles[row]} | {bad[0]} |" + " |" * 11)
                continue
            reps = [d["report"] for d in ok_rounds]
            sent = sum(r["requests"] for r in reps)
            ok = sum(r["ok"] for r in reps)
            failed = sent - ok
            errs = {}
            for r in reps:
                for k, v in r["errors"].items():
                    errs[k] = errs.get(k, 0) + v
            failed_cell = "-" if not failed else f"{failed} ({counts(errs)})"
            if bad:
                failed_cell += f"; {len(bad)} round(s) {bad[0]}"
            cached = [d["cached"] for d in ok_rounds if d["cached"] is not None]
            cached_cell = f"{100 * median(cached):.1f}%" if cached else "-"
            usage = f"{100 * median(r['cached_ratio'] for r in reps):.1f}%"
            if any(r.get("usage_missing") for r in reps):
                usage += f" ({sum(r.get('usage_missing', 0) for r in reps)} without usage)"
            t = median(d["time"] for d in ok_rounds)
            p50 = median(r["latency_ms"]["p50"] for r in reps if r["latency_ms"]["p50"] is not None) if ok else None
            p99 = median(r["latency_ms"]["p99"] for r in reps if r["latency_ms"]["p99"] is not None) if ok else None
            t99 = median(r["ttfb_ms"]["p99"] for r in reps if r["ttfb_ms"]["p99"] is not None) if ok else None
            if row == REPL_BASE:
                rc = rt = "1 (baseline)"
            else:
                rc, rt = ratio_cell(mode, row, "cached"), ratio_cell(mode, row, "time")
            out.append(
                f"| {mode} | {titles[row]} | {ok}/{sent} | {failed_cell} | {cached_cell} | {usage} | {t:.2f} "
                f"| {ms(p50)} | {ms(p99)} | {ms(t99)} | {shares(ok_rounds[0]['split'])} | {rc} | {rt} |"
            )
    out += [
        "",
        "Each row on 4 fresh sims (cold caches, the routing section's timing model and prefill contention), the "
        "same seeded multimodal multi-turn workload, the same closed-loop concurrency in total; the load generator "
        "sends request i to router i mod 3 (a Service without session affinity), so a conversation's turns land on "
        "different replicas. precise = the sims publish KV events and every router follows them (kv_events); "
        "approximate = no events, each router knows what it (or, with [cluster], its peers) dispatched. "
        "cached (sims) = Σ vllm:prefix_cache_hits_total / Σ vllm:prompt_tokens_total over the 4 sims; cached "
        "(answers) = the same from the answers' usage; completion s = the load generator's wall time from the "
        "first send to the last answer; failed = requests without a 2xx answer; figures are medians over the "
        "rounds, ratios the median over the rounds of (row / the 1 router row of the same mode and round), with "
        "the rounds' lowest–highest in brackets; "
        "every round runs all rows of both modes, in an order rotated each round. prompt tokens per sim: the "
        "first round's.",
        "",
    ]
    for mode in modes:
        c1, t1 = ratio_to_base(mode, "cluster", "cached"), ratio_to_base(mode, "cluster", "time")
        cl, tl = ratio_to_base(mode, "lone", "cached"), ratio_to_base(mode, "lone", "time")
        if c1 is None or t1 is None:
            out.append(f"- goals, {mode}: not measured (the 3 replicas + [cluster] row or the 1 router row did "
                       "not run)")
            continue
        def verdict(ok, key, goal):
            vals = round_ratios(mode, "cluster", key)
            word = "holds" if ok else "MISSED"
            if len(vals) > 1 and min(vals) <= goal <= max(vals):
                word += f", though the rounds ({min(vals):.2f}–{max(vals):.2f}) straddle {goal}"
            return word

        g1 = c1 >= REPL_GOAL_CACHED
        g2 = t1 <= REPL_GOAL_TIME
        line = (f"- goals, {mode}: cached {c1:.3f}× the 1 router's (goal ≥ {REPL_GOAL_CACHED}: "
                f"{verdict(g1, 'cached', REPL_GOAL_CACHED)}), completion time {t1:.3f}× (goal ≤ {REPL_GOAL_TIME}: "
                f"{verdict(g2, 'time', REPL_GOAL_TIME)})")
        if cl is not None and tl is not None:
            g3 = c1 >= cl and t1 <= tl and (c1 > cl or t1 < tl)
            line += (f"; against 3 lone replicas (cached {cl:.3f}×, time {tl:.3f}×): "
                     f"{'better (holds)' if g3 else 'NOT better (MISSED)'}")
        else:
            line += "; 3 lone replicas not measured"
        out.append(line)
    out += ["", "better = a cached ratio no lower and a completion time no longer than the 3 lone replicas', "
            "one of them strictly."]
    for mode in modes:
        rounds = data.get((mode, "cluster"), [])
        lines = cluster_summary(measured(rounds))
        if lines:
            out += ["", f"Cluster series of the 3 replicas + [cluster] row, {mode} (mmrouter_cluster_*, after "
                    "the run; counters summed over the replicas, gauges per replica):", ""]
            out += [f"- {ln}" for ln in lines]


PREC_KEYS = (  # (key, title, better when higher)
    ("cached", "cached (sims)", True),
    ("p50", "p50 ms", False),
    ("p99", "p99 ms", False),
)


def route_cached(report, route):
    """Cached / prompt tokens of the answers on one route (loadgen's route_tokens), None without any."""
    t = (report.get("route_tokens") or {}).get(route)
    return t["cached_tokens"] / t["prompt_tokens"] if t and t.get("prompt_tokens") else None


def turns_moved(report_path):
    """(follow-up turns sent to another worker than their conversation's previous turn, follow-up turns)
    from the run's `--requests-out` file beside its JSON report; None without one."""
    requests = report_path[: -len(".json")] + ".requests.jsonl" if report_path.endswith(".json") else ""
    if not os.path.exists(requests):
        return None
    with open(requests) as f:
        rows = sorted((json.loads(line) for line in f if line.strip()), key=lambda r: r["line"])
    last, moved, follow = {}, 0, 0
    for r in rows:
        if r.get("status") != "ok" or r.get("worker") is None:
            continue
        if r["conversation"] in last:
            follow += 1
            moved += last[r["conversation"]] != r["worker"]
        last[r["conversation"]] = r["worker"]
    return moved, follow


def precise_table(a, out):
    """Precise against approximate mode, round by round, per concurrency, with the goal's verdict."""
    data = {}  # (concurrency, mode) -> {round: figures}
    bad = []
    for conc, mode, rnd, status, path, hits, prompt, split in read_tsv(a.precise, 8):
        r = load(path, P.name("precise", f"concurrency {conc}", mode, f"round {rnd}")) if status == "ok" else None
        if r is None:
            bad.append(f"concurrency {conc} {mode} round {rnd}: {status}")
            continue
        data.setdefault((conc, mode), {})[rnd] = {
            "cached": int(hits) / int(prompt) if prompt and int(prompt) > 0 else None,
            "p50": r["latency_ms"]["p50"], "p99": r["latency_ms"]["p99"], "ttfb50": r["ttfb_ms"]["p50"],
            "time": r["duration_secs"], "ok": r["ok"], "sent": r["requests"], "split": split,
            "exact": route_cached(r, "exact"), "text_prefix": route_cached(r, "text_prefix"),
            "moved": turns_moved(path),
        }
    median = statistics.median
    concs = in_order(k[0] for k in data)
    nrounds = len(in_order(r for v in data.values() for r in v))
    out += [
        "",
        f"## Precise against approximate mode, in turns ({nrounds} round(s))",
        "",
        "| concurrency | mode | ok/sent | cached (sims) | p50 ms | p99 ms | TTFB p50 | completion s "
        "| prompt tokens per sim | cached: exact / fallback routes | turns moved | cached × approx. | p50 × approx. "
        "| p99 × approx. |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    verdicts = []
    for conc in concs:
        appr, prec = data.get((conc, "approximate"), {}), data.get((conc, "precise"), {})
        for mode, rounds in (("approximate", appr), ("precise", prec)):
            if not rounds:
                continue
            figs = list(rounds.values())

            def med(key):
                vals = [f[key] for f in figs if f[key] is not None]
                return median(vals) if vals else None

            cells = []
            for key, _, _ in PREC_KEYS:
                per = [rounds[r][key] / appr[r][key] for r in rounds
                       if r in appr and rounds[r][key] and appr[r][key]] if mode == "precise" else []
                cells.append(f"{median(per):.3f}× ({min(per):.2f}–{max(per):.2f})" if per else "-")
            cached = med("cached")
            by_route = " / ".join("-" if med(k) is None else f"{100 * med(k):.1f}%" for k in ("exact", "text_prefix"))
            moves = [f["moved"] for f in figs if f["moved"]]
            moved = f"{median(m for m, _ in moves):g} of {moves[0][1]}" if moves else "-"
            out.append(
                f"| {conc} | {mode} | {sum(f['ok'] for f in figs)}/{sum(f['sent'] for f in figs)} "
                f"| {'-' if cached is None else f'{100 * cached:.1f}%'} | {ms(med('p50'))} | {ms(med('p99'))} "
                f"| {ms(med('ttfb50'))} | {med('time'):.2f} | {shares(figs[0]['split'])} | {by_route} | {moved} | "
                + " | ".join(cells) + " |")
        if not appr or not prec:
            verdicts.append(f"- concurrency {conc}: not measured (a mode did not run)")
            continue
        parts = []
        for key, title, higher in PREC_KEYS:
            pv = median(f[key] for f in prec.values())
            av = median(f[key] for f in appr.values())
            ok = pv >= av if higher else pv <= av
            shown = (lambda v: f"{100 * v:.1f}%") if key == "cached" else (lambda v: f"{v:.1f} ms")
            paired = [r for r in prec if r in appr]
            better = (lambda p, a: p >= a) if higher else (lambda p, a: p <= a)
            ahead = sum(1 for r in paired if better(prec[r][key], appr[r][key]))
            parts.append(f"{title} {shown(pv)} vs {shown(av)} ({'holds' if ok else 'MISSED'}; "
                         f"precise as good or better in {ahead} of {len(paired)} rounds)")
        verdicts.append(f"- concurrency {conc}, precise ≥ approximate: " + "; ".join(parts))
    out += [
        "",
        "Both modes: mmrouter kv with exact accounting on 4 fresh sims per run (cold caches, the routing "
        "section's workload, timing model and prefill contention); precise = the sims publish KV events and the "
        "router follows them. Figures are medians over the rounds; the × columns are the median over the rounds "
        "of precise / approximate in the same round (lowest–highest in brackets). Each round runs both modes at "
        "every concurrency, the mode that goes first alternating. cached (sims) = Σ vllm:prefix_cache_hits_total "
        "/ Σ vllm:prompt_tokens_total; cached by route = the answers' usage (cached / prompt tokens) on exact "
        "plans and on text-prefix fallbacks; turns moved = follow-up turns sent to another worker than their "
        "conversation's previous turn (which recompute their history unless that worker holds it too), "
        "median over the rounds, of all follow-up turns; p50 / p99 = whole-response latency; prompt tokens "
        "per sim: the first round's.",
        "",
    ] + verdicts + [f"- not measured: {b}" for b in bad]


AFF_BASE = "noaff"  # the affinity section's rows are compared with the router without the credit
AFF_GOAL_TTFT = 0.7  # mean time to first token on the shared-images workload, × noaff and × sglang-router


def affinity_table(a, out):
    """Image affinity: shared images and the multimodal workload, rows in turns, ratios per round."""
    data, titles = {}, {}
    for wl, row, title, rnd, status, path, hits, prompt, split, pq, ph, eq, eh in read_tsv(a.affinity, 13):
        titles[row] = title
        r = load(path, P.name("affinity", wl, row, f"round {rnd}")) if status == "ok" else None
        if r is None:
            data.setdefault((wl, row), {})[rnd] = {"status": status}
            continue
        frac = lambda n, d: int(n) / int(d) if d and int(d) > 0 else None  # noqa: E731
        data.setdefault((wl, row), {})[rnd] = {
            "status": "ok", "ok": r["ok"], "sent": r["requests"], "ttft": r["ttfb_ms"]["mean"],
            "p50": r["latency_ms"]["p50"], "time": r["duration_secs"], "cached": frac(hits, prompt),
            "proc": frac(ph, pq), "enc": frac(eh, eq), "split": split,
        }
    median = statistics.median
    wls = in_order(k[0] for k in data)
    rows = in_order(k[1] for k in data)
    nrounds = len(in_order(r for v in data.values() for r in v))

    def per_round(wl, row, key, base):
        b, x = data.get((wl, base), {}), data.get((wl, row), {})
        return [x[r][key] / b[r][key] for r in x if r in b and x[r].get(key) and b[r].get(key)]

    def cell(vals, pct=False, unit=""):
        vals = [v for v in vals if v is not None]
        if not vals:
            return "-"
        m = median(vals)
        return f"{100 * m:.1f}%" if pct else f"{m:.1f}{unit}"

    out += [
        "",
        f"## Image affinity ({nrounds} round(s))",
        "",
        "| workload | row | ok/sent | mean TTFT ms | p50 ms | completion s | cached (sims) | processor-cache hits "
        "| encoder-cache hits | prompt tokens per sim | TTFT × no affinity | time × no affinity |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for wl in wls:
        for row in rows:
            rounds = data.get((wl, row), {})
            good = [f for f in rounds.values() if f["status"] == "ok"]
            if not good:
                bad = next((f["status"] for f in rounds.values()), "not run")
                out.append(f"| {wl} | {titles[row]} | {bad} |" + " |" * 9)
                continue
            ratio = lambda key: per_round(wl, row, key, AFF_BASE)  # noqa: E731
            rc = "1 (baseline)" if row == AFF_BASE else (
                f"{median(ratio('ttft')):.3f}× ({min(ratio('ttft')):.2f}–{max(ratio('ttft')):.2f})" if ratio("ttft") else "-")
            rt = "1 (baseline)" if row == AFF_BASE else (f"{median(ratio('time')):.3f}×" if ratio("time") else "-")
            out.append(
                f"| {wl} | {titles[row]} | {sum(f['ok'] for f in good)}/{sum(f['sent'] for f in good)} "
                f"| {cell([f['ttft'] for f in good])} | {cell([f['p50'] for f in good])} "
                f"| {cell([f['time'] for f in good])} | {cell([f['cached'] for f in good], True)} "
                f"| {cell([f['proc'] for f in good], True)} | {cell([f['enc'] for f in good], True)} "
                f"| {shares(good[0]['split'])} | {rc} | {rt} |")
    out += [
        "",
        "Every row on 4 fresh sims publishing KV events, with vLLM's processor and encoder caches modelled "
        f"(per-image preprocess {a.aff_preprocess_us:g} µs and encode 10 µs per image token, skipped on a hit; "
        f"prefill {a.prefill_us:g} µs per uncached token). shared = one-turn requests, each with its own system prompt and question around one "
        "of a few shared images (no text before an image is shared); multimodal = the routing section's "
        "workload. mean TTFT = the mean time to the first streamed chunk at the client; figures are medians "
        "over the rounds, ratios the median over the rounds of (row / the no-affinity row of the same round), "
        "lowest–highest in brackets; rows run in an order rotated each round. prompt tokens per sim: the first "
        "round's.",
        "",
    ]
    shared = [w for w in wls if w == "shared"]
    if shared and data.get(("shared", "aff")):
        v_no = per_round("shared", "aff", "ttft", AFF_BASE)
        v_sgl = per_round("shared", "aff", "ttft", "sgl")
        line = "- goal, shared images: mean TTFT "
        line += (f"{median(v_no):.3f}× without affinity (goal ≤ {AFF_GOAL_TTFT}: "
                 f"{'holds' if median(v_no) <= AFF_GOAL_TTFT else 'MISSED'})" if v_no else "- without affinity not measured")
        line += (f", {median(v_sgl):.3f}× sglang-router ({'holds' if median(v_sgl) <= AFF_GOAL_TTFT else 'MISSED'})"
                 if v_sgl else ", sglang-router not measured")
        out.append(line)
    if data.get(("multimodal", "aff")):
        c = per_round("multimodal", "aff", "cached", AFF_BASE)
        t = per_round("multimodal", "aff", "time", AFF_BASE)
        if c and t:
            ok = median(c) >= 1.0 and median(t) <= 1.0
            out.append(f"- goal, multimodal workload: cached {median(c):.3f}×, completion time {median(t):.3f}× "
                       f"without affinity (no worse: {'holds' if ok else 'MISSED'})")


PROM_RE = re.compile(r'^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{(.*)\})?\s+(\S+)')
LABEL_RE = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')


def prom(path):
    """[(name, {label: value}, value)] of a saved /metrics scrape; None when it is missing or empty."""
    if not path or not os.path.exists(path) or os.path.getsize(path) == 0:
        return None
    samples = []
    with open(path) as f:
        for line in f:
            m = PROM_RE.match(line.strip())
            if m and not line.startswith("#"):
                try:
                    samples.append((m.group(1), dict(LABEL_RE.findall(m.group(2) or "")), float(m.group(3))))
                except ValueError:
                    continue
    return samples


def prom_sum(samples, name, **labels):
    """Σ of a family's samples whose labels include `labels` (0 when absent)."""
    return sum(v for n, lab, v in samples if n == name and all(lab.get(k) == x for k, x in labels.items()))


DIS_BASE = "rr"  # both comparisons are stated against round-robin of the same round
DIS_GOAL_HITS = 1.8  # residency's encoder-cache hits × round-robin's, shared images
DIS_GOAL_SHARE = 1.5  # no encoder above this × the mean encoder's images, residency, every round


def disagg_figures(where, r, asked, scrapes, router):
    """One disagg run's figures from its loadgen report and the sims' and router's scrapes after it."""
    P.report(V, where, r, int(asked) if asked else None)
    f = {"status": "ok", "ok": r["ok"], "sent": r["requests"], "time": r["duration_secs"],
         "ttft": r["ttfb_ms"].get("mean"), "ttft50": r["ttfb_ms"].get("p50"), "ttft99": r["ttfb_ms"].get("p99"),
         "hits": 0, "queries": 0, "cached": 0, "prompt": 0, "per_encoder": [], "encoded": [], "fallbacks": None,
         "enc_served": None, "enc_skipped": None, "prefill_legs": None}
    for k, item in enumerate(x for x in scrapes.split(",") if x):
        role, _, path = item.partition("=")
        page = prom(path)
        fig = P.name(where, f"sim{k} ({role})")
        if page is None:
            V.fail(P.name(fig, "/metrics"), path, "no scrape of a sim after the run")
            continue
        if role == "prefill":
            hits, prompt = prom_sum(page, "vllm:prefix_cache_hits_total"), prom_sum(page, "vllm:prompt_tokens_total")
            if hits > prompt:
                V.fail(P.name(fig, "cached tokens"), hits, f"must be ≤ its prompt tokens {prompt:g}")
            f["cached"] += hits
            f["prompt"] += prompt
        elif role == "encode":
            q, h = prom_sum(page, "sim_encoder_cache_queries_total"), prom_sum(page, "sim_encoder_cache_hits_total")
            if h > q:
                V.fail(P.name(fig, "encoder-cache hits"), h, f"must be ≤ its queries {q:g}")
            f["queries"] += q
            f["hits"] += h
            f["per_encoder"].append(q)
            f["encoded"].append(prom_sum(page, "sim_image_encoded_tokens_total"))
    page = prom(router)
    if page is not None:
        # An encode leg skipped because every image is inside the prefill's cached prefix is the design, not
        # a failure: counted apart from the other fallbacks (failed or refused legs, smaller paths).
        skipped = prom_sum(page, "mmrouter_disagg_fallback_total", leg="encode", reason="cached_prefix")
        f["fallbacks"] = prom_sum(page, "mmrouter_disagg_fallback_total") - skipped
        f["enc_served"] = prom_sum(page, "mmrouter_disagg_legs_total", leg="encode", outcome="served")
        f["enc_skipped"] = skipped
        legs = {lab.get("worker"): v for n, lab, v in page if n == "mmrouter_worker_legs_total" and lab.get("leg") == "prefill"}
        f["prefill_legs"] = [legs[w] for w in sorted(legs, key=lambda w: (len(w), w))]
    per = f["per_encoder"]
    f["share"] = max(per) / (sum(per) / len(per)) if per and sum(per) > 0 else None
    f["hit_rate"] = f["hits"] / f["queries"] if f["queries"] else None
    f["cached_share"] = f["cached"] / f["prompt"] if f["prompt"] else None
    return f


def disagg_table(a, out):
    """Disaggregated serving on sims in roles: the prefill policy (multimodal workload) and the encoder
    policy (shared images), rows in turns, ratios per round against round-robin."""
    data, titles = {}, {}
    for cmp, row, title, rnd, status, path, asked, scrapes, router in read_tsv(a.disagg, 9):
        titles[(cmp, row)] = title
        where = P.name("disagg", cmp, row, f"round {rnd}")
        r = load(path, where) if status == "ok" else None
        if r is None:
            data.setdefault((cmp, row), {})[rnd] = {"status": status if status != "ok" else "n/a (no report)"}
            continue
        P.label_round(V, where, r.get("label", ""), rnd)
        data.setdefault((cmp, row), {})[rnd] = disagg_figures(where, r, asked, scrapes, router)
    median = statistics.median
    nrounds = len(in_order(r for v in data.values() for r in v))

    def good(cmp, row):
        return {k: f for k, f in data.get((cmp, row), {}).items() if f["status"] == "ok"}

    def per_round(cmp, row, key, base=DIS_BASE):
        b, x = good(cmp, base), good(cmp, row)
        vals = []
        for rnd in x:
            # A count of zero in either row (no hits at all) has no ratio; a negative figure is implausible.
            if rnd in b and x[rnd].get(key) and b[rnd].get(key):
                v = P.ratio(V, P.name("disagg", cmp, row, f"round {rnd}", f"{key} × {base}"), x[rnd][key], b[rnd][key])
                if v is not None:
                    vals.append(v)
        return vals

    def med(figs, key, fmt):
        vals = [f[key] for f in figs if f.get(key) is not None]
        return fmt(median(vals)) if vals else "-"

    def rel(cmp, row, key, spread=False):
        if row == DIS_BASE:
            return "1 (baseline)"
        vals = per_round(cmp, row, key)
        if not vals:
            return "-"
        return f"{median(vals):.3f}×" + (f" ({min(vals):.2f}–{max(vals):.2f})" if spread and len(vals) > 1 else "")

    pct = lambda v: f"{100 * v:.1f}%"  # noqa: E731
    one = lambda v: f"{v:.1f}"  # noqa: E731
    out += ["", f"## Disaggregated serving ({nrounds} round(s))", ""]
    heads = {
        "prefill": ("| prefill policy (multimodal workload) | ok/sent | mean TTFT ms | TTFT p50 | TTFT p99 | completion s "
                    "| prefill cached | prefill legs per worker | encode legs: sent / skipped | other fallbacks "
                    "| TTFT × round-robin | time × round-robin | cached × round-robin |"),
        "encode": ("| encoder policy (shared images) | ok/sent | mean TTFT ms | TTFT p50 | TTFT p99 | completion s "
                   "| encoder-cache hits | images per encoder | max share | TTFT × round-robin | time × round-robin "
                   "| hits × round-robin |"),
    }
    for cmp in in_order(k[0] for k in data):
        out += [heads[cmp], "|---" * heads[cmp].count(" | ") + "|---|"]
        for row in in_order(k[1] for k in data if k[0] == cmp):
            figs = list(good(cmp, row).values())
            title = titles[(cmp, row)]
            if not figs:
                bad = next((f["status"] for f in data[(cmp, row)].values()), "not run")
                out.append(f"| {title} | {bad} |" + " |" * (heads[cmp].count(" | ") - 1))
                continue
            cells = [f"{sum(f['ok'] for f in figs)}/{sum(f['sent'] for f in figs)}", med(figs, "ttft", one),
                     med(figs, "ttft50", one), med(figs, "ttft99", one), med(figs, "time", lambda v: f"{v:.2f}")]
            if cmp == "prefill":
                fb = [f["fallbacks"] for f in figs if f["fallbacks"] is not None]
                legs = "/".join(f"{v:g}" for v in figs[0]["prefill_legs"] or []) or "-"
                enc = (f"{med(figs, 'enc_served', lambda v: f'{v:g}')} / {med(figs, 'enc_skipped', lambda v: f'{v:g}')}")
                cells += [med(figs, "cached_share", pct), legs, enc, f"{sum(fb):g}" if fb else "-",
                          rel(cmp, row, "ttft", True), rel(cmp, row, "time"), rel(cmp, row, "cached_share")]
            else:
                hits = med(figs, "hits", lambda v: f"{v:g}") + " (" + med(figs, "hit_rate", pct) + ")"
                per = "/".join(f"{v:g}" for v in figs[0]["per_encoder"]) or "-"
                shares = [f["share"] for f in figs if f["share"] is not None]
                share = f"{median(shares):.2f} (max {max(shares):.2f})" if shares else "-"
                cells += [hits, per, share, rel(cmp, row, "ttft", True), rel(cmp, row, "time"), rel(cmp, row, "hits")]
            out.append(f"| {title} | " + " | ".join(cells) + " |")
        out.append("")
    out += [
        "Every run on a fresh pool of sims in roles sharing one EC storage directory, mmrouter in front "
        "(approximate mode), the simulator's default image and KV-transfer costs. TTFT = time to the first "
        "streamed chunk at the client (the encode, prefill and decode legs before it); figures are medians over "
        "the rounds, ratios the median over the rounds of (row / round-robin's figure in the same round), "
        "lowest–highest in brackets; rows run in an order rotated each round. prefill cached = Σ the prefill "
        "sims' vllm:prefix_cache_hits_total / Σ their vllm:prompt_tokens_total; prefill legs per worker = "
        "mmrouter_worker_legs_total{leg=\"prefill\"} (the first round's); encode legs sent / skipped = "
        "mmrouter_disagg_legs_total{leg=\"encode\",outcome=\"served\"} / mmrouter_disagg_fallback_total"
        "{leg=\"encode\",reason=\"cached_prefix\"} (every image already inside the chosen prefill's cached "
        "prefix), medians; other fallbacks = Σ the rest of mmrouter_disagg_fallback_total over the rounds "
        "(failed or refused legs); encoder-cache hits = Σ the encode sims' "
        "sim_encoder_cache_hits_total (% of their queries); images per encoder = each encode sim's "
        "sim_encoder_cache_queries_total (the first round's); max share = the busiest encoder's images / the "
        "mean encoder's (median over the rounds, the worst round in brackets).",
        "",
    ]
    if good("encode", "residency"):
        h = per_round("encode", "residency", "hits")
        shares = [f["share"] for f in good("encode", "residency").values() if f["share"] is not None]
        line = "- goals, shared images, encoders by residency: "
        line += (f"encoder-cache hits {median(h):.2f}× round-robin's (goal ≥ {DIS_GOAL_HITS}: "
                 f"{'holds' if median(h) >= DIS_GOAL_HITS else 'MISSED'})" if h
                 else "encoder-cache hits: no ratio (round-robin not measured, or a row without hits)")
        if shares:
            line += (f"; busiest encoder {max(shares):.2f}× the mean in the worst round (goal ≤ {DIS_GOAL_SHARE}: "
                     f"{'holds' if max(shares) <= DIS_GOAL_SHARE else 'MISSED'})")
        for base, name in ((DIS_BASE, "round-robin"), ("ring", "the hash ring")):
            t = per_round("encode", "residency", "ttft", base)
            if t:
                ahead = sum(1 for v in t if v < 1)
                line += (f"; mean TTFT {median(t):.3f}× {name}'s (goal < 1: {'holds' if median(t) < 1 else 'MISSED'}; "
                         f"lower in {ahead} of {len(t)} rounds)")
            else:
                line += f"; {name} not measured"
        out.append(line)
    if good("prefill", "kv"):
        c = per_round("prefill", "kv", "cached_share", "text")
        if c:
            ahead = sum(1 for v in c if v >= 1)
            out.append(f"- goal, multimodal workload: the exact-overlap prefill caches {median(c):.3f}× the text-prefix "
                       f"policy's share (goal ≥ 1: {'holds' if median(c) >= 1 else 'MISSED'}; as much or more in "
                       f"{ahead} of {len(c)} rounds)")
        else:
            out.append("- goal, multimodal workload: the text-prefix row not measured")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", required=True)
    ap.add_argument("--overhead", required=True)
    ap.add_argument("--throughput")
    ap.add_argument("--replicas")
    ap.add_argument("--precise")
    ap.add_argument("--affinity")
    ap.add_argument("--disagg")
    ap.add_argument("--params", required=True)
    ap.add_argument("--ttft-base-ms", type=float, required=True)
    ap.add_argument("--prefill-us", type=float, required=True)
    ap.add_argument("--aff-preprocess-us", type=float, default=20.0, help="the affinity sims' preprocessing µs per image token")
    ap.add_argument("--cores", type=int, default=os.cpu_count(), help="CPUs the run had (the CPU bound)")
    ap.add_argument("--clk-tck", type=int, default=os.sysconf("SC_CLK_TCK"), help="clock ticks per second")
    a = ap.parse_args()

    out = ["# mmrouter routing benchmark", "", a.params, ""]
    if read_tsv(a.rows, 7):
        main_table(a, out)
    if a.precise and read_tsv(a.precise, 8):
        precise_table(a, out)
    if a.affinity and read_tsv(a.affinity, 13):
        affinity_table(a, out)
    if a.disagg and read_tsv(a.disagg, 9):
        disagg_table(a, out)
    if read_tsv(a.overhead, 6):
        overhead_table(a, out)
    if a.throughput and read_tsv(a.throughput, 8):
        throughput_table(a, out)
    if a.replicas and read_tsv(a.replicas, 11):
        replicas_table(a, out)
    # Every figure has been checked: an implausible one means no report at all, not a report with it.
    if not V.ok():
        print("\n".join(V.failures), file=sys.stderr)
        print(f"report.py: {len(V.failures)} implausible figure(s); no report written", file=sys.stderr)
        sys.exit(2)
    print("\n".join(out))


if __name__ == "__main__":
    main()
