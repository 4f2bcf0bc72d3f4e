"""docs/benchmarks.md's "P5 against its limit" from the `p5_limit` part (bench/delivery.py)."""

from __future__ import annotations

from typing import Any, Final

from bench.delivery import TARGET_RATIO
from bench.previous import shown

LABELS: Final = {
    "bare": "bare websockets loop (the limit)",
    "worker": "worker (as shipped)",
    "worker + uvloop": "worker + uvloop (not shipped)",
}
CANDIDATES: Final = [
    "- **Batching wake-ups: one receive timer per socket (kept, f76ae1c).** Every receive used to sit"
    " in `asyncio.timeout(...)` whenever a deadline was pending (the batch's 20 ms linger, or an "
    "adapter timer: idle, ping, rotation), which arms a timer handle and cancels it again for every "
    "frame. `worker/receive_deadline.py` keeps one timer per socket run that moves lazily: a later "
    'deadline (an idle timer is "last frame + idle") does not touch it, an early firing re-arms it '
    "for the deadline that stands then, and only a deadline really passed while the task waits "
    "cancels the receive. On 2026-12-06: sparse +24 % (7,300 -> 9,030), dense +10 % (17,029 -> "
    "18,755) on a feed with an idle timer; a feed with no adapter timer receives without any timer, "
    "as before.",
    "- **uvloop (measured, not shipped).** On 2026-12-06, against the same code on asyncio's loop: "
    "sparse +7 % in that run, +13 to +21 % in the earlier runs without an idle timer; dense within "
    "the spread. It was shipped for one commit and reverted: uvloop's transports are compiled types, "
    "so `no_linger.py`'s per-transport write guard (a sink write may not start past the lease's "
    "deadline, design.md §2d) is not installed on them, and the system test of a child paused past "
    "its lease caught a stale Kinesis delivery after the takeover. Shipping it needs that guard built"
    " another way first.",
    "- **orjson (measured 2026-12-06, not kept).** Per record, in isolation: decoding a frame 2.38 ->"
    " 0.72 µs, encoding a record 3.76 -> 0.38 µs, so about 5 µs of the worker's 50 µs (dense) to 110 "
    "µs (sparse) per message: 5-10 %. Not kept because it changes what a record carries: orjson "
    "decodes an integer beyond 64 bits into a float without an error (18446744073709551616 -> "
    "1.8446744073709552e+19; the cursor or trade id would no longer be what the upstream sent, "
    "design.md §5), and encodes NaN as `null` where a record must refuse it. Guarding both (a scan "
    "for long digit runs per frame, a fallback per record holding `null`) is possible and would keep "
    "part of the gain; not done here.",
]
TARGET_ABSOLUTE: Final = {"dense": 50_000.0, "sparse": 25_000.0}


def _ratios(value: dict[str, Any], name: str) -> dict[str, float] | None:
    medians = value["medians"]
    if name not in medians["dense"] or not medians["dense"].get("bare"):
        return None
    return {t: medians[t][name] / medians[t]["bare"] for t in ("dense", "sparse")}


def _label(value: dict[str, Any], name: str) -> str:
    return str(value.get("labels", {}).get(name) or LABELS.get(name) or name)


def verdicts(value: dict[str, Any]) -> dict[str, tuple[bool, float]]:
    """Per traffic: (worker / bare >= TARGET_RATIO, the ratio)."""
    ratios = _ratios(value, "worker") or {}
    return {traffic: (ratio >= TARGET_RATIO, ratio) for traffic, ratio in ratios.items()}


def _pct(new: float, old: float) -> str:
    return f"{100 * (new / old - 1):+.0f} %"


def section(result: dict[str, Any] | None, previous: dict[str, Any] | None) -> list[str]:
    """`result`: the `p5_limit` part's value (None: only the previous run is known);
    `previous`: {"date", "value"}."""
    chosen = shown(result, previous)
    if chosen is None:
        return []
    main, date, older = chosen
    config, medians = main["config"], main["medians"]
    lines = [
        f"### P5 against its limit: the delivery path beside a bare websockets loop (issue 25, {date})",
        "",
        "`bench/delivery.py` (`--parts p5_limit`): one consumer process at a time, fresh for each "
        "measurement, on the P8 upstream (one process on loopback, a Jetstream-like generic/1 feed, "
        "191-byte payloads). **bare** is the limit: the same number of websockets connections with the "
        "worker's receive settings (no compression, max_size 1 MiB, max_queue 4), each a loop that counts "
        "frames and discards them. **worker** is the real delivery path: ConnectionSessions "
        "(worker/session.py, worker/socket_run.py, worker/socket_actions.py), the generic/1 adapter, the "
        "file sink, on leases that do not lapse (DynamoDB is P3's subject). msgs/s per core = messages "
        "counted (bare) or acknowledged by the sink (worker) / the process's own CPU seconds. "
        f"Dense = {config['dense_connections']:,} connections × {config['dense_rate']:g} msg/s, sparse = "
        f"{config['sparse_connections']:,} × {config['sparse_rate']:g} msg/s (one frame per socket read). "
        "The feed config has an idle timer of 10 s (`keepalive.idle_timeout_s`, as the Coinbase and Kraken "
        "presets), so the adapter always has a timer pending. "
        f"Each figure is the median of {config['repeats']} "
        "run(s), variants alternating, on 2 cores shared with the upstream process (run to run spread "
        "about ±15 % on 2026-12-06)."
        + (f" Before = the code at {main['before_code']}." if main.get("before_code") else "")
        + " The run of 2026-12-06: `docs/bench/p5-delivery.json`.",
        "",
        "| variant | dense msgs/s per core | vs bare | sparse msgs/s per core | vs bare "
        "| dense vs bare, previous run | sparse vs bare, previous run |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    order = sorted(main["variants"], key=lambda v: (v["name"] != "bare", "before" not in v["name"]))
    for variant in order:
        name = variant["name"]
        ratios = _ratios(main, name) or {}
        old = _ratios(older["value"], name) if older else None
        cells = [f"{medians[t][name]:,.0f} | {ratios.get(t, 0.0):.2f}" for t in ("dense", "sparse")]
        prior = [f"{old[t]:.2f}" if old else "—" for t in ("dense", "sparse")]
        lines.append(f"| {_label(main, name)} | " + " | ".join(cells) + " | " + " | ".join(prior) + " |")
    if older:
        lines += ["", f"Previous run: {older['date']}, {older['value']['config']['name']} mode."]
    queue = main.get("max_queue") or (older["value"].get("max_queue") if older else None)
    lines += ["", "Each candidate on its own (measured 2026-12-06 unless this table says otherwise):", ""]
    lines += _candidates(queue)
    marks = verdicts(main)
    bare = {t: medians[t]["bare"] for t in ("dense", "sparse")}
    judged = "; ".join(
        f"**{t} {ratio:.3f}x bare: {'met' if ok else 'missed'}** (>= {TARGET_RATIO:g})"
        for t, (ok, ratio) in marks.items()
    )
    above = all(TARGET_ABSOLUTE[t] > bare[t] for t in bare)
    lines += [
        "",
        f"Targets (issue 25 item 1), the worker as shipped ({date}): {judged}. In absolute figures, "
        f"{TARGET_ABSOLUTE['dense'] / 1000:.0f}k msgs/s per core dense and "
        f"{TARGET_ABSOLUTE['sparse'] / 1000:.0f}k sparse are "
        + (
            "above what the bare websockets loop itself does on this machine "
            f"({bare['dense'] / 1000:.0f}k dense, {bare['sparse'] / 1000:.0f}k sparse per core), so they "
            "cannot be met here by any consumer built on websockets and asyncio."
            if above
            else f"against the bare loop's {bare['dense'] / 1000:.0f}k dense and "
            f"{bare['sparse'] / 1000:.0f}k "
            "sparse per core here."
        )
        + " Where the sparse time went on 2026-12-06 (cProfile of the worker, one frame per read): the "
        "websockets read path and asyncio's wake-up per frame are shared with bare; on top, per message, "
        "the generic/1 adapter (decode, unwrap, cursor, classify: ~20 %), the session's record and batch "
        "(~8 %), and the delivery of each message (the validity check, render, `os.write`, metrics: ~18 %), "
        "as an isolated frame is delivered at once rather than lingering 20 ms.",
    ]
    return lines


def _candidates(queue: dict[str, Any] | None) -> list[str]:
    lines = list(CANDIDATES)
    if queue:
        m = queue["medians"]
        name = next(v["name"] for v in queue["variants"] if v.get("max_queue"))
        size = next(v["max_queue"] for v in queue["variants"] if v.get("max_queue"))
        lines.append(
            "- **websockets settings (measured, not kept).** MAX_QUEUE_FRAMES, the receive queue's "
            f"high-water mark, is 4 (worker/upstream.py: it bounds the memory per connection). At {size}, in "
            f"a separate run ({queue['config']['repeats']} repeats, `--candidates max-queue-{size}`, "
            f"`docs/bench/p5-delivery-max-queue.json`): dense {m['dense'][name]:,.0f} against "
            f"{m['dense']['worker']:,.0f} ({_pct(m['dense'][name], m['dense']['worker'])}), sparse "
            f"{m['sparse'][name]:,.0f} against {m['sparse']['worker']:,.0f} "
            f"({_pct(m['sparse'][name], m['sparse']['worker'])}), both within the spread, so the bound "
            "stays. Compression stays off unless the upstream's config asks for it."
        )
    return lines
