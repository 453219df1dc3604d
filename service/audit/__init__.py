"""The append-only audit log: every read of findings and incidents and every change, by API key."""

from service.audit.log import about, configure, filters, record, tenant_hash

__all__ = ["about", "configure", "filters", "record", "tenant_hash"]
