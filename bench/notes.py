"""The prose of docs/benchmarks.md's "Notes" and "Limits, misses and their causes": dated findings."""

from __future__ import annotations

NOTES: list[str] = [
    "- The seed row runs our worker with the seed's parameters (connection mode, reconcile 60 s, no "
    "skew allowance, no hints); it is not the seed's code, so it already has our fencing and deadlines, "
    "and fixes to our reconcile show in its row too: its P1 p99 was 79.0 s in the 2026-12-04 "
    "afternoon run and is 43.0 s since a reconcile claims in batches until it is full (one "
    "reconcile now takes all of a dead worker's expired leases instead of part of them).",
    "- DynamoDB Local reports 0 read units for a Query that returns nothing; DynamoDB charges the "
    "minimum (0.5 RRU, eventually consistent), which is what the rules column and every total use.",
    "- Failed conditional writes (lost races) cost 1 WRU each on DynamoDB; the steady window has "
    "almost none, and they are counted under their kind at the successful price.",
    "- Session-mode takeover tail (diagnosed with `--keep`, 2026-12-03): the fence lands L to L + H "
    "after the kill and most claims follow within 30 ms, but a few connections are claimed one or "
    "two peers rounds (heartbeats) later, beyond L + H. Part of the tail is an artefact of scaling: "
    "the rendezvous step `TAKEOVER_STEP_SECONDS = 0.25` (worker/peers.py) does not scale with the "
    "timings, so each rank's delay reads as 0.25 / scale s real (1 s at x0.25).",
    "- P2 tails: the quick run of 2026-12-03 had connection and session P2 at 13-15 s p99 (a "
    "handoff's last connections waited for a reconcile: every survivor counted itself full by "
    'lagging published loads). Since handoff hints (`"reason":"handoff"`, claimed above '
    "the fair share), the drained last long poll and the load published before a rebalance "
    "release, both are about 1 s at p99 (this run). The seed's tails (P1 above L + R, P2 near R) "
    "are its 60 s reconcile without hints.",
    "- Scaled runs on a 2-core machine shared with DynamoDB Local, the feed and 4 workers: any "
    "scheduling delay is multiplied by 1/scale when converted to real seconds.",
]

NOT_DONE: list[str] = [
    "- The run of 2026-12-08 (parts designs, p2, host_loss, p5_limit and p6; p5, p8 and the "
    "simulator are earlier runs) was made on a machine about twice as slow as on 2026-12-04/05: "
    "DynamoDB Local's measured write ceiling is 385-480 writes/s (716 on 2026-12-05), and the bare "
    "websockets loop does 21,380 msgs/s per core dense (31,443 on 2026-12-06). The code of "
    "2026-12-05 measured as slow as today's on that machine (P2, 2026-12-07 A/B: p50 439 against "
    "479 ms), so the slower rows are the machine's. Read the ratios (vs bare, vs seed, vs ceiling) "
    "rather than the absolute figures. Reads per worker per heartbeat now grow with the connections a "
    "worker holds (3.55 RRU at 100, 4.06 at 2,000; 3.49 at both before): the anti-entropy audit "
    "(worker/audit.py: one Query of the worker's own by-owner partition every 6 heartbeats) and the "
    "fleet's absent-owner sweep (worker/absent_owners.py: one Scan of by-owner per 3 L for the whole "
    "fleet), both safety nets added since 2026-12-04 so that session mode never strands a "
    "connection. At 2,000 connections on 4 workers they cost about 0.5 RRU per worker per heartbeat, "
    "about $0.13 a month. P6's 9-worker session row took 116.9 s (43.3-49.5 s on 2026-12-05) with "
    "13.8 ms of worker CPU per claim (4.2): more than the machine's factor of 2, and not traced yet; "
    "connection mode at 3 workers never held all 10,000 at once, as 10,000 renewals every 5 s need "
    "2,000 writes/s against a ceiling of 476.",
    "- P5 (full run of 2026-12-04 18:00, after the hot-path change: no timer per write for sinks "
    "that never suspend; the evening's coordination changes do not touch the delivery path, and "
    "P5 was not rerun after them): one process now holds all 10,000 connections (6,066-6,287 in the "
    "morning's run) at 25.7 KB marginal. Sparse traffic (one frame per socket read) stays "
    "below 20,000 msgs/s per core (16,981 file, 19,171 null at 5,000 x 1/s; 7,354-7,531 "
    "before): websockets' frame parsing, asyncio's read path and a task wake-up per frame. At "
    "10,000 x 1/s the worker uses its whole core (0.84-0.98) and delivers 92-93 % of the "
    "offered load, on 2 cores shared with the feed and DynamoDB Local.",
    "- P2 (issue 25 runs of 2026-12-05, production timings, `bench/handoff_trace.py`): p99 244 and "
    "256 ms in two runs against 250 ms, **borderline** (292-299 ms before, same hour); the scaled "
    "fleet's 0.84-0.86 s rows are 0.2 s of wall time divided by the x0.25 scale. The remaining time "
    "is two DynamoDB Local writes per connection (release, claim) for 20 connections at once, and the"
    " local SQS endpoint's per-message cost, on 2 shared cores.",
    "- P6 (issue 25 runs of 2026-12-05, `--mode target`): **missed**, 43.3-49.5 s for 10,000 on 9 "
    "session-mode workers against 20 s (and 4 workers is impossible in session mode since the "
    "checkpoint item holds 1,117 entries). Lost claim races were the cause of the earlier shortfall "
    "(69 % of the writes; now under 1.5 %, rendezvous-partitioned claims); the remaining cause is CPU"
    " on a shared 2-core machine (6.9 ms per claim over DynamoDB Local, the feed and the workers, 4.2"
    " ms of it in the workers), not DynamoDB Local's write ceiling (716 writes/s measured in the same"
    " run, 231 claims/s reached). Previous run: P6 (full run of 2026-12-04 19:40): claims run at "
    "360-373/s in session mode, 60-62 % of DynamoDB Local's ~600 writes/s, and at 203/s in connection"
    " mode, where the renewals of the connections already owned share the same writes. Two fixes of "
    "ours since the 18:00 run: a reconcile claims in batches until it is full (every peer raced for "
    "one query's candidates and the rest of the share waited a whole period: session 31 -> 21 s for "
    "7,602 and 46 -> 27 s for 10,000, connection 101 -> 67 s), and 32 claims in flight per worker "
    "instead of 16 (connection 67 -> 49-51 s; session unchanged, so not bound by it). The rest is the"
    " machine: vmstat shows both cores 90-100 % busy (user + system) through the claims, shared by "
    "DynamoDB Local's JVM, the feed's 10,000 WebSocket accepts and 3-4 workers. Session mode then "
    "capped MAX_CONNECTIONS at 2,534 per worker (the checkpoint item's 400 KB), so 3 workers held "
    "7,602 of 10,000.",
    "- P8 (generic/1 against seqfeed/1, quick run of 2026-12-05): memory per connection is "
    "within 2 % (one parsed generic/1 config is now shared by the sessions that use it: 28.1 -> "
    "25.6 KB), but msgs/s per core is 0.77x seqfeed/1's at full speed (0.66x before the generic/1 "
    "hot-path changes; GenericSocket.on_frame now costs what seqfeed/1's does). Most of the rest "
    "is the session serialising every record's checkpoint cursor (session.add_record -> "
    "_checkpoint_text -> json.dumps, which builds an encoder per call): with an int fast path there "
    "P8 measured 0.89x. Not changed yet: worker/session.py is the lead's.",
    "- Simulator (full run of 2026-12-04 20:05): every design now balances after 10 workers "
    "join, with about the minimum of moves (10,000-10,545 for 10,000 to move): session 11.5 s, "
    "session+supervisor 38 s, connection 48 s, seed 545 s (its 60 s reconcile). Before, none did "
    "within its limit (max load 1,121-1,148 against 1,000). Traced on a 10,000-connection run: "
    "full survivors claimed the shedders' releases above their share (the rule meant for free "
    "connections nobody has room for), shedding stopped whenever anything was free (the "
    "shedders' own releases always were), and peers' claims reached their published load only at "
    "their next heartbeat, so each view underestimated the fleet. Fixed in worker/ and mirrored "
    "here: claims above the share only for the free connections no peer has room for; no "
    "shedding while those wait or during a takeover, and never a connection claimed within the "
    "last heartbeat; claims published within 0.25 s; the sessions listed after the free count "
    "whenever it finds any. Convergence after 10 deaths improved with it: seed 142.5 -> 88.5 s, "
    "connection 36.0 -> 31.0 s (session 24.5 s and session+supervisor 5.0 s unchanged). The "
    "simulator then ran a copy of worker/'s loops; since 2026-12-06 it runs the real workers "
    "(issue 22), at 10,000 connections and 10 workers. Listing reads grow with the fleet: 10.4 "
    "RRU/s per worker at 100 workers (every worker reads every session item each heartbeat), "
    "1,040 RRU/s for the fleet.",
]
