"""The subprocess cluster the end-to-end tests drive (shared with the benchmarks in bench/)."""

from bench.cluster import READY, Cluster, Proc, free_port, free_ring_base_port, kill_group, shoal_argv

__all__ = ["READY", "Cluster", "Proc", "free_port", "free_ring_base_port", "kill_group", "shoal_argv"]
