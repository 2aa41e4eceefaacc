"""The staff console: sign-in, roles, the audit trail and staff administration."""
