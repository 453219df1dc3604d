"""Signed outgoing webhooks on new incidents, delivered from a durable outbox table."""
