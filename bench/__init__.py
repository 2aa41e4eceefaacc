"""By-hand benchmarks of the figures SPEC §6 asks for; ``python -m bench`` runs them all."""
