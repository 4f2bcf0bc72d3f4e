"""Everything that runs the system on one machine with no AWS account."""
