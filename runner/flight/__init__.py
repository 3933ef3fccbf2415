"""What both runner shells share to observe and test a rank: the flight recorder (`recorder`: a
thread that reads the phase, iteration and, once a phase is old, the main thread's stack, and hands
each reading to the shell's destination) and the test-only fault injector (`faults`)."""
