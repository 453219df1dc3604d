"""Integrity events that engines notice themselves: KV-transfer checksum mismatches and the like."""
