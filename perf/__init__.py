"""Benchmarks and the routing simulator. Never imported by lbcore, shm, discovery or workers."""
