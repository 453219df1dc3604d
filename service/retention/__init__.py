"""Retention of what the database holds, and the purge of everything held about one tenant."""
