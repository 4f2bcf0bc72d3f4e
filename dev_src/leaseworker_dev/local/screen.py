"""What the live view draws, fitted to the terminal: the key bar is never cut off.

Rich's Live display cuts whatever is taller than the terminal from the bottom, where the key bar
is (the last line). So `render` measures the parts and gives up the least useful first: the legend, then the
timings line, then rows of the connections table (the last row then says how many are not
shown), and the event log gets what is left (at least its title and two lines when possible).

The checkpoint column is the effective checkpoint (docs/design.md §2b), as `connections list`
shows it: the newer of the item's `last_seq` and its owner's batched checkpoint entry, computed
by `LeaseTableAdmin.snapshot` (lease/admin.py). In session mode the item's `last_seq` moves only
on a release or a claim, so showing it made checkpoints look stuck.
"""

from __future__ import annotations

import signal
import time
from typing import TYPE_CHECKING

from rich import box
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from leaseworker.lease.vocabulary import SESSION_HELD
from leaseworker_dev.local.events import checkpoint_of, fault_bound_s, fault_name
from leaseworker_dev.local.replays import protocol_label

if TYPE_CHECKING:
    from leaseworker_dev.local.view import LiveView

EVENT_LINES_MIN = 3  # the title and two events
STYLES = {
    "fault": "bold red",
    "taken over": "bold green",
    "handed off": "bold cyan",
    "acquired": "green",
    "released": "cyan",
    "lost": "yellow",
    "self-fenced": "bold yellow",
    "gap": "bold magenta",
    "resumed": "bold blue",
    "note": "dim",
    "auto": "bold magenta",
}
LEGEND = (
    "checkpoint = what a takeover resumes after: the newer of the item's last_seq and its owner's "
    "batched checkpoint (session mode); lag = highest seq in the sink − checkpoint: delivered, not "
    "yet checkpointed. hb age, load, session: from each worker's session item (its last heartbeat; "
    "fenced confirmed = its supervisor saw it die, suspected = a peer saw its heartbeat stop). "
    "taken over / handed off = signal → new subscribe seen by the feed (or replay). self-fenced "
    "comes from the worker's own log. gap = a gap marker in the sink (a feed that cannot replay "
    "marks every hole: reason, duration, cursors before→after); resumed = a replayable feed "
    "moved without one. generic/1 seqs count per epoch from 0."
)


def render(view: LiveView) -> RenderableType:
    console = view.console
    height = console.height - 1  # the line the cursor sits on

    def lines(*parts: RenderableType) -> int:
        return sum(len(console.render_lines(part, console.options, pad=False)) for part in parts)

    title, timings = header(view)
    keys, legend, measured = key_bar(view), Text(LEGEND, style="dim"), failovers(view)
    spare = height - lines(title, measured, keys) - EVENT_LINES_MIN
    rows = len(view.monitor.items)
    limit = None if rows <= spare else max(0, spare - lines(_body(view, 0)))  # a row takes a line or more
    body = _body(view, limit)
    body_lines = lines(body)
    while body_lines > spare and limit != 0:  # a wrapped last_error takes more than a line
        limit = max(0, (rows if limit is None else limit) - (body_lines - spare))
        body = _body(view, limit)
        body_lines = lines(body)
    spare -= body_lines
    shown: dict[str, bool] = {}
    for name, part in (("legend", legend), ("timings", timings)):
        needed = lines(part)
        shown[name] = needed <= spare
        spare -= needed if shown[name] else 0
    room = EVENT_LINES_MIN - 1 + max(0, spare)  # without the events' title
    parts: list[RenderableType] = [title, *([timings] if shown["timings"] else []), body, measured]
    parts += [events(view, room), *([legend] if shown["legend"] else []), keys]
    return Group(*parts)


def _body(view: LiveView, limit: int | None) -> RenderableType:
    workers = workers_table(view)
    conns = connections_table(view, limit)
    if view.console.width >= 220:  # the connections table alone is about 125 wide
        grid = Table.grid(padding=(0, 3))
        grid.add_row(workers, conns)
        return grid
    return Group(workers, conns)


def failovers(view: LiveView) -> Text:
    text = Text()
    text.append("failovers: ", style="bold")
    if not view.monitor.faults:
        text.append("none yet — press k, h, p or t (or wait for the automatic ones)", style="dim")
    for fault in view.monitor.faults[-3:]:
        bound = fault_bound_s(view.fleet, fault.kind)
        text.append(f"\n  {fault_name(fault.kind)} {fault.worker}: ")
        if not fault.epochs:
            text.append("it held no connections", style="dim")
            continue
        ok = fault.max_s <= bound
        state = "" if fault.closed else " so far"
        text.append(
            f"{len(fault.times_s)}/{len(fault.epochs)} {fault.measured_as}{state}, "
            f"max {fault.max_s:.2f} s (bound {bound:.1f} s)",
            style=("green" if ok else "red") if fault.closed else "yellow",
        )
    return text


def header(view: LiveView) -> tuple[Text, Text]:
    """The fleet's endpoints (always shown), and its timings (shown when there is room)."""
    fleet = view.fleet
    t = fleet.timings
    up = time.monotonic() - view.started
    text = Text()
    text.append("leaseworker local fleet", style="bold")
    text.append(
        f"  up {int(up) // 60:02d}:{int(up) % 60:02d}  ·  DynamoDB Local {fleet.endpoint}  ·  "
        f"feed {fleet.feed_url}  ·  sink {fleet.sink_dir}"
    )
    if fleet.replay_urls:
        text.append("\nreplays: " + "  ·  ".join(f"{feed} {url}" for feed, url in fleet.replay_urls.items()))
    timings = Text(
        f"FAST timings: lease {t.lease_seconds:g} s, heartbeat {t.heartbeat_seconds:g} s, reconcile "
        f"{t.reconcile_seconds:g} s, skew {t.max_clock_skew_ms} ms → a crashed worker child's "
        f"connections are taken over within ≈ {fault_bound_s(fleet, 'crash'):.1f} s, a lost host's "
        f"within ≈ {fault_bound_s(fleet, 'kill'):.1f} s; a graceful stop hands off in "
        f"≈ {fault_bound_s(fleet, 'terminate'):g} s",
        style="dim",
    )
    return text, timings


def session_text(state: str) -> Text:
    return Text(state, "red" if state.startswith("fenced") else "dim" if state == "withdrawn" else "")


def workers_table(view: LiveView) -> Table:
    table = Table(box=box.SIMPLE_HEAD, title="workers", title_justify="left", pad_edge=False, show_edge=False)
    numbers = ("owned", "load", "msg/s", "delivered")
    columns = ("worker", "pid", "status", "owned", "load", "msg/s", "hb age", "session", "delivered")
    for column in columns:
        table.add_column(column, justify="right" if column in numbers else "left")
    for name, worker in view.fleet.workers.items():
        stats = view.monitor.workers.get(name)
        code = worker.process.popen.poll()
        if code is None:
            status = Text("paused", "yellow") if name in view.paused else Text("alive", "green")
        elif code == -signal.SIGKILL:
            status = Text("killed", "red")
        elif code == 128 + signal.SIGKILL:  # its supervisor exits with the child's status
            status = Text("killed (child)", "red")
        else:
            status = Text(f"exited {code}", "dim")
        age = stats.heartbeat_age_s if stats else None
        table.add_row(
            name,
            str(worker.pid),
            status,
            str(stats.owned if stats else 0),
            "-" if stats is None or stats.load is None else str(stats.load),
            f"{stats.rate:.0f}" if stats else "0",
            "-" if age is None else f"{age:.1f} s",
            session_text(stats.session if stats else "-"),
            str(stats.delivered if stats else 0),
        )
    return table


def connections_table(view: LiveView, limit: int | None = None) -> Table:
    """Every connection, or the first `limit` and a last row saying how many more there are."""
    table = Table(
        box=box.SIMPLE_HEAD, title="connections", title_justify="left", pad_edge=False, show_edge=False
    )
    numbers = ("epoch", "checkpoint", "lag", "gaps")
    columns = ("connection", "state", "owner", "epoch", "checkpoint", "lag", "protocol", "gaps", "lease")
    for column in (*columns, "last_error"):
        table.add_column(
            column, justify="right" if column in numbers else "left", no_wrap=column != "last_error"
        )
    now = time.time() * 1000
    items = sorted(view.monitor.items.items())
    shown = items if limit is None else items[:limit]
    for cid, item in shown:
        expires = int(item.get("lease_expires_at_ms", 0) or 0)
        owner = item.get("lease_owner")
        if not owner or expires == 0:
            lease = Text("free", "yellow")
        elif expires == SESSION_HELD:
            lease = Text("session")  # live while its owner's session is (docs/design.md §2b)
        elif expires > now:
            lease = Text(f"{(expires - now) / 1000:.1f} s left")
        else:
            lease = Text(f"expired {(now - expires) / 1000:.1f} s", "red")
        lag = view.monitor.lag(cid)
        protocol = protocol_label(item)
        conn = view.monitor.conn_stats.get(cid)
        gaps = "-" if protocol == "seqfeed/1" else str(conn.gaps if conn else 0)
        table.add_row(
            cid,
            str(item.get("desired_state", "?")),
            str(owner or "-"),
            str(item.get("lease_epoch", 0)),
            str(checkpoint_of(item)),
            "-" if lag is None else str(lag),
            Text(protocol, "dim" if protocol == "seqfeed/1" else "bold"),
            gaps,
            lease,
            str(item.get("last_error") or ""),
        )
    if len(shown) < len(items):
        table.caption = f"… and {len(items) - len(shown)} more (a taller terminal shows them)"
        table.caption_justify = "left"
    return table


def events(view: LiveView, room: int) -> Table:
    table = Table(box=None, title="events", title_justify="left", show_header=False, pad_edge=False)
    # Fixed widths for the stamp and the kind: a long event text is cut, never they.
    table.add_column("t", style="dim", no_wrap=True, min_width=10)
    table.add_column("kind", no_wrap=True, min_width=11)
    table.add_column("what", no_wrap=True, overflow="ellipsis")
    for event in list(view.monitor.events)[-room:]:
        style = STYLES.get(event.kind, "")
        table.add_row(event.stamp(), Text(event.kind, style), Text(event.text, style))
    return table


def key_bar(view: LiveView) -> Text:
    target = view.target() or "-"
    paused = sorted(view.paused)
    pause = f"resume {paused[0]}" if paused else f"pause {target}"
    text = Text()
    text.append("keys: ", style="bold")
    text.append(
        f"k kill {target}'s child  h host-kill {target}  p {pause}  t terminate {target}  "
        f"a add worker  c add connection  s stop {view.stop_target() or '-'}  q/Ctrl-C quit"
    )
    return text
