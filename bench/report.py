"""docs/benchmarks.md, generated from results.json by `make bench`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench import history, notes, previous
from bench import report_tables as tables
from bench.designs import DESIGNS
from bench.model import PRICE_DATE

COMMANDS = """\
    make bench                      # full mode (BENCH=quick for about 5 minutes)
    make bench BENCH=quick
    .venv/bin/python -m bench.run --mode quick --design session   # one design
    flock /tmp/lw-system.lock make bench BENCH=quick              # on a shared machine"""


def _targets(results: dict[str, Any]) -> list[str]:
    designs = results["designs"]
    lines = []
    session, connection = designs.get("session"), designs.get("connection")
    if session and connection:
        ratio = (
            session["measured"]["wru_per_connection_hour"] / connection["measured"]["wru_per_connection_hour"]
        )
        verdict = "met" if ratio <= 1 / 20 else "missed"
        lines.append(
            f"- Write units per connection-hour, session / connection at H = P = 5 s: 1/{1 / ratio:.0f} "
            f"(target <= 1/20): **{verdict}** at {session['connections']} connections on "
            f"{session['workers']} workers; per-worker costs (heartbeat, checkpoint item) are spread over "
            "more connections as a worker holds more, so the ratio improves with size (P4 table)."
        )
    per = results["listing"].get("rru_per_worker_heartbeat", {}) if results["listing"] else {}
    if per:
        values = list(per.values())
        same = max(values) - min(values) < 1e-9
        lines.append(
            "- Reads per worker per heartbeat independent of connections: "
            + ", ".join(f"{tables.fmt(v)} RRU at {k}" for k, v in per.items())
            + f": **{'met' if same else 'missed'}**."
        )
    supervised = designs.get("session+supervisor")
    if supervised and supervised["takeover_kill"]["n"]:
        kill = supervised["takeover_kill"]
        fast = [t for t in kill["samples"] if not isinstance(t, str)]
        bound = 1.5 + 1.0  # fence + hint + claim, plus about a second of connect time
        verdict = "met" if kill["n"] >= 30 and fast and max(fast) <= bound else "missed"
        lease_path = (session or {}).get("takeover_kill", {}).get("p99")
        seed_p99 = designs.get("seed", {}).get("takeover_kill", {}).get("p99")
        ratios = ", ".join(
            f"p99 {tables.ratio(kill['p99'], base)} of the {what}'s"
            for what, base in (("lease path", lease_path), ("seed", seed_p99))
            if isinstance(base, float | int) and not isinstance(kill["p99"], str)
        )
        lines.append(
            f"- SIGKILL of the worker child at LEASE 20 s, HEARTBEAT 5 s (unscaled): n {kill['n']}, "
            f"p50 {tables.fmt(kill['p50'])} s, p99 {tables.fmt(kill['p99'])} s, "
            f"max {tables.fmt(kill['max'])} s against 1.5 s + "
            f"connect, over >= 30 connections: **{verdict}**" + (f" ({ratios})." if ratios else ".")
        )
    if session:
        timings = session["timings_real"]
        bound = timings["lease"] + timings["heartbeat"]
        p99 = session["takeover_kill"]["p99"]
        if not isinstance(p99, str):
            verdict = "met" if p99 <= bound + 1 else "missed"
            lines.append(
                f"- L1 in session mode (SIGKILL): p99 {tables.fmt(p99)} s against LEASE + one heartbeat "
                "+ connect "
                f"= {bound:.0f} s + about 1 s: **{verdict}**."
            )
    return lines


def _scale_parts(results: dict[str, Any]) -> list[str]:
    """P5, P6, the simulator and P8 (each section has its heading and its targets), each from its own
    part of results.json (`--parts`), with the issue 25 sections of P5 and P6 after theirs."""
    from bench import delivery_report, p6_report
    from bench.capacity_report import p5_section, p6_section
    from bench.generic_vs_seqfeed import section as p8_section
    from bench.simulator.output import section as simulator_section

    lines: list[str] = []
    for key, render, image in (
        (
            "p5",
            lambda r: p5_section(r, previous.of(results, "p5")),
            "![RSS against connections](bench/rss.png)",
        ),
        ("p6", lambda r: p6_section(r, previous.of(results, "p6")), "![cold start](bench/cold_start.png)"),
        ("simulator", simulator_section, ""),
        ("p8", p8_section, ""),
    ):
        if key not in results:
            lines += [f"## {key}", "", f"Not in this results file: `--parts {key}`.", ""]
        else:
            body = [
                line.replace("](simulator.png)", "](bench/simulator.png)") for line in render(results[key])
            ]
            if key == "p5" and str(results[key].get("date", "")) < "2026-12-07":
                at = next((i for i, line in enumerate(body) if line.startswith("- >= ")), len(body))
                body[max(0, at - 1) : max(0, at - 1)] = history.P5_SUPERVISOR
            lines += [*body, "", *([image, ""] if image else [])]
        if key == "simulator":
            lines += [*history.SIMULATOR_HISTORY, "", *history.BUDGETS, ""]
        if key == "p5":
            lines += _extra(
                delivery_report.section(results.get("p5_limit"), previous.of(results, "p5_limit"))
            )
        if key == "p6":
            lines += _extra(p6_report.section(results.get("p6"), _p6_previous(results)))
    return lines


def _p6_previous(results: dict[str, Any]) -> dict[str, Any] | None:
    """The previous p6 run if it measured ceilings, else the seeded runs of 2026-12-05."""
    from bench.p6_report import ceiling_rows

    before = previous.of(results, "p6")
    if before is not None and ceiling_rows(before["value"]):
        return before
    return previous.of(results, "p6_target")


def _extra(lines: list[str]) -> list[str]:
    return [*lines, ""] if lines else []


def _issue25_failover(results: dict[str, Any]) -> list[str]:
    from bench import handoff_report, host_loss

    return [
        *_extra(handoff_report.section(results.get("p2"), previous.of(results, "p2"))),
        *_extra(host_loss.section(results.get("host_loss"), previous.of(results, "host_loss"))),
    ]


def write_report(results: dict[str, Any], doc: Path, out: Path) -> None:
    designs = results["designs"]
    machine = results["machine"]
    config = results["config"]
    missing = [d for d in DESIGNS if not d.available]
    lines = [
        "# Benchmarks",
        "",
        "Generated by `make bench` from `docs/bench/results.json`; do not edit by hand.",
        "",
        f"- Date: {results['date']} (prices as of {PRICE_DATE}: $0.625 per million WRU, "
        "$0.125 per million RRU, on demand)",
        f"- Machine: {machine['cpu']}, {machine['cores']} cores, Python {machine['python']}, "
        f"{machine['java']}, {machine['platform']}",
        f"- Mode `{results['mode']}`: {config['workers']} workers, {config['connections']} connections at "
        f"{config['feed_rate']} msg/s each, timings scaled x{config['scale']}, "
        f"steady window {config['steady_seconds']} s (scaled), {config['kills']} SIGKILLs and "
        f"{config['terms']} SIGTERMs of the busiest worker per design.",
        "- Every figure is in real (unscaled) units: rates measured in the scaled run are multiplied "
        "by the scale, "
        "times divided by it (so connect time, which does not scale, is overstated).",
        "- Designs: " + "; ".join(f"**{n}**: {r['note']}" for n, r in designs.items()),
        *[f"- Not run: **{d.name}** ({d.note})." for d in missing],
        "",
        "Commands:",
        "",
        COMMANDS,
        "",
        "## P3: DynamoDB units per connection-hour (H = 5 s, P = 5 s; checkpoints included)",
        "",
        *tables.p3(designs, tables.before(results)[0]),
        "",
        "Each operation the workers sent through the counting proxy in the steady window, priced by "
        "DynamoDB's rules (`bench/capacity.py`) and cross-checked by replaying one sample of each kind "
        "on DynamoDB Local "
        "with `ReturnConsumedCapacity=INDEXES`:",
        "",
        *tables.kinds(designs),
        "",
        "## P4: $/month of coordination",
        "",
        "Extrapolated from the per-kind rates and prices: per-connection kinds scale with connections, "
        "per-worker kinds (heartbeat, checkpoint item, queries) with workers, the checkpoint item's "
        "size with "
        "connections per worker, a session BatchGetItem with workers.",
        "",
        *tables.p4(designs),
        "",
        "![write and read units per connection-hour](bench/units.png)",
        "",
        "## Reads per worker per heartbeat (session mode)",
        "",
        *tables.listing(results["listing"]),
        "",
        "## P1, P2: takeover and handoff (real seconds, per connection)",
        "",
        *tables.failover(designs, tables.before(results)[0]),
        *([f"Previous run: {tables.before(results)[1]}."] if tables.before(results)[1] else []),
        "",
        "![takeover distributions](bench/takeover.png)",
        "",
        *_issue25_failover(results),
        "## P7: the hottest index partition",
        "",
        *tables.p7(designs),
        "",
        "![hottest index partition](bench/partition.png)",
        "",
        *_scale_parts(results),
        "## Targets",
        "",
        *_targets(results),
        "- P5's and P8's targets are judged in their sections above.",
        "",
        "## Notes",
        "",
        *notes.NOTES,
        "",
        "## Limits, misses and their causes",
        "",
        *notes.NOT_DONE,
        "",
    ]
    doc.write_text("\n".join(lines) + "\n")
