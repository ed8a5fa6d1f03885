"""A throwaway PostgreSQL server for the ledger's server tests: a fresh data folder, a free
loopback port, trust authentication, stopped and removed at teardown. Found from ``pg_ctl``
and ``initdb`` on PATH or under /usr/lib/postgresql/*/bin; the tests skip without them.

PostgreSQL refuses to run as root: as root, the server runs as the ``postgres`` user (which
the distribution packages create), in a folder it owns.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from glob import glob
from pathlib import Path

USER = "kernelab"


def binaries() -> Path | None:
    """The folder holding pg_ctl and initdb, newest version first; None when absent."""
    versions = glob("/usr/lib/postgresql/*/bin/pg_ctl")
    newest = sorted(
        versions, key=lambda p: int(p.split("/")[4]) if p.split("/")[4].isdigit() else 0
    )
    found = [shutil.which("pg_ctl"), *newest[::-1]]
    for pg_ctl in found:
        if pg_ctl and (Path(pg_ctl).resolve().parent / "initdb").is_file():
            return Path(pg_ctl).resolve().parent
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _as_server_user() -> dict:
    """subprocess arguments that run a command as a user PostgreSQL accepts."""
    if os.geteuid() != 0:
        return {}
    try:
        pw = pwd.getpwnam("postgres")
    except KeyError:
        pw = pwd.getpwnam("nobody")
    return {"user": pw.pw_uid, "group": pw.pw_gid, "extra_groups": []}


class Server:
    def __init__(self, bindir: Path, port: int, root: Path):
        self.bindir, self.port, self.root = bindir, port, root

    def url(self, database: str, driver: str | None = None) -> str:
        scheme = "postgresql" if driver is None else f"postgresql+{driver}"
        return f"{scheme}://{USER}@127.0.0.1:{self.port}/{database}"

    def createdb(self, name: str) -> str:
        self.run("createdb", "-h", "127.0.0.1", "-p", str(self.port), "-U", USER, name)
        return name

    def psql(self, database: str, sql: str) -> str:
        return self.run(
            "psql", "-h", "127.0.0.1", "-p", str(self.port), "-U", USER, "-d", database,
            "-XAtq", "-v", "ON_ERROR_STOP=1", "-c", sql,
        )  # fmt: skip

    def run(self, tool: str, *args: str) -> str:
        out = subprocess.run(
            [str(self.bindir / tool), *args],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=self.root,
            **_as_server_user(),
        )
        if out.returncode:
            raise RuntimeError(f"{tool} failed: {out.stderr.strip()}")
        return out.stdout


@contextlib.contextmanager
def running() -> Iterator[Server]:
    bindir = binaries()
    if bindir is None:
        raise FileNotFoundError("pg_ctl/initdb not found")
    root = Path(tempfile.mkdtemp(prefix="kernelab-pg-"))  # under /tmp: the server user's too
    who = _as_server_user()
    if who:
        os.chown(root, who["user"], who["group"])
    server = Server(bindir, _free_port(), root)
    data, log = root / "data", root / "server.log"
    try:
        server.run("initdb", "-D", str(data), "-U", USER, "-A", "trust", "-E", "UTF8", "--no-sync")
        options = f"-c listen_addresses=127.0.0.1 -p {server.port} -k '' -c fsync=off"
        t0 = time.monotonic()
        server.run("pg_ctl", "-D", str(data), "-l", str(log), "-o", options, "-w", "start")
        server.started_s = time.monotonic() - t0
        yield server
    finally:
        with contextlib.suppress(Exception):
            server.run("pg_ctl", "-D", str(data), "-m", "immediate", "-w", "stop")
        shutil.rmtree(root, ignore_errors=True)
