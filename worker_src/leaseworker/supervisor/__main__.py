"""`python -m leaseworker.supervisor`: exit with the child's status, whatever threads still run."""

import os
import sys

from leaseworker.supervisor.main import main

status = main()
sys.stdout.flush()
sys.stderr.flush()
# os._exit, not sys.exit: a fence call still in flight past its deadline must not delay the exit.
os._exit(status)
