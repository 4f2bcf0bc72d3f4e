"""Rendezvous ranking: stable, identical on every worker, and spreading a dead worker's load evenly."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter

import pytest

from leaseworker.lease.rendezvous import claim_delay, rank, weight

WORKERS = [f"worker-{i}" for i in range(10)]
IDS = [f"feed-{i:04d}" for i in range(1000)]
# Chi-square critical value at p = 0.001: 8 degrees of freedom (9 survivors), 9 (10 workers).
CHI2_CRITICAL = {8: 26.12, 9: 27.88}


def chi_square(counts: Counter[str], categories: list[str], total: int) -> float:
    expected = total / len(categories)
    return sum((counts[c] - expected) ** 2 / expected for c in categories)


def test_ranking_is_pinned_to_blake2b_not_the_salted_builtin_hash() -> None:
    assert weight("conn-1", "w-a") == 11584321060706315861
    assert rank("conn-1", ["w-a", "w-b", "w-c", "w-d"]) == ["w-b", "w-d", "w-a", "w-c"]


def test_ranking_is_the_same_in_another_process_with_another_hash_seed() -> None:
    code = f"from leaseworker.lease.rendezvous import rank; print(','.join(rank('feed-7', {WORKERS!r})))"
    outputs = {
        subprocess.run(
            [sys.executable, "-c", code],
            env={"PYTHONHASHSEED": seed},
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        for seed in ("1", "2")
    }
    assert outputs == {",".join(rank("feed-7", WORKERS))}


def test_order_of_input_and_duplicates_do_not_matter() -> None:
    for cid in IDS[:50]:
        assert rank(cid, WORKERS) == rank(cid, list(reversed(WORKERS)) + WORKERS[:3])
        assert sorted(rank(cid, WORKERS)) == sorted(WORKERS)


def test_removing_a_worker_keeps_the_relative_order_of_the_others() -> None:
    dead = WORKERS[3]
    survivors = [w for w in WORKERS if w != dead]
    for cid in IDS:
        assert rank(cid, survivors) == [w for w in rank(cid, WORKERS) if w != dead]


def test_first_choices_are_balanced_over_all_workers() -> None:
    counts = Counter(rank(cid, WORKERS)[0] for cid in IDS)
    assert chi_square(counts, WORKERS, len(IDS)) < CHI2_CRITICAL[9], counts


def test_a_dead_workers_connections_spread_evenly_over_the_survivors() -> None:
    dead = WORKERS[0]
    # The dead worker's connections: the ids for which it was first choice, topped up with
    # others so that 1,000 ids are redistributed (a worker holds whatever it was given).
    held = [cid for cid in IDS if rank(cid, WORKERS)[0] == dead]
    held += [f"extra-{i}" for i in range(1000 - len(held))]
    survivors = WORKERS[1:]
    counts = Counter(rank(cid, survivors)[0] for cid in held)
    assert sum(counts.values()) == 1000
    assert chi_square(counts, survivors, 1000) < CHI2_CRITICAL[8], counts
    assert max(counts.values()) < 1000 / len(survivors) * 1.5


@pytest.mark.parametrize("cid", IDS[:20])
def test_claim_delay_is_k_steps_for_the_kth_choice(cid: str) -> None:
    order = rank(cid, WORKERS)
    delays = {w: claim_delay(cid, w, WORKERS, 0.25) for w in WORKERS}
    assert delays == {w: k * 0.25 for k, w in enumerate(order)}
    assert [w for w, d in delays.items() if d == 0] == [order[0]]


def test_claim_delay_ranks_me_even_when_my_session_is_not_listed_yet() -> None:
    others = WORKERS[1:]
    me = WORKERS[0]
    for cid in IDS[:50]:
        assert claim_delay(cid, me, others, 1.0) == rank(cid, WORKERS).index(me)
