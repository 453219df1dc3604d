"""Every Redis key bleedwatch writes, built in one place.

Layout (``p`` is ``BLEEDWATCH_KEY_PREFIX``, ``key_id`` a fingerprint key id):

- ``p:{p:tenants}:names`` / ``:seq``       tenant name -> small integer ref (kept until the tenant is purged)
- ``p:{p:tenants}:purged``                 tombstones: digest of a purged tenant's name -> "purge time ref"
- ``p:{p:tenants}:new:<key id>:<minute>``  digests of new tenant names one API key sent that minute, TTL 2 min
- ``p:doc-seq``                            document ref counter (wraps below 2^32, see DOC_REF_LIMIT)
- ``p:doc:<key id>:<ref>``                 metadata of one document, TTL = retention
- ``p:done:<digest>``                      idempotency mark of (tenant, request id), TTL = retention
- ``p:{<key id>:<shard>}:ix5:<gen>:<bucket>``  hash of fingerprint -> entries, one per generation
- ``p:{<key id>:<shard>}:ix5:f:<gen>``         presence filter of that shard and generation (a bitmap)
- ``p:{p:queue}:bytes`` / ``:sizes``       bytes queued in that stream, and each item's (the byte bound)
- ``p:{p:outbox}:findings``                stream of findings not yet written to the database
- ``p:{p:outbox}:dead``                    held findings that failed to be written too often (not outages)
- ``p:{p:outbox}:later``                   sorted set of findings on hold, scored by when to judge them again
- ``p:{p:queue}:exchanges``                stream of accepted ingest batches not yet processed
- ``p:{p:queue}:dead``                     batches that failed processing too often, kept for an operator
- ``p:{p:queue}:result:<id>``              what processing one batch concluded, for a caller waiting on it
- ``p:{p:queue:<i>}:exchanges``, ``:dead``, ``:result:<id>``  the same for queue shard i >= 1
                                           (``BLEEDWATCH_INGEST_QUEUE_SHARDS``; shard 0 is the keys above)
- ``p:rl:v1:{<api key id>}``               token bucket of one API key (service/ratelimit.py), short TTL
- ``p:af:v1:{<client address>}``           token bucket of failed authentications from one address, short TTL
- ``p:keys:revoked``                       pub/sub channel (no key): ids of API keys just revoked

The hash tag of the index keys is the key id and the fingerprint's first byte, so one Lua
call can handle every fingerprint of a batch that falls into one shard on one cluster slot.
Each ingest queue shard has a hash tag of its own, so on a cluster the shards' streams spread
over the slots (and so the nodes), while a shard's stream, dead letters and results stay
together for its transactions.

Index hashes (``ix5``): the first ``BLEEDWATCH_INDEX_BUCKET_BITS`` bits of a fingerprint name the
shard and bucket; the field is 3 bytes folded from the rest (below), the value ``*`` once it is common by
senders, else one ``varint(tenant * 8 + kinds) . doc ref (u32) . varint(token offset)`` entry per tenant
(kinds: 1 prompt, 2 response, 4 served first); common only by holders, ``(`` then the entries of its
senders in that generation and a ``varint(tenant * 8 + 6)`` mark for each tenant served it, while the
value stays within ``HELD_VALUE_BYTES`` (64). ``(`` is 40: no entry's first byte is 0 mod 8 (its kinds). Each
shard and generation also has a presence filter bitmap, so the common case (a new fingerprint)
skips the bucket read. Sizes and Redis settings: docs/capacity.md.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

SHARD_BITS = 8  # fixed: changing it re-homes every index key
SHARDS = 1 << SHARD_BITS
INDEX_KEY_VERSION = "ix5"  # ix4 had no served-first flag; older keys are not read and expire (README, Upgrading)
# A field holds 3 bytes folded from the fingerprint bits its key does not imply (4 below bucket
# bits 16, so that bucket and field tell at least 40 bits apart). A lookup takes a fingerprint
# a bucket lacks for one it holds with odds of (fields in the bucket) / 2^24, under 1e-5 at
# the 65-128 fields docs/capacity.md sizes buckets for; such a shingle is 4 tokens, under any
# finding's score. Each field byte is 1 of the ~20 a fingerprint costs.
MIN_FIELD_BYTES = 3
IDENTITY_BITS = 40
# 63 bytes, not 64: a bitmap of buckets x 63 bytes plus Redis' string header fits the allocator's
# power-of-two size class exactly (buckets x 64 would spill into the next one, 25% larger).
FILTER_BITS_PER_BUCKET = 63 * 8
# Doc refs are stored as u32: the counter wraps back to 1 before this. A ref is only reused after
# 2^32 - 1 newer documents, which no retention window holds (at ~20 bytes per fingerprint that
# window would take terabytes of Redis).
DOC_REF_LIMIT = 1 << 32


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
    def tenant_tombstones(self) -> str:
        return f"{self.prefix}:{{{self.prefix}:tenants}}:purged"

    def new_tenants(self, api_key_id: str, minute: int) -> str:
        """Beside the names hash (same hash tag), so one script checks both on a Redis Cluster."""
        return f"{self.prefix}:{{{self.prefix}:tenants}}:new:{api_key_id}:{minute}"

    @staticmethod
    def tenant_digest(name: str) -> str:
        """A tombstone names the tenant by digest: purged means its name is not kept either."""
        return hashlib.blake2b(name.encode(), digest_size=16, person=b"bw-tombstone").hexdigest()

    def doc_pattern(self) -> str:
        """Every document's metadata key (SCAN MATCH), for a purge."""
        return f"{self.prefix}:doc:*"

    @property
    def doc_seq(self) -> str:
        return f"{self.prefix}:doc-seq"

    def doc(self, key_id: str, ref: int) -> str:
        return f"{self.prefix}:doc:{key_id}:{ref}"

    def done(self, idempotency_key: str) -> str:
        digest = hashlib.blake2b(idempotency_key.encode(), digest_size=16).hexdigest()
        return f"{self.prefix}:done:{digest}"

    @property
    def outbox(self) -> str:
        return f"{self.prefix}:{{{self.prefix}:outbox}}:findings"

    @property
    def outbox_dead(self) -> str:
        return f"{self.prefix}:{{{self.prefix}:outbox}}:dead"

    @property
    def outbox_later(self) -> str:
        return f"{self.prefix}:{{{self.prefix}:outbox}}:later"

    @property
    def queue(self) -> str:
        return self.queue_shard(0)

    @property
    def dead_letters(self) -> str:
        return self.dead_letters_shard(0)

    def queue_result(self, item_id: str, shard: int = 0) -> str:
        return f"{self._queue_base(shard)}:result:{item_id}"

    def queue_shard(self, shard: int) -> str:
        return f"{self._queue_base(shard)}:exchanges"

    def queue_bytes(self, shard: int = 0) -> str:
        """Bytes of the items in the shard's stream; ``queue_sizes`` has each item's, so that a
        finish or a bury counted twice subtracts once."""
        return f"{self._queue_base(shard)}:bytes"

    def queue_sizes(self, shard: int = 0) -> str:
        return f"{self._queue_base(shard)}:sizes"

    def dead_letters_shard(self, shard: int) -> str:
        return f"{self._queue_base(shard)}:dead"

    def _queue_base(self, shard: int) -> str:
        """Shard 0 is the single queue of before there were shards: same keys, nothing to migrate."""
        tag = f"{self.prefix}:queue" if shard == 0 else f"{self.prefix}:queue:{shard}"
        return f"{self.prefix}:{{{tag}}}"

    def rate_limit(self, api_key_id: str) -> str:
        return f"{self.prefix}:rl:v1:{{{api_key_id}}}"

    def auth_failures(self, address: str) -> str:
        return f"{self.prefix}:af:v1:{{{address}}}"

    def revocations(self) -> str:
        return f"{self.prefix}:keys:revoked"

    def shard(self, key_id: str, shard: int) -> str:
        return f"{self.prefix}:{{{key_id}:{shard:02x}}}:{INDEX_KEY_VERSION}"
