"""Incidents: findings of one model and deployment grouped over time, with a responder's lifecycle."""
