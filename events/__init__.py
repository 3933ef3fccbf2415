"""shoal's event catalogue and fold: ids, subjects, codec, State, the pure `apply` and `Folder`.

Pure data only: no sockets, no asyncio, no NATS, no mlx (a house-rules test holds it). The log's
I/O lives in `eventlog/`.
"""
