"""Consent: topics, policy versions, tri-state preferences and the consent log."""
