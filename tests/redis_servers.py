"""Throwaway Redis servers on free loopback ports, in a temporary directory: for fault and cluster tests.

Never the shared server at BLEEDWATCH_TEST_REDIS_URL: these are ours to kill, restart and throw
away. ``RedisServer`` is one standalone server (optionally with an append-only file, so a killed
server comes back with its data); ``RedisClusterServers`` is a 3-master Redis Cluster built with
``redis-cli --cluster create``.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import redis


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def free_port_pair(offset: int = 10000) -> int:
    """A free port whose ``port + offset`` is free too (a cluster node's bus port)."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port: int = s.getsockname()[1]
        if port + offset < 65536 and _port_free(port + offset):
            return port
    raise RuntimeError("no free pair of loopback ports")


def redis_binary() -> str:
    found = shutil.which("redis-server")
    if found is None:
        raise RuntimeError("redis-server is not installed (Debian: apt-get install redis-server)")
    return found


class RedisServer:
    """One redis-server of ours. ``kill()`` is SIGKILL; ``start()`` again reuses the port and directory."""

    def __init__(
        self,
        directory: Path,
        port: int | None = None,
        *,
        durable: bool = False,
        args: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
    ):
        """``env``: the server's environment (bench/faults.py preloads a library that logs AOF fsyncs)."""
        self.directory = directory
        self.env = env
        self.port = port if port is not None else free_port_pair(0)
        self.durable = durable
        self.args = args
        self.process: subprocess.Popen[bytes] | None = None
        directory.mkdir(parents=True, exist_ok=True)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def command(self) -> list[str]:
        persistence = ["--appendonly", "yes", "--appendfsync", "always"] if self.durable else ["--appendonly", "no"]
        return [
            redis_binary(),
            "--bind",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--save",
            "",
            "--dir",
            str(self.directory),
            "--logfile",
            str(self.directory / "redis.log"),
            *persistence,
            *self.args,
        ]

    def start(self, timeout: float = 10.0) -> None:
        self.process = subprocess.Popen(
            self.command(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=self.env
        )
        deadline = time.monotonic() + timeout
        client = redis.Redis(port=self.port, socket_connect_timeout=0.5)
        try:
            while True:
                try:
                    if client.ping():
                        return
                except redis.exceptions.BusyLoadingError:
                    pass
                except redis.ConnectionError:
                    if self.process.poll() is not None:
                        raise RuntimeError(f"redis-server exited: see {self.directory / 'redis.log'}") from None
                if time.monotonic() > deadline:
                    raise RuntimeError(f"redis-server on port {self.port} did not answer within {timeout} s")
                time.sleep(0.02)
        finally:
            client.close()

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=10)
        self.process = None

    def stop(self) -> None:
        self.kill()


class RedisClusterServers:
    """Masters (three by default) with no replicas, every slot assigned, on free loopback ports."""

    def __init__(self, directory: Path, masters: int = 3, args: tuple[str, ...] = ()) -> None:
        self.directory = directory
        self.nodes: list[RedisServer] = []
        ports: list[int] = []
        while len(ports) < masters:
            port = free_port_pair()
            if port not in ports:
                ports.append(port)
        for port in ports:
            node_dir = directory / str(port)
            self.nodes.append(
                RedisServer(
                    node_dir,
                    port,
                    args=(
                        "--cluster-enabled",
                        "yes",
                        "--cluster-config-file",
                        str(node_dir / "nodes.conf"),
                        "--cluster-node-timeout",
                        "2000",
                        *args,
                    ),
                )
            )

    @property
    def url(self) -> str:
        return self.nodes[0].url

    def start(self, timeout: float = 30.0) -> None:
        for node in self.nodes:
            node.start()
        cli = shutil.which("redis-cli")
        if cli is None:
            raise RuntimeError("redis-cli is not installed")
        subprocess.run(
            [
                cli,
                "--cluster",
                "create",
                *(f"127.0.0.1:{n.port}" for n in self.nodes),
                "--cluster-replicas",
                "0",
                "--cluster-yes",
            ],
            check=True,
            capture_output=True,
            timeout=timeout,
        )
        deadline = time.monotonic() + timeout
        for node in self.nodes:
            client = redis.Redis(port=node.port)
            try:
                while client.execute_command("CLUSTER INFO").get("cluster_state") != "ok":  # type: ignore[no-untyped-call]
                    if time.monotonic() > deadline:
                        raise RuntimeError("the Redis Cluster did not reach cluster_state:ok")
                    time.sleep(0.05)
            finally:
                client.close()

    def stop(self) -> None:
        for node in self.nodes:
            with contextlib.suppress(Exception):
                node.kill()
        shutil.rmtree(self.directory, ignore_errors=True)
