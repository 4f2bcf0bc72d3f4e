"""Dated text of docs/benchmarks.md that no `make bench` part measures: kept verbatim, rendered in place.

- P5_SUPERVISOR: a change after the p5 run of 2026-12-04 (shown while the p5 run predates 2026-12-07);
- SIMULATOR_HISTORY: the simulator's move to the real workers (issue 22, 2026-12-06), against the run
  before it;
- BUDGETS: issue 24's connect budgets, from `python -m bench.simulator.budgets` (not a part).
"""

from __future__ import annotations

P5_SUPERVISOR: list[str] = [
    "- Since 2026-12-07 `leaseworker run` has the supervisor preload its fence clients (botocore):",
    "  its RSS is 45.8 MB, measured alone (12.9 MB without), and a dead child is fenced in 2 ms",
    "  instead of 450 ms (docs/tuning.md §5). This run predates that.",
]

SIMULATOR_HISTORY: list[str] = [
    "What changed and why (issue 22, 2026-12-06). Until that run the simulator ran a copy of the",
    "worker's loops (`bench/simulator/worker.py`, `peers.py`, `bulk.py`: 607 lines, kept in step by",
    "hand); it now runs the real `Worker`s of `make sim`'s fleet, so it can no longer drift from the",
    "worker. The real workers cost far more CPU per simulated connection than the copy did, so the",
    "size went from 100,000 connections × 100 workers to 10,000 × 10: the same load per worker",
    "(1,000, then 1,111 after 10 % die), 1 death and 1 join instead of 10 and 10. Side by side with",
    "the previous run (copied loops, 100,000 × 100, 2026-12-04):",
    "",
    "| design | WRU per connection-hour, before -> now | RRU/s per worker, before -> now | "
    "convergence after deaths (s), before -> now | balanced after scale-out (s), before -> now "
    "|",
    "|---|---|---|---|---|",
    "| connection | 2880.7 -> 2765.2 | 10.30 -> 1.44 | 31.0 -> 29.5 | 48.0 -> 45.0 |",
    "| seed | 2880.7 -> 2792.3 | 10.21 -> 1.35 | 88.5 -> 68.5 | 544.5 -> 481.5 |",
    "| session | 18.1 -> 16.7 | 10.40 -> 1.54 | 24.5 -> 27.0 | 11.5 -> 46.5 |",
    "| session+supervisor | 18.1 -> 16.7 | 10.40 -> 1.54 | 5.0 -> 12.0 | 38.0 -> 47.5 |",
    "",
    "- RRU/s per worker fell about 7x: every worker reads every session item each heartbeat, so the",
    "  listing grows with the fleet (100 -> 10 workers), not with the connections.",
    "- Session mode's WRU per connection-hour: the checkpoint item, one entry per connection, is",
    "  priced by size; ids are as long as before (`feed-0000001`). The real checkpointer skips a round",
    "  with no new progress, and each feed here sends one message per checkpoint period.",
    "- Connection mode: each renewal costs 3 WRU (the expiry is the by-state-expiry index's sort key)",
    "  and each checkpoint with progress 1 WRU, as before; the real checkpointer writes only the",
    "  connections with new progress.",
    "- session+supervisor: the supervisor's confirmed fence is written at once, but no SQS hint",
    "  follows it here (the simulated fleet has no SQS), so the peers learn of it at their next",
    "  listing (a heartbeat, 5 s) and then claim by rendezvous rank; in production the hint comes",
    "  within a second.",
    '- The scenario now also starts cold (the real acquirer claims all 10,000: "cold start" is the',
    "  time until every connection is owned and no worker holds more than its share), judges the",
    "  sink's arrivals for S1 and S2 and every connection served at the end, and fails a design whose",
    "  worker crashed.",
    "- Found while making it: connection mode's lease keeper wakes once per lease per heartbeat (and",
    "  again after every answer), each time scanning all its leases: at 1,000 leases per worker that",
    "  is the run's largest CPU cost. Renewing the leases due within a tenth of a heartbeat together",
    "  cut the fleet's CPU per virtual second at 2,000 connections on 4 workers from 0.878 to 0.186 s",
    "  (renewals per second unchanged), and the connection and seed rows above were measured with it",
    "  (their CPU column; their units are the same either way). It was reverted before landing: with",
    "  it the fault suite's `ddb_stall` (connection mode, seed 2) failed twice in a row, the stalled",
    "  worker not fenced and so not exiting 3. That expectation rests on a race (peers must see its",
    "  heartbeat counter still for a whole lease, and its first heartbeat after the stall may land",
    "  just before), which the keeper's timing tips; it needs its own look (issue 25).",
    "- Balanced after scale-out, session mode, 11.5 -> 46.5 s: the copy balanced faster than the real",
    "  code does. The real acquirer hands back only an excess that two consecutive views agree on,",
    "  never a connection claimed within the last heartbeat, and in steps per reconcile",
    "  (`lease/rebalance.py`); one new worker took its 1,000 in about nine reconciles. Not tuned here:",
    "  the moves stay at the minimum (1,000 for 1,000 to move).",
]

BUDGETS: list[str] = [
    "## Connect budgets: reconnects after 10 worker deaths, paced (issue 24)",
    "",
    "100,000 connections over 100 upstream hosts, 100 workers; 10 die and their 10,000 connections",
    "(100 per host) are owned again by survivors at t = 0 (ownership itself: the table above); each",
    "must connect again. Virtual time, `python -m bench.simulator.budgets --out DIR` (seed 12): the",
    "real `ConnectBudgets` and `BudgetStore` per worker on the in-memory table; each host modelled as",
    "the replays' limit (429 beyond it, a 418 ban of 120 s after 10 refusals, and a ban drops every",
    "connection of the fleet to that host); a connect takes 0.1 s; without budgets a refused session",
    "only backs off (0.2 s doubling to 30 s, jittered).",
    "",
    "| upstream limit per host | budgets | all connected after | connects | 429 | 418 | peak "
    "per window | budget WRU / RCU per connect |",
    "|---|---|---|---|---|---|---|---|",
    "| Binance, 300 / 300 s | yes | 0.1 s | 10,000 | 0 | 0 | 100 | 0.60 / 0.60 |",
    "| Binance, 300 / 300 s | no | 0.1 s | 10,000 | 0 | 0 | 100 | — |",
    "| Coinbase, 8 / 1 s | yes | 43.2 s (predicted 43.3 s; 30.9 s with the 1 s slack before "
    "2026-12-07) | 10,000 | 0 | 0 | 8 | 0.65 / 4.19 |",
    "| Coinbase, 8 / 1 s | no | never (1,800 s run: every host banned again and again, all "
    "100,000 down at the end) | 12,000 | 900 | 8.7 M | 8 | — |",
    "",
    "- Binance: 100 lost connections per host fit one window of 300: the budget delays nothing and",
    "  costs one take per worker and host (about 0.6 WRU per connect: the lost connections of a host",
    "  are scattered over 90 survivors, one or two each).",
    "- Coinbase: 100 per host at 8 per second take 12 more counted windows of 3.61 s (the window,",
    "  the 0.5 s hold and the 2 s slack, rounded up by 1/32): 43.2 s, within docs/tuning.md §6's",
    "  term (43.3 s). The slack was 1 s (windows of 2.58 s, 30.9 s) until a CI run on a loaded host",
    "  met 429s: the 2026-12-07 CHANGELOG entry. Without budgets the first second's 92 surplus "
    "connects per host earn 429s, the quick",
    "  retries earn the ban, the ban drops the host's other 900 connections, and their reconnects",
    "  keep it banned: the storm the issue describes.",
    "- Polling cost: a worker waiting for a spent budget reads the item again when the first grant",
    "  lapses; with 90 workers waiting on one host that is up to 90 reads per lapse (4.2 RCU per",
    "  connect here). A takeover concentrated on few workers costs far less: 1 WRU + 1 RCU for 100",
    "  connects on one worker (tests/worker/integration/test_connect_budget.py).",
]
