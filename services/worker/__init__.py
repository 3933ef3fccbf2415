"""The worker: one per node; announces the node, heartbeats, and runs a runner process per rank."""
