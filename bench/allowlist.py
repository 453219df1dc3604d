"""What an allowlist of millions of fingerprints costs: PostgreSQL bytes and a replica's memory.

    .venv/bin/python bench/allowlist.py --fingerprints 5000000 --old-rows 1000000

In a PostgreSQL schema of its own (removed afterwards; ``--database-url``, default the test
database): migrates to 0004 and fills the old layout, one ``allowlist_fingerprints`` row per
fingerprint, with ``--old-rows`` random values (``pg_total_relation_size`` per million); migrates
to head, which packs them into ``allowlist_chunks`` (the time it took); then adds
``--fingerprints`` more to one entry the way the API does, 1M a request (``store.add``, then
``store.append``), and prints the table's size per million. Last, a replica's reload: the time
and the ``tracemalloc`` peak of ``store.active_values`` (what ``KnownFingerprints`` runs when
the allowlist changed) and the bytes of the sorted array it keeps, and the time of the version
check it runs every refresh otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
import tracemalloc
import uuid
from pathlib import Path
from urllib.parse import quote

import numpy as np
import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from service.allowlist import store
from service.config import Settings
from service.db import make_engine, make_sessionmaker, session_scope
from service.migrate import upgrade

NS = "00112233445566aa"
MB = 1e6


def _size(conn: psycopg.Connection, table: str) -> int:
    row = conn.execute("SELECT pg_total_relation_size(%s)", (table,)).fetchone()
    assert row is not None
    return int(row[0])


def _old_layout(conn: psycopg.Connection, rows: int, rng: np.random.Generator) -> None:
    conn.execute(
        "INSERT INTO allowlist_entries (id, key_id, label, origin, fingerprint_count, created_at, created_by)"
        " VALUES (1, %s, 'old rows', 'import', %s, now(), 'bench')",
        (NS, rows),
    )
    values = np.unique(rng.integers(0, 2**64, size=rows, dtype=np.uint64)).view(np.int64)
    with conn.cursor().copy("COPY allowlist_fingerprints (entry_id, value) FROM STDIN") as copy:
        for v in values.tolist():
            copy.write_row((1, v))
    conn.execute("SELECT setval(pg_get_serial_sequence('allowlist_entries', 'id'), 1)")
    conn.execute("VACUUM ANALYZE allowlist_fingerprints")
    size = _size(conn, "allowlist_fingerprints")
    print(f"0004, a row per fingerprint: {len(values):,} rows, {size / MB:.1f} MB, {size / len(values):.1f} B each")


async def _new_layout(settings: Settings, count: int, rng: np.random.Generator) -> None:
    engine = make_engine(settings)
    sessions = make_sessionmaker(engine)
    start = time.perf_counter()
    for i, first in enumerate(range(0, count, 1_000_000)):
        values = rng.integers(0, 2**64, size=min(1_000_000, count - first), dtype=np.uint64)
        async with session_scope(sessions) as session:
            if i == 0:
                entry = await store.add(session, NS, "bench", "import", values, "bench")
            else:
                locked = await store.get_for_update(session, entry.id)
                assert locked is not None
                await store.append(session, locked, values)
    print(f"added {count:,} to one entry, 1M a request: {time.perf_counter() - start:.1f} s")

    tracemalloc.start()
    start = time.perf_counter()
    async with session_scope(sessions) as session:
        loaded = await store.active_values(session, NS)
    seconds = time.perf_counter() - start
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    per_m = 1_000_000 / len(loaded)
    print(
        f"replica reload of {len(loaded):,}: {seconds:.2f} s; keeps {loaded.nbytes / MB:.1f} MB "
        f"({loaded.nbytes * per_m / MB:.1f} MB per million), "
        f"peak {peak / MB:.1f} MB ({peak * per_m / MB:.1f} per million)"
    )
    start = time.perf_counter()
    for _ in range(100):
        async with session_scope(sessions) as session:
            await store.version(session, NS)
    print(f"version check: {(time.perf_counter() - start) * 10:.2f} ms")
    await engine.dispose()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--database-url", default="postgresql://postgres@127.0.0.1:5432/test")
    p.add_argument("--fingerprints", type=int, default=5_000_000)
    p.add_argument("--old-rows", type=int, default=1_000_000)
    p.add_argument("--seed", type=int, default=7)
    args = p.parse_args()
    rng = np.random.default_rng(args.seed)
    schema = f"bw_bench_allowlist_{uuid.uuid4().hex[:8]}"
    admin = psycopg.connect(args.database_url, autocommit=True)
    admin.execute(f'CREATE SCHEMA "{schema}"')
    url = f"{args.database_url}?options={quote(f'-csearch_path={schema}')}"
    settings = Settings(database_url=url)
    try:
        upgrade(settings, "0004")
        with psycopg.connect(url, autocommit=True) as conn:
            if args.old_rows:
                _old_layout(conn, args.old_rows, rng)
            start = time.perf_counter()
            upgrade(settings)
            print(f"migration 0005: {time.perf_counter() - start:.1f} s")
            asyncio.run(_new_layout(settings, args.fingerprints, rng))
            conn.execute("VACUUM ANALYZE allowlist_chunks")
            total = args.old_rows + args.fingerprints
            size = _size(conn, "allowlist_chunks")
            print(
                f"0005, packed: {total:,} fingerprints, {size / MB:.1f} MB, "
                f"{size / total:.2f} B each, {size / total:.2f} MB per million"
            )
    finally:
        admin.execute(f'DROP SCHEMA "{schema}" CASCADE')
        admin.close()


if __name__ == "__main__":
    main()
