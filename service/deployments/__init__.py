"""Deployments' serving configs and the risk rules they are checked against (the incident's root cause)."""
