"""`python -m leaseworker` is the `leaseworker` command."""

from leaseworker.cli.main import main

main()
