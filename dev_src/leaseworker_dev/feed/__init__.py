"""A local `seqfeed/1` upstream for tests and the local demo."""

from leaseworker_dev.feed.server import FAULT_AFTER, FAULT_MODES, FeedServer, data_for

__all__ = ["FAULT_AFTER", "FAULT_MODES", "FeedServer", "data_for"]
