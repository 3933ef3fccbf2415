"""The long-lived runner process the worker spawns per rank: the engine plugged into the log.

One thread owns MLX (the main thread, running `tasks.serve`); a background thread owns an
asyncio loop with the NATS connection (`bridge.LogBridge`). They talk through thread-safe
methods and queues only.
"""
