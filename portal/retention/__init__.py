"""The data lifecycle: ageing sweeps, tombstones, purge and erasure (seed 000 §8)."""
