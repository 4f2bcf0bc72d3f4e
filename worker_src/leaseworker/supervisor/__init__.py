"""`leaseworker run` as PID 1: run the worker as a child, and fence it at once if it dies
(docs/design.md §2e).

Small and boring, after krallin/tini: forward signals, reap zombies, exit with the child's status.
The one extra act, after an exit that was not a clean shutdown, is the confirmed fence (`fence`).
"""
