"""The `leaseworker` command line: the same control plane for local runs and AWS."""
