#!/usr/bin/env python3
"""Builds bench/results/latest.md from the loadgen JSON reports written by bench/run.sh.

rows.tsv:     name, title, status ("ok" or "n/a (reason)"), report json, fallback count, sim TTFT ms
overhead.tsv: title, status, text report json, image report json
"""
import argparse
import json
import os


def load(path):
    if not path or not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def ms(v):
    return "-" if v is None else f"{v:.1f}"


def counts(m):
    return " ".join(f"{k}:{v}" for k, v in sorted(m.items())) or "-"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", required=True)
    ap.add_argument("--overhead", required=True)
    ap.add_argument("--params", required=True)
    ap.add_argument("--ttft-base-ms", type=float, required=True)
    ap.add_argument("--prefill-us", type=float, required=True)
    a = ap.parse_args()

    out = ["# mmrouter routing benchmark", "", a.params, ""]
    out += [
        "| run | ok/sent | errors | req/s | p50 ms | p99 ms | TTFB p50 | TTFB p99 | cached prompt tokens "
        "| sim TTFT ms | fallbacks | routes |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    with open(a.rows) as f:
        for line in f:
            name, title, status, path, fallbacks, ttft = (line.rstrip("\n").split("\t") + [""] * 6)[:6]
            r = load(path) if status == "ok" else None
            if r is None:
                reason = status if status != "ok" else "n/a (no report)"
                out.append(f"| {title} | {reason} |" + " |" * 10)
                continue
            if ttft:
                sim_ttft = f"{float(ttft):.1f}"
            elif r["ok"]:
                # The sims' timing model applied to the reported usage (they export no TTFT histogram).
                uncached = (r["prompt_tokens"] - r["cached_tokens"]) / r["ok"]
                sim_ttft = f"{a.ttft_base_ms + a.prefill_us * uncached / 1000:.1f} (from usage)"
            else:
                sim_ttft = "-"
            out.append(
                f"| {title} | {r['ok']}/{r['requests']} | {counts(r['errors'])} | {r['throughput_rps']:.2f} "
                f"| {ms(r['latency_ms']['p50'])} | {ms(r['latency_ms']['p99'])} | {ms(r['ttfb_ms']['p50'])} "
                f"| {ms(r['ttfb_ms']['p99'])} | {100 * r['cached_ratio']:.1f}% | {sim_ttft} "
                f"| {fallbacks or '-'} | {counts(r['routes'])} |"
            )
    out += [
        "",
        "cached prompt tokens = Σ usage.prompt_tokens_details.cached_tokens / Σ usage.prompt_tokens; "
        "fallbacks = Σ mmrouter_mm_fallback_total; routes = x-mmrouter-route counts (- when absent).",
        "",
        "## Proxy overhead (mean latency minus direct; zero-time sim, one non-streaming request at a time)",
        "",
        "| path | text mean ms | text p50 ms | text overhead ms | 150 KB image mean ms | image p50 ms "
        "| image overhead ms |",
        "|---|---|---|---|---|---|---|",
    ]
    base = {}
    with open(a.overhead) as f:
        rows = [(line.rstrip("\n").split("\t") + [""] * 4)[:4] for line in f]
    for title, status, text_path, image_path in rows:
        if status != "ok":
            out.append(f"| {title} | {status} |" + " |" * 5)
            continue
        cells = []
        for shape, path in (("text", text_path), ("image", image_path)):
            r = load(path)
            if r is None or not r["ok"]:
                cells += ["n/a", "n/a", "-"]
                continue
            mean, p50 = r["latency_ms"]["mean"], r["latency_ms"]["p50"]
            err = f" ({r['requests'] - r['ok']} failed)" if r["ok"] != r["requests"] else ""
            if title == "direct":
                base[shape] = mean
                over = "0 (baseline)"
            else:
                over = f"{mean - base[shape]:+.2f}" if shape in base else "-"
            cells += [ms(mean) + err, ms(p50), over]
        out.append(f"| {title} | " + " | ".join(cells) + " |")
    print("\n".join(out))


if __name__ == "__main__":
    main()
