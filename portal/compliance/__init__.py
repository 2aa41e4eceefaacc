"""Compliance work: consent look-ups, verifiable exports, the dashboard, staff erasure."""
