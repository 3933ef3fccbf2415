"""The event log's I/O: the JetStream adapter (`log.EventLog`) and everything that touches a socket
or a file — the NATS protocol connection and its one frame parser (`wire`), ordered stream reads
(`consume`), pipelined acknowledged appends (`publish`), stream settings (`streams`) and export
files (`export`). The pure catalogue, State and fold live in `events/`.
"""
