"""leaseworker: long-lived upstream WebSocket feeds, each owned by one worker through a DynamoDB lease."""

__version__ = "0.1.0"
