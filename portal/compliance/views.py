"""Compliance pages (role compliance), on the staff blueprint."""
