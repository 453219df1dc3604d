"""``bleedwatch queue``: an operator's look at the ingest queue and the findings outbox.

Apart from the worker, so the worker never imports the index factory's callers and the CLI
never imports the application.
"""

from __future__ import annotations

from bleedwatch.plural import counted
from service.config import Settings
from service.index.factory import make_index
from service.ingest.worker import RECLAIM_COUNT


async def queue_command(command: str) -> int:
    """``bleedwatch queue status|requeue-dead``, against BLEEDWATCH_REDIS_URL: the ingest queue's
    dead letters and the findings outbox's (held findings the database kept refusing) alike."""
    settings = Settings()
    if settings.embedded:
        print("the embedded queue lives in the server's process: nothing to inspect from here")
        return 1
    index = make_index(settings)
    queue, outbox = index.queue(), index.outbox()
    try:
        if command == "requeue-dead":
            moved = 0
            while batch := await queue.requeue_dead(RECLAIM_COUNT * 10):
                moved += batch
            print(f"{counted(moved, 'dead letter')} put back in the queue")
            moved = 0
            while batch := await outbox.requeue_dead(RECLAIM_COUNT * 10):
                moved += batch
            print(f"{counted(moved, 'held finding')} put back in the findings outbox")
        queued, dead = await queue.size(), await queue.dead_size()
        print(f"{counted(queued, 'batch', 'batches')} queued, {counted(dead, 'dead letter')}")
        held, dead, later = await outbox.size(), await outbox.dead_size(), await outbox.later_size()
        print(f"{counted(held, 'finding')} held, {counted(dead, 'dead letter')}, {counted(later, 'finding')} on hold")
    finally:
        await index.close()
    return 0
