"""The scale-out curve: ``bench/ingest.py`` over several Redis layouts, efficiency against one master.

    .venv/bin/python bench/scaling.py --configs 0:2 3:4 --json out/scaling.json --plot docs/scaling.png
    .venv/bin/python bench/scaling.py --from results.txt --plot docs/scaling.png   # scale-run's output

A config is ``masters:workers``: 0 masters is one plain redis-server, 3 or more a Redis Cluster
of that many masters, each run with that many uvicorn workers of the service. Every run is a
separate ``bench/ingest.py`` (its own Redis, PostgreSQL schema and service), whose ``RESULT``
line this reads. Efficiency is a run's fingerprints/s over (masters x the fingerprints/s of the
single-master run): 1.0 is perfect scale-out. Alongside: Redis CPU per master (the bottleneck
on one node is Redis' main thread), leaks found, and other findings, which must be the same on
every layout.

``--from`` reads RESULT lines from files instead (``../shared/tools/scale-run``'s results, run
on a bigger machine), each preceded by the ``### [n] masters=M workers=K`` header scale-run
writes. The plot needs matplotlib (the ``bench`` extra), which CI does not install.
"""

from __future__ import annotations

import argparse
import importlib
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent / "ingest.py"
_HEADER = re.compile(r"^### \[\d+\] (?:masters=(\d+) workers=(\d+)|plain redis workers=(\d+))")


def run_config(masters: int, workers: int, extra: list[str]) -> dict[str, Any]:
    argv = [sys.executable, str(BENCH), "--workers", str(workers), *extra]
    if masters:
        argv += ["--cluster-masters", str(masters)]
    print(f"$ {' '.join(argv[1:])}", flush=True)
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    print(out, flush=True)
    return parse(out) | {"masters": max(1, masters), "cluster": masters > 0, "workers": workers}


def parse(text: str) -> dict[str, Any]:
    results = [json.loads(line[7:]) for line in text.splitlines() if line.startswith("RESULT ")]
    if not results:
        raise SystemExit("no RESULT line: the run failed, see its output above")
    result: dict[str, Any] = results[-1]
    return result


def from_files(paths: list[Path]) -> list[dict[str, Any]]:
    """Runs from scale-run's results file(s): each RESULT line under its ``###`` header."""
    runs = []
    for path in paths:
        config: tuple[int, int] | None = None
        for line in path.read_text(errors="replace").splitlines():
            header = _HEADER.match(line)
            if header:
                masters = int(header[1] or 0)
                config = (masters, int(header[2] or header[3]))
            elif line.startswith("RESULT ") and config is not None:
                masters, workers = config
                runs.append(parse(line) | {"masters": max(1, masters), "cluster": masters > 0, "workers": workers})
    return runs


def with_efficiency(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    single = [r["fps_s"] for r in runs if not r["cluster"]]
    base = max(single) if single else None
    out = []
    for r in runs:
        efficiency = r["fps_s"] / (r["masters"] * base) if base else None
        out.append(r | {"times_one": r["fps_s"] / base if base else None, "efficiency": efficiency})
    return out


def table(runs: list[dict[str, Any]]) -> str:
    lines = [
        "| Redis | service workers | fingerprints/s | x one Redis | efficiency | Redis CPU by master (cores) "
        "| service CPU | leaks found | other findings |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        layout = f"cluster, {r['masters']} masters" if r["cluster"] else "one server"
        by_master = r.get("redis_cpu_cores_by_master")
        cpu = (
            " + ".join(f"{c:.2f}" for c in by_master) if by_master else f"{r.get('redis_cpu_cores', float('nan')):.2f}"
        )
        found = f"{r['leaks_found']} of {r['leaks']}" if "leaks" in r else "-"
        lines.append(
            f"| {layout} | {r['workers']} | {r['fps_s']:,.0f} | {r['times_one'] or float('nan'):.2f} "
            f"| {r['efficiency'] or float('nan'):.2f} | {cpu} | {r.get('service_cpu_cores', float('nan')):.2f} "
            f"| {found} | {r.get('other_findings', '-')} |"
        )
    return "\n".join(lines)


def plot(runs: list[dict[str, Any]], path: Path) -> None:
    try:
        importlib.import_module("matplotlib").use("Agg")
        plt = importlib.import_module("matplotlib.pyplot")
    except ImportError:
        raise SystemExit("the plot needs matplotlib: pip install 'bleedwatch-server[bench]'") from None
    masters = [r["masters"] for r in runs]
    fig, (ax_rate, ax_eff) = plt.subplots(1, 2, figsize=(10, 4))
    ax_rate.plot(masters, [r["fps_s"] / 1000 for r in runs], "o-", label="measured")
    base = next((r["fps_s"] for r in runs if not r["cluster"]), None)
    if base:
        top = max(masters)
        ax_rate.plot([1, top], [base / 1000, top * base / 1000], "--", color="grey", label="masters x one Redis")
    ax_rate.set(xlabel="Redis masters", ylabel="thousand fingerprints/s", title="ingest, end to end")
    ax_rate.legend()
    ax_eff.plot(masters, [r["efficiency"] for r in runs], "o-")
    ax_eff.axhline(0.8, color="grey", linestyle="--", label="target 0.8")
    ax_eff.set(xlabel="Redis masters", ylabel="efficiency", ylim=(0, 1.1), title="against masters x one Redis")
    ax_eff.legend()
    for ax in (ax_rate, ax_eff):
        ax.set_xticks(sorted(set(masters)))
    cpus = {r.get("cpus") for r in runs}
    fig.suptitle(f"bench/ingest.py on {'/'.join(str(c) for c in sorted(cpus, key=str))} cores")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--configs", nargs="+", default=["0:2", "3:4"], help="masters:workers (0 masters: one server)")
    p.add_argument("--from", dest="sources", nargs="+", type=Path, help="read RESULT lines instead of running")
    p.add_argument("--json", type=Path, help="write the runs, with their efficiency, here")
    p.add_argument("--plot", type=Path, help="write a PNG of the curve here (needs matplotlib)")
    args, extra = p.parse_known_args()  # the rest goes to every bench/ingest.py run
    if args.sources:
        runs = from_files(args.sources)
    else:
        configs = [tuple(int(x) for x in c.split(":")) for c in args.configs]
        runs = [run_config(m, w, extra) for m, w in configs]
    runs = with_efficiency(sorted(runs, key=lambda r: (r["cluster"], r["masters"])))
    print(table(runs))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(runs, indent=2) + "\n")
    if args.plot:
        plot(runs, args.plot)
        print(f"plot: {args.plot}")


if __name__ == "__main__":
    main()
