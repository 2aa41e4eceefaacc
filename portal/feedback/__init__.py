"""The delivery-feedback receiver: signed digests of provider outcomes (seed 004)."""
