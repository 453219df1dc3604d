"""``bleedwatch``: serve, work, migrate, replay, allowlist, canary, keys, prune, tenants, queue, incidents,
findings, tap, completion, demo."""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import ValidationError

from bleedwatch.fingerprint.scheme import DEFAULT_PARAMS, key_from_hex
from bleedwatch.plural import counted
from service.auth.keys import Role
from service.responder import add_parsers as add_responder_parsers
from service.tools.sim.cli import add_parser as add_sim_parser
from service.tools.sim.cli import key_file

if TYPE_CHECKING:
    import httpx

METRICS_DIR = "PROMETHEUS_MULTIPROC_DIR"


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from service.config import Settings

    settings = Settings()
    if settings.needs_data_dir:  # here, not in the app's startup, where it would end in uvicorn's traceback
        settings.make_data_dir()
    if settings.embedded and settings.workers > 1:
        print(
            "the embedded index lives in one process: set BLEEDWATCH_REDIS_URL to run several workers", file=sys.stderr
        )
        return 2
    if settings.workers > 1:
        _share_metrics_between_workers()
    else:
        os.environ.pop(METRICS_DIR, None)  # one process: its own registry, as for any other command
    from service.logging import log_config  # imports the metrics: after the choice above

    uvicorn.run(
        "service.app:create_app",
        factory=True,
        host=args.host or settings.host,
        port=args.port or settings.port,
        workers=settings.workers,
        forwarded_allow_ips=settings.forwarded_allow_ips,
        loop="uvloop",
        http="httptools",
        log_level=settings.log_level,
        log_config=log_config(settings.log_level, settings.log_format),  # JSON lines (service/logging.py)
        access_log=False,  # raw paths and query strings: service.logging.RequestContext logs templates
        timeout_graceful_shutdown=30,
    )
    return 0


def _work(args: argparse.Namespace) -> int:
    import uvicorn

    from service.config import Settings
    from service.logging import log_config
    from service.work import WorkerUnfit, check

    settings = Settings()
    try:
        check(settings)
    except WorkerUnfit as exc:
        print(exc, file=sys.stderr)
        return 2
    if settings.needs_data_dir:
        settings.make_data_dir()
    uvicorn.run(
        "service.work:create_worker_app",
        factory=True,
        host=args.host or settings.host,
        port=settings.work_port if args.port is None else args.port,
        loop="uvloop",
        http="httptools",
        log_level=settings.log_level,
        log_config=log_config(settings.log_level, settings.log_format),
        access_log=False,
        timeout_graceful_shutdown=30,
    )
    return 0


def _share_metrics_between_workers() -> None:
    """prometheus-client's multiprocess mode: one directory of metric files for all workers, emptied
    before this process first imports prometheus-client (it chooses the mode then)."""
    directory = Path(os.environ.setdefault(METRICS_DIR, tempfile.mkdtemp(prefix="bleedwatch-metrics-")))
    directory.mkdir(parents=True, exist_ok=True)
    for stale in directory.glob("*.db"):  # left by an earlier run: would be summed in
        stale.unlink()


def _migrate(_: argparse.Namespace) -> int:
    """Says which database it migrated and from which revision to which: silent, a run against the
    wrong BLEEDWATCH_DATABASE_URL (or none, the embedded SQLite) looked like success."""
    from service.config import Settings
    from service.migrate import describe, revision, upgrade

    settings = Settings()
    before = revision(settings)
    upgrade(settings)
    after = revision(settings)
    if before == after:
        print(f"{describe(settings)}: schema already at revision {after}")
    else:
        print(f"{describe(settings)}: schema migrated from revision {before or '(empty)'} to {after}")
    return 0


def _keys(args: argparse.Namespace) -> int:
    from service.keys_cli import run

    return asyncio.run(run(args))


def _prune(args: argparse.Namespace) -> int:
    from service.retention.cli import run_prune

    return asyncio.run(run_prune(args))


def _tenants(args: argparse.Namespace) -> int:
    from service.retention.cli import run_purge

    if not args.yes:
        if not sys.stdin.isatty():
            print("purging cannot be undone: add --yes to purge without a prompt", file=sys.stderr)
            return 2
        answer = input(f"purge everything held about tenant {args.tenant!r}? It cannot be undone. Type its name: ")
        if answer.strip() != args.tenant:
            print("not purged", file=sys.stderr)
            return 1
    return asyncio.run(run_purge(args))


def _completion(args: argparse.Namespace) -> int:
    import shtab

    print(shtab.complete(parser(), shell=args.shell))
    return 0


def _queue(args: argparse.Namespace) -> int:
    from service.queue_cli import queue_command

    return asyncio.run(queue_command(args.queue_command))


def _client_args(args: argparse.Namespace, role: str) -> tuple[bytes, str] | None:
    """The gateway key and an API key, from flags or the environment; None after explaining."""
    key = args.key_file or os.environ.get("BLEEDWATCH_FINGERPRINT_KEY")
    if not key:
        print("give the gateway's fingerprint key: --key-file or BLEEDWATCH_FINGERPRINT_KEY (hex)", file=sys.stderr)
        return None
    try:
        raw = key_from_hex(key)
    except ValueError as exc:
        print(f"{exc} (--key-file or BLEEDWATCH_FINGERPRINT_KEY)", file=sys.stderr)
        return None
    if not args.api_key:
        print(f"give an {role} API key: --api-key or BLEEDWATCH_API_KEY", file=sys.stderr)
        return None
    return raw, args.api_key


def _add_client_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--url",
        default=os.environ.get("BLEEDWATCH_URL", "http://127.0.0.1:8400"),
        help="the service (default BLEEDWATCH_URL, else http://127.0.0.1:8400)",
    )
    p.add_argument("--api-key", default=os.environ.get("BLEEDWATCH_API_KEY"), help="default BLEEDWATCH_API_KEY")
    p.add_argument(
        "--key-file",
        type=key_file,
        help="file holding the gateway's fingerprint key in hex (default BLEEDWATCH_FINGERPRINT_KEY)",
    )


def _allowlist(args: argparse.Namespace) -> int:
    from service.allowlist.public import BundleMissing
    from service.tools.probe import allowlist_add, import_public

    keys = _client_args(args, "admin")
    if keys is None:
        return 2
    key, api_key = keys
    if args.allowlist_command == "add":
        result = allowlist_add(
            [Path(p) for p in args.paths], url=args.url, api_key=api_key, key=key, label=args.label, n=args.n, w=args.w
        )
        done = "added"
    else:
        try:
            result = import_public(url=args.url, api_key=api_key, key=key, n=args.n, w=args.w)
        except BundleMissing as exc:
            print(str(exc), file=sys.stderr)
            return 2
        done = "added" if result.sent else "already imported, nothing sent"
    if result.entry is None:
        print(f"nothing to allowlist: {counted(result.texts, 'text')} gave no fingerprints ({result.seconds:.1f} s)")
        return 0
    e = result.entry
    print(
        f"allowlist entry {e['id']} ({e['label']}): {done}; {counted(result.texts, 'text')}, "
        f"{counted(result.fingerprints, 'distinct fingerprint')}, {e['fingerprint_count']:,} in the entry; "
        f"{result.seconds:.1f} s"
    )
    return 0


def _canary(args: argparse.Namespace) -> int:
    from service.tools.probe import canary_probe

    keys = _client_args(args, "admin")
    if keys is None:
        return 2
    unanswered = 0
    for _ in range(args.count):
        r = canary_probe(
            url=args.url,
            api_key=keys[1],
            key=keys[0],
            tenant=args.tenant,
            endpoint=args.endpoint,
            endpoint_key=args.endpoint_key,
            model=args.model,
            tokens=args.tokens,
        )
        print(
            f"canary {r.canary_id} ({r.label}, {r.tokens} tokens) sent: engine answered {r.status} in {r.seconds:.1f}s"
        )
        if not 200 <= r.status < 300:  # the probe did not run (a 200 proves no more: the incident's engine sent 200s)
            print(f"bleedwatch canary probe: canary {r.canary_id} was not answered (HTTP {r.status})", file=sys.stderr)
            unanswered += 1
    return 1 if unanswered else 0


def _replay(args: argparse.Namespace) -> int:
    import httpx

    from bleedwatch.client import Undelivered
    from service.tools.replay import replay_file

    keys = _client_args(args, "ingest")
    if keys is None:
        return 2
    try:
        result = asyncio.run(
            replay_file(args.file, url=args.url, api_key=keys[1], key=keys[0], batch_size=args.batch_size)
        )
    except (OSError, ValueError) as exc:  # the file: unreadable, or a line that is no exchange
        print(f"bleedwatch replay: {exc}", file=sys.stderr)
        return 2
    except Undelivered as exc:  # down, or busy past every retry: the SDK's message does not say where
        print(f"bleedwatch replay: sending to bleedwatch at {_origin(httpx.URL(args.url))}: {exc}", file=sys.stderr)
        return 1
    print(
        f"sent {counted(result.sent, 'exchange')}: {result.accepted} accepted, "
        f"{counted(result.duplicates, 'duplicate')}, findings created or extended {counted(result.findings, 'time')}, "
        f"{result.rate:,.0f} exchanges/s"
    )
    return 0


def _tap(args: argparse.Namespace) -> int:
    import uvicorn
    from pydantic import ValidationError

    from service.logging import log_config
    from service.tap import Tap, TapSettings

    flags = {
        "upstream_url": args.upstream,
        "host": args.host,
        "port": args.port,
        "tenant_header": args.tenant_header,
        "bleedwatch_url": args.url,
        "bleedwatch_api_key": args.api_key,
        "fingerprint_key": args.key_file,
    }
    try:  # flags over BLEEDWATCH_TAP_* and the SDK's BLEEDWATCH_URL, BLEEDWATCH_API_KEY, BLEEDWATCH_FINGERPRINT_KEY
        settings = TapSettings(**{k: v for k, v in flags.items() if v is not None})
    except ValidationError as exc:
        for error in exc.errors():
            where = ".".join(str(p) for p in error["loc"])
            print(f"bleedwatch tap: {where}: {error['msg']}", file=sys.stderr)
        print(
            "give --upstream (BLEEDWATCH_TAP_UPSTREAM_URL), an ingest --api-key (BLEEDWATCH_API_KEY) and the "
            "gateway's fingerprint key, --key-file or BLEEDWATCH_FINGERPRINT_KEY (hex)",
            file=sys.stderr,
        )
        return 2
    level = os.environ.get("BLEEDWATCH_LOG_LEVEL", "info").lower()
    uvicorn.run(
        Tap(settings),
        host=settings.host,
        port=settings.port,
        loop="uvloop",
        http="httptools",
        log_level=level,
        log_config=log_config(level, os.environ.get("BLEEDWATCH_LOG_FORMAT", "json")),
        access_log=False,  # paths and tenants stay out of the log
        timeout_graceful_shutdown=30,
    )
    return 0


def _demo(args: argparse.Namespace) -> int:
    from service.tools.demo.run import run_demo

    return run_demo(keep=args.keep)


class _Version(argparse.Action):
    """Looked up when asked for, not each time the parser is built (installs without metadata exist)."""

    def __call__(self, parser: argparse.ArgumentParser, *_: object) -> None:
        print(f"bleedwatch {importlib.metadata.version('bleedwatch-server')}")
        parser.exit()


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="bleedwatch", description=__doc__)
    p.add_argument("--version", action=_Version, nargs=0, help="print the version and exit")
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("serve", help="run the API (settings from BLEEDWATCH_* variables)")
    s.add_argument("--host")
    s.add_argument("--port", type=int)
    s.set_defaults(func=_serve)

    w = sub.add_parser(
        "work", help="process the ingest queue only (index, match, findings); serve with BLEEDWATCH_INGEST_WORKERS=0"
    )
    w.add_argument("--host")
    w.add_argument("--port", type=int, help="for /metrics, /healthz, /readyz (default BLEEDWATCH_WORK_PORT, 8401)")
    w.set_defaults(func=_work)

    m = sub.add_parser("migrate", help="bring the database schema to the current version")
    m.set_defaults(func=_migrate)

    r = sub.add_parser("replay", help="fingerprint a JSON Lines traffic file and send it")
    r.add_argument(
        "file",
        help="one exchange a line: ts (epoch seconds or ISO 8601), tenant, request_id, model, prompt, "
        "response, and optionally meta (an object)",
    )
    _add_client_flags(r)
    r.add_argument("--batch-size", type=int, default=200, help="exchanges a request (default 200)")
    r.set_defaults(func=_replay)

    a = sub.add_parser("allowlist", help="allowlist public text (fingerprinted here; only hashes are sent)")
    asub = a.add_subparsers(dest="allowlist_command", required=True)
    aa = asub.add_parser("add", help="files and directories (recursively) as one entry")
    aa.add_argument("paths", nargs="+", metavar="PATH")
    aa.add_argument("--label", help="default: the first path's name")
    ai = asub.add_parser(
        "import-public",
        help="license texts and notices of the ScanCode LicenseDB (pip install 'licensedcode-data>=32'); "
        "once per bundle version and key id",
    )
    for cmd in (aa, ai):
        _add_client_flags(cmd)
        cmd.add_argument("--n", type=int, default=DEFAULT_PARAMS.n, help="the gateways' shingle length")
        cmd.add_argument("--w", type=int, default=DEFAULT_PARAMS.w, help="the gateways' winnowing window")
    a.set_defaults(func=_allowlist)

    c = sub.add_parser("canary", help="probe an OpenAI-compatible endpoint with canary prompts")
    csub = c.add_subparsers(dest="canary_command", required=True)
    cp = csub.add_parser("probe")
    cp.add_argument("--endpoint", required=True, help="base URL of the OpenAI-compatible engine or gateway")
    cp.add_argument("--endpoint-key", required=True, help="the canary tenant's API key at that endpoint")
    cp.add_argument("--tenant", default="canary", help="the canary tenant's id as gateways report it")
    cp.add_argument("--model", required=True)
    cp.add_argument("--tokens", type=int, default=2000, help="prompt length; the incident hit prompts over 681,280")
    cp.add_argument("--count", type=int, default=1)
    _add_client_flags(cp)
    c.set_defaults(func=_canary)

    k = sub.add_parser("keys", help="create, list and revoke API keys")
    ksub = k.add_subparsers(dest="keys_command", required=True)
    kc = ksub.add_parser("create")
    kc.add_argument("--name", required=True)
    kc.add_argument("--role", required=True, choices=[r.value for r in Role])
    kc.add_argument("--tenant", action="append", dest="tenants", help="limit an ingest key to this tenant (repeat)")
    ksub.add_parser("list")
    kr = ksub.add_parser("revoke")
    kr.add_argument("key_id")
    k.set_defaults(func=_keys)

    pr = sub.add_parser("prune", help="delete findings, closed incidents and audit entries past their retention")
    pr.set_defaults(func=_prune)

    t = sub.add_parser("tenants", help="purge everything held about one tenant")
    tsub = t.add_subparsers(dest="tenants_command", required=True)
    tp = tsub.add_parser("purge")
    tp.add_argument("tenant")
    tp.add_argument("--yes", action="store_true", help="no confirmation prompt (scripts)")
    tp.add_argument(
        "--database-only",
        action="store_true",
        help="embedded default only, with its server stopped: the index went with it, the database is all there is",
    )
    t.set_defaults(func=_tenants)

    q = sub.add_parser("queue", help="the ingest queue: batches waiting, and dead letters to put back")
    qsub = q.add_subparsers(dest="queue_command", required=True)
    qsub.add_parser("status", help="batches waiting to be processed, and dead letters")
    qsub.add_parser("requeue-dead", help="put every dead letter back in the queue, once the bug is fixed")
    q.set_defaults(func=_queue)

    tp = sub.add_parser(
        "tap",
        help="an OpenAI-compatible reverse proxy in front of an inference engine that fingerprints what it forwards",
    )
    tp.add_argument("--upstream", help="the engine's base URL (BLEEDWATCH_TAP_UPSTREAM_URL)")
    tp.add_argument("--host", help="default BLEEDWATCH_TAP_HOST, 127.0.0.1")
    tp.add_argument("--port", type=int, help="default BLEEDWATCH_TAP_PORT, 8410")
    tp.add_argument("--tenant-header", help="set by the gateway after auth (BLEEDWATCH_TAP_TENANT_HEADER, X-Tenant-Id)")
    tp.add_argument("--url", default=os.environ.get("BLEEDWATCH_URL"), help="bleedwatch's URL (BLEEDWATCH_URL)")
    tp.add_argument("--api-key", default=os.environ.get("BLEEDWATCH_API_KEY"), help="an ingest key")
    tp.add_argument("--key-file", type=key_file, help="file holding the gateway's fingerprint key in hex")
    tp.set_defaults(func=_tap)

    d = sub.add_parser("demo", help="the incident reproduced: a leaky engine, a gateway, bleedwatch; then the fix")
    d.add_argument("--keep", action="store_true", help="keep the demo's data directory")
    d.set_defaults(func=_demo)

    add_responder_parsers(sub)
    co = sub.add_parser(
        "completion",
        help="print a shell completion script, e.g. bleedwatch completion bash > /etc/bash_completion.d/bleedwatch",
    )
    co.add_argument("shell", choices=["bash", "zsh", "tcsh"])
    co.set_defaults(func=_completion)
    add_sim_parser(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    import httpx
    from sqlalchemy.exc import OperationalError, ProgrammingError

    from bleedwatch.client import Rejected, Undelivered
    from service.allowlist.upload import Refused
    from service.config import DataDirUnusable

    args = parser().parse_args(argv)
    if args.command != "serve":
        # Only `serve` with several workers shares metric files. Any other command run where the
        # variable is set (kubectl exec into an API pod) would write into the server's directory,
        # its gauges summed in, or fail to start where that directory is not mounted (a worker pod).
        os.environ.pop(METRICS_DIR, None)
    try:
        code: int = args.func(args)
    except ValidationError as exc:
        if exc.title != "Settings":
            raise
        # A setting an operator got wrong: what to fix, one line each, not a traceback.
        for error in exc.errors(include_url=False):
            where = ".".join(str(part) for part in error["loc"])
            message = str(error["msg"]).removeprefix("Value error, ")
            named = not where or message.startswith("BLEEDWATCH_")
            print(f"bleedwatch: {'' if named else f'BLEEDWATCH_{where.upper()}: '}{message}", file=sys.stderr)
        return 2
    except DataDirUnusable as exc:
        print(f"bleedwatch {args.command}: {exc}", file=sys.stderr)
        return 2
    except httpx.RequestError as exc:  # the service or an engine is down, or the URL points elsewhere
        print(
            f"bleedwatch {args.command}: cannot reach {_where(exc)}: {str(exc) or type(exc).__name__}", file=sys.stderr
        )
        return 1
    except httpx.InvalidURL as exc:
        print(f"bleedwatch {args.command}: {exc}", file=sys.stderr)
        return 2
    except (Refused, Rejected, Undelivered) as exc:  # the service said no, or never said yes
        print(f"bleedwatch {args.command}: {exc}", file=sys.stderr)
        return 1
    except (OperationalError, ProgrammingError) as exc:  # migrate, keys, prune...: the database is down or not set up
        from service.config import Settings
        from service.migrate import describe

        print(f"bleedwatch {args.command}: {describe(Settings())}: {_database_error(exc)}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # `... | head`: the reader is gone, and so is what would go to it
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    return code


def _database_error(exc: BaseException) -> str:
    """The driver's own words, without SQLAlchemy's statement, parameters and background link; a
    missing table (PostgreSQL's "relation ... does not exist", SQLite's "no such table") means that
    the database was never migrated, the usual first-day mistake, so the line says so."""
    cause = getattr(exc, "orig", None) or exc
    line = (str(cause).strip().splitlines() or [type(cause).__name__])[0]
    if "no such table" in line or ("relation" in line and "does not exist" in line):
        return f"{line}: run `bleedwatch migrate` first"
    return line


def _where(exc: httpx.RequestError) -> str:
    try:
        url = exc.request.url
    except RuntimeError:  # no request attached
        return "the server"
    return _origin(url)


def _origin(url: httpx.URL) -> str:
    """Scheme, host and port: no path, and no user or password from the URL."""
    return f"{url.scheme}://{url.netloc.decode()}"


if __name__ == "__main__":
    sys.exit(main())
