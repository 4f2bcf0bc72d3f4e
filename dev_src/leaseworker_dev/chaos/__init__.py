"""The fault suite (issue 11): seeded nemeses against a local fleet, one arbiter, one verdict."""
