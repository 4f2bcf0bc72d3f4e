"""The worker process: one root TaskGroup running the lease loops and one session per connection."""
