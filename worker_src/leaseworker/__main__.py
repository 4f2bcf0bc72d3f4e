"""`python -m leaseworker` is the `leaseworker` command."""

import sys

if sys.argv[1:3] == ["run", "--child"]:  # the supervisor's child (cli/run.py child_argv)
    from leaseworker import early_stop

    early_stop.hold()  # before the slow imports: a SIGTERM during start-up is a stop, not a death

from leaseworker.cli.main import main

main()
