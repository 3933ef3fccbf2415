"""What both runner shells share to observe and test a rank: the flight recorder (heartbeats with
phase, iteration and, once a phase is old, the main thread's stack) and the test-only fault
injector."""
