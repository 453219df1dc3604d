"""Every Redis key bleedwatch writes, built in one place.

Layout (``p`` is ``BLEEDWATCH_KEY_PREFIX``, ``ns`` a fingerprint key id):

- ``p:{p:tenants}:names`` / ``:seq``      tenant name -> small integer ref (kept forever)
- ``p:doc-seq``                           document ref counter
- ``p:doc:<ns>:<ref>``                    metadata of one document, TTL = retention
- ``p:done:<digest>``                     idempotency mark of (tenant, request id), TTL = retention
- ``p:{<ns>:<shard>}:ix:<gen>:<bucket>``  hash of fingerprint -> entries, one per generation

The hash tag of the index keys is the key id and the fingerprint's first byte, so one Lua
call can handle every fingerprint of a batch that falls into one shard on one cluster slot.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

SHARD_BITS = 8  # fixed: changing it re-homes every index key
SHARDS = 1 << SHARD_BITS
INDEX_KEY_VERSION = "ix"


@dataclass(frozen=True, slots=True)
class Keys:
    prefix: str

    @property
    def tenant_names(self) -> str:
        return f"{self.prefix}:{{{self.prefix}:tenants}}:names"

    @property
    def tenant_seq(self) -> str:
        return f"{self.prefix}:{{{self.prefix}:tenants}}:seq"

    @property
    def doc_seq(self) -> str:
        return f"{self.prefix}:doc-seq"

    def doc(self, ns: str, ref: int) -> str:
        return f"{self.prefix}:doc:{ns}:{ref}"

    def done(self, idempotency_key: str) -> str:
        digest = hashlib.blake2b(idempotency_key.encode(), digest_size=16).hexdigest()
        return f"{self.prefix}:done:{digest}"

    def shard(self, ns: str, shard: int) -> str:
        return f"{self.prefix}:{{{ns}:{shard:02x}}}:{INDEX_KEY_VERSION}"
