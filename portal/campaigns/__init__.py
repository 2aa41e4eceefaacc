"""Campaigns and their deliveries: consent-checked fan-out, exactly once per subscription."""
