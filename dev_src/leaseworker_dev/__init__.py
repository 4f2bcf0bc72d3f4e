"""leaseworker's development package: the local fleet, the fault suite and the feed replays.

It sits beside the worker package (worker_src/leaseworker) and is never installed in the image:
the image ships the product alone. `leaseworker local …` is registered only when this package is
installed (leaseworker_dev/cli.py); `python -m leaseworker_dev.chaos` runs the fault suite.
"""
