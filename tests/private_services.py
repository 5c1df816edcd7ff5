"""Private PostgreSQL, RabbitMQ and Redis instances, for tests that break a dependency.

The shared services (5432, 5672, 6379) serve every test run on the machine: a test that
needs an outage starts an instance of its own here, on free loopback ports and in a
temporary folder, and stops, restarts, resets or kills only that one. Everything started
is stopped when its fixture ends, and at interpreter exit at the latest (``_ALIVE``), so no
server outlives the test session.

    pg = PrivatePostgres(); pg.start(); pg.create_database("hd")
    pg.restart()                       # pg_ctl restart -m fast
    pg.terminate_backends("hd")        # every client connection dropped

    rabbit = PrivateRabbitMQ(tmp, config={"max_message_size": "65536"}); rabbit.start()
    rabbit.stop(); rabbit.start()      # the node goes away, comes back with its definitions
    rabbit.reset()                     # back up, empty: no exchange, no queue

    redis = PrivateRedis(); redis.start(); redis.stop()
"""

from __future__ import annotations

import atexit
import contextlib
import ipaddress
import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pika
import pika.exceptions
import psycopg
import pytest
import redis

from tests.polling import wait_until
from tests.ports import free_port
from tests.processes import process_environment, wait_until_it_handles

ROOT = Path(__file__).resolve().parent.parent
HOST = "127.0.0.1"
POSTGRES_BIN = max(Path("/usr/lib/postgresql").glob("*/bin"), default=None)
RABBITMQ_BIN = Path("/usr/lib/rabbitmq/bin")

# Whatever is still running at exit (a test that crashed before its finalizer): close it.
_ALIVE: set = set()


@atexit.register
def _close_leftovers() -> None:
    for service in list(_ALIVE):
        with contextlib.suppress(Exception):
            service.close()


def _port_open(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((HOST, port)) == 0


def _kill_group(process: subprocess.Popen | None, timeout: float = 10) -> None:
    """SIGTERM, then SIGKILL, to a process started in its own session and its children."""
    if process is None or process.poll() is not None:
        return
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, sig)
        try:
            process.wait(timeout)
            return
        except subprocess.TimeoutExpired:
            continue


class PrivatePostgres:
    """A PostgreSQL cluster of its own: initdb into a temporary folder owned by the
    ``postgres`` OS user (the server refuses to run as root), own port, fsync off,
    listening on 127.0.0.1 only."""

    user = "postgres"
    # Where it listens and is reached.
    host = HOST

    def __init__(
        self, base_dir: str | Path | None = None, *, settings: dict[str, str] | None = None
    ) -> None:
        if POSTGRES_BIN is None:
            raise RuntimeError("PostgreSQL server binaries not found under /usr/lib/postgresql")
        # Not pytest's tmp_path: the postgres user cannot traverse root's private folders.
        self.dir = Path(tempfile.mkdtemp(prefix="hd-pg-", dir=base_dir or "/tmp"))
        self.data = self.dir / "data"
        self.log = self.dir / "server.log"
        self.port = free_port()
        owner = pwd.getpwnam(self.user)
        os.chown(self.dir, owner.pw_uid, owner.pw_gid)
        # Lines for postgresql.conf over the defaults below (``{"synchronous_commit": "on"}``).
        self.settings = settings or {}
        self._initialized = False
        _ALIVE.add(self)

    def _run(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
        command = [*self._prefix(), "runuser", "-u", self.user, "--", *args]
        return subprocess.run(
            command, capture_output=True, text=True, timeout=timeout, check=True, cwd=self.dir
        )

    def _prefix(self) -> list[str]:
        """What its commands run under (nothing here; a network namespace below)."""
        return []

    def _pg_ctl(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
        return self._run(
            str(POSTGRES_BIN / "pg_ctl"), "-D", str(self.data), "-l", str(self.log), *args,
            timeout=timeout,
        )  # fmt: skip

    def _initdb(self) -> None:
        self._run(
            str(POSTGRES_BIN / "initdb"), "-D", str(self.data), "-U", self.user,
            "--auth=trust", "-E", "UTF8", "--locale=C.UTF-8", "--no-sync",
        )  # fmt: skip
        settings = {
            "port": str(self.port),
            "listen_addresses": f"'{self.host}'",
            "unix_socket_directories": f"'{self.dir}'",
            "fsync": "off",
            "synchronous_commit": "off",
            "full_page_writes": "off",
            "max_connections": "100",
            "shared_buffers": "32MB",
            **self.settings,
        }
        self._configure(settings)
        self._initialized = True

    def _configure(self, settings: dict[str, str]) -> None:
        # Appended: a later line wins over an earlier one of the same name.
        with (self.data / "postgresql.conf").open("a") as conf:
            conf.writelines(f"{name} = {value}\n" for name, value in settings.items())

    def url(self, dbname: str = "postgres") -> str:
        return f"postgres://{self.user}@{self.host}:{self.port}/{dbname}"

    @property
    def running(self) -> bool:
        return (self.data / "postmaster.pid").exists()

    def start(self) -> None:
        """Start the server; returns once it accepts connections."""
        if not self._initialized:
            self._initdb()
        self._pg_ctl("-w", "-t", "60", "start")
        wait_until(self._accepts, timeout=30, message="private PostgreSQL accepting connections")

    def _accepts(self) -> bool:
        try:
            psycopg.connect(self.url(), connect_timeout=2).close()
        except psycopg.OperationalError:
            return False
        return True

    def stop(self, mode: str = "fast") -> None:
        """``pg_ctl stop -m MODE``: smart, fast or immediate."""
        if self.running:
            self._pg_ctl("-w", "-t", "60", "-m", mode, "stop")

    def kill(self) -> None:
        """SIGKILL to the postmaster and every process it started: a crash, nothing
        flushed, nothing said to the clients, whose connections just break."""
        pid_file = self.data / "postmaster.pid"
        with contextlib.suppress(FileNotFoundError, ValueError, IndexError):
            postmaster = int(pid_file.read_text().splitlines()[0])
            for pid in [postmaster, *_children(postmaster)]:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            wait_until(
                lambda: (
                    not Path(f"/proc/{postmaster}").exists()
                    or "zombie" in Path(f"/proc/{postmaster}/status").read_text()
                ),
                timeout=30,
                message=f"PostgreSQL postmaster {postmaster} gone",
            )
        pid_file.unlink(missing_ok=True)

    def restart(self, mode: str = "fast") -> None:
        self._pg_ctl("-w", "-t", "60", "-m", mode, "restart")
        wait_until(self._accepts, timeout=30, message="private PostgreSQL accepting connections")

    def execute(self, sql: str, params=None, dbname: str = "postgres"):
        with psycopg.connect(self.url(dbname), autocommit=True, connect_timeout=5) as conn:
            cursor = conn.execute(sql, params)
            return cursor.fetchall() if cursor.description else None

    def create_database(self, name: str, template: str | None = None) -> None:
        # Identifiers quoted by psycopg: a test may name its database anything.
        from psycopg import sql

        statement = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
        if template:
            statement += sql.SQL(" TEMPLATE {}").format(sql.Identifier(template))
        with psycopg.connect(self.url(), autocommit=True, connect_timeout=5) as conn:
            conn.execute(statement)

    def terminate_backends(self, dbname: str | None = None) -> int:
        """Drop every client connection (of one database, or all); how many were dropped.

        Returns once those backends have exited (pg_terminate_backend only signals them):
        from then on, every client that held one finds its connection dead.
        """
        rows = self.execute(
            """
            SELECT pid, pg_terminate_backend(pid)
              FROM pg_stat_activity
             WHERE pid <> pg_backend_pid() AND backend_type = 'client backend'
               AND (%(db)s::text IS NULL OR datname = %(db)s::text)
            """,
            {"db": dbname},
        )
        terminated = [pid for pid, signalled in rows if signalled]
        wait_until(
            lambda: (
                not self.execute("SELECT 1 FROM pg_stat_activity WHERE pid = ANY(%s)", [terminated])
            ),
            timeout=30,
            message=f"terminated backends {terminated} to exit",
        )
        return len(terminated)

    def close(self) -> None:
        """Stop the server (immediately) and remove its folder."""
        _ALIVE.discard(self)
        if self._initialized:
            with contextlib.suppress(Exception):
                self.stop("immediate")
        shutil.rmtree(self.dir, ignore_errors=True)


class VanishingLink:
    """An address in a network namespace of its own, reached from here over a veth pair.
    What listens there can vanish from the network as a machine switched off does:
    ``vanish()`` takes its end of the link down, and what is sent to it is dropped without
    a word (no reset, no answer, no route error) until ``come_back()``. Needs root.

    The address is drawn from the process id (10.128.0.0/12, a /30 each), so concurrent
    test processes never share one; a link left by a killed process of the same id is
    removed first.
    """

    _count = 0

    def __init__(self) -> None:
        VanishingLink._count += 1
        pid, n = os.getpid(), VanishingLink._count % 8
        self.name = f"hd{pid}n{n}"
        self.outer, self.inner = f"hd{pid}n{n}o", f"hd{pid}n{n}i"
        base = ipaddress.IPv4Address("10.128.0.0") + (pid * 8 + n) * 4
        self.near, self.address = str(base + 1), str(base + 2)
        _ALIVE.add(self)

    def _ip(self, *args: str, inside: bool = False, check: bool = True) -> None:
        command = [*(self.prefix() if inside else []), "ip", *args]
        subprocess.run(command, capture_output=True, text=True, timeout=30, check=check)

    def prefix(self) -> list[str]:
        """Runs a command inside the namespace."""
        return ["ip", "netns", "exec", self.name]

    def start(self) -> None:
        self.close()
        _ALIVE.add(self)
        self._ip("netns", "add", self.name)
        self._ip("link", "add", self.outer, "type", "veth", "peer", "name", self.inner)
        self._ip("link", "set", self.inner, "netns", self.name)
        self._ip("addr", "add", f"{self.near}/30", "dev", self.outer)
        self._ip("link", "set", self.outer, "up")
        self._ip("addr", "add", f"{self.address}/30", "dev", self.inner, inside=True)
        self._ip("link", "set", "lo", "up", inside=True)
        self.come_back()

    def vanish(self) -> None:
        self._ip("link", "set", self.inner, "down", inside=True)

    def come_back(self) -> None:
        self._ip("link", "set", self.inner, "up", inside=True)

    def close(self) -> None:
        _ALIVE.discard(self)
        self._ip("link", "del", self.outer, check=False)
        self._ip("netns", "del", self.name, check=False)


class VanishingPostgres(PrivatePostgres):
    """A ``PrivatePostgres`` that runs behind a ``VanishingLink``, listening on its address:
    ``link.vanish()`` is its machine switched off, for the clients connected to it."""

    def __init__(self, link: VanishingLink, **kwargs) -> None:
        self.link = link
        self.host = link.address
        super().__init__(**kwargs)

    def _prefix(self) -> list[str]:
        return self.link.prefix()

    def _initdb(self) -> None:
        super()._initdb()
        # Its clients, and a standby's replication, come from this side of the link.
        with (self.data / "pg_hba.conf").open("a") as hba:
            hba.write(f"host all all {self.link.near}/32 trust\n")
            hba.write(f"host replication all {self.link.near}/32 trust\n")

    def close(self) -> None:
        # Reachable again first: a fast stop waits for nothing it cannot reach.
        with contextlib.suppress(Exception):
            self.link.come_back()
        super().close()


def _children(pid: int) -> list[int]:
    """The processes whose parent is ``pid``."""
    found = []
    for status in Path("/proc").glob("[0-9]*/status"):
        with contextlib.suppress(OSError):
            fields = dict(
                line.split(":\t", 1) for line in status.read_text().splitlines() if ":\t" in line
            )
            if fields.get("PPid", "").strip() == str(pid):
                found.append(int(status.parent.name))
    return found


class PrivateStandby(PrivatePostgres):
    """A streaming standby of a ``PrivatePostgres``: a base backup of it (``pg_basebackup
    -R``, so it starts as a standby following the primary), its own port and folder, known
    to the primary as ``name`` (its ``synchronous_standby_names``). ``promote()`` makes it
    a primary."""

    def __init__(self, primary: PrivatePostgres, name: str = "standby") -> None:
        super().__init__()
        self.primary = primary
        self.name = name

    def _initdb(self) -> None:
        primary = self.primary
        conninfo = (
            f"host={primary.host} port={primary.port} user={self.user} application_name={self.name}"
        )
        self._run(
            str(POSTGRES_BIN / "pg_basebackup"), "-D", str(self.data), "-R", "-X", "stream",
            "-c", "fast", "--no-sync", "-d", conninfo,
            timeout=300,
        )  # fmt: skip
        # The primary's configuration came with the backup: this server's own address.
        self._configure({
            "port": str(self.port),
            "listen_addresses": f"'{self.host}'",
            "unix_socket_directories": f"'{self.dir}'",
            "hot_standby": "on",
            # Once promoted it has no standby of its own to wait for.
            "synchronous_standby_names": "''",
        })  # fmt: skip
        self._initialized = True

    def promote(self) -> None:
        """``pg_ctl promote``: returns once it takes writes."""
        self._pg_ctl("-w", "-t", "60", "promote")

    def streaming(self) -> str | None:
        """How the primary sees this standby: ``sync``, ``async`` … or None."""
        rows = self.primary.execute(
            "SELECT sync_state FROM pg_stat_replication WHERE application_name = %s",
            [self.name],
        )
        return rows[0][0] if rows else None


class PrivateRabbitMQ:
    """A RabbitMQ node of its own: own node name, AMQP and distribution ports, data and
    log folders, no plugins; ``config`` adds lines to its rabbitmq.conf
    (``{"max_message_size": "65536"}``). ``rabbitmqctl -n <node>`` drives it (the node and
    the CLI share root's Erlang cookie)."""

    def __init__(
        self,
        base_dir: str | Path,
        *,
        config: dict[str, str] | None = None,
        home: Path | None = None,
    ) -> None:
        self.dir = Path(base_dir) / f"rabbitmq-{uuid.uuid4().hex[:8]}"
        # Where the Erlang cookie is read (``$HOME/.erlang.cookie``): root's by default, a
        # cluster's own for the nodes of a ``PrivateRabbitMQCluster``.
        self.home = str(home) if home else os.environ.get("HOME", "/root")
        self.dir.mkdir(parents=True)
        self.node = f"hdtest{uuid.uuid4().hex[:10]}@localhost"
        self.port = free_port()
        self.dist_port = free_port()
        self.url = f"amqp://guest:guest@{HOST}:{self.port}/%2F"
        self.pid_file = self.dir / "node.pid"
        self.config_file = self.dir / "rabbitmq.conf"
        lines = {
            "listeners.tcp.1": f"{HOST}:{self.port}",
            # The shared broker's default: a busy test machine may be short of disk.
            "disk_free_limit.absolute": "50MB",
            **(config or {}),
        }
        self.config_file.write_text("".join(f"{k} = {v}\n" for k, v in lines.items()))
        (self.dir / "enabled_plugins").write_text("[].\n")
        self._process: subprocess.Popen | None = None
        _ALIVE.add(self)

    def _environment(self) -> dict[str, str]:
        return {
            **os.environ,
            "HOME": self.home,
            "RABBITMQ_NODENAME": self.node,
            "RABBITMQ_NODE_IP_ADDRESS": HOST,
            "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_DIST_PORT": str(self.dist_port),
            "RABBITMQ_MNESIA_BASE": str(self.dir / "mnesia"),
            "RABBITMQ_LOG_BASE": str(self.dir / "log"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(self.dir / "enabled_plugins"),
            "RABBITMQ_CONFIG_FILE": str(self.config_file),
            "RABBITMQ_PID_FILE": str(self.pid_file),
            "RABBITMQ_ALLOW_INPUT": "",
            # A node that dies writes its crash dump beside its data, not in the checkout.
            "ERL_CRASH_DUMP": str(self.dir / "erl_crash.dump"),
        }

    def ctl(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(RABBITMQ_BIN / "rabbitmqctl"), "-n", self.node, *args],
            env=self._environment(),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=True,
        )

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def start(self) -> None:
        """Start the node (with whatever definitions it had); returns once AMQP answers."""
        if self.running:
            return
        log = (self.dir / "console.log").open("ab")
        self._process = subprocess.Popen(
            [str(RABBITMQ_BIN / "rabbitmq-server")],
            env=self._environment(),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            # Its own process group: stopping it takes epmd-less children along, nothing else.
            start_new_session=True,
        )
        log.close()
        try:
            wait_until(
                self._accepts, timeout=90, message=f"private RabbitMQ {self.node} accepting AMQP"
            )
        except TimeoutError:
            self._kill()
            raise

    def _accepts(self) -> bool:
        if self._process is not None and self._process.poll() is not None:
            raise RuntimeError(
                f"private RabbitMQ {self.node} exited: "
                + (self.dir / "console.log").read_text()[-2000:]
            )
        if not _port_open(self.port):
            return False
        params = pika.URLParameters(self.url)
        params.connection_attempts = 1
        params.socket_timeout = 2
        try:
            pika.BlockingConnection(params).close()
        except pika.exceptions.AMQPError:
            return False
        return True

    def stop(self) -> None:
        """The whole node goes away (its port refuses connections)."""
        if not self.running:
            return
        with contextlib.suppress(subprocess.SubprocessError):
            self.ctl("stop", timeout=60)
        self._kill()

    def kill(self) -> None:
        """SIGKILL, no goodbye: the node's connections and cluster links just break."""
        if self._process is not None and self._process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._process.pid, signal.SIGKILL)
            self._process.wait(30)
        self._kill()

    def _kill(self) -> None:
        _kill_group(self._process)
        self._process = None
        # A beam left by a failed start (it writes its pid file once up).
        with contextlib.suppress(FileNotFoundError, ValueError, ProcessLookupError):
            os.kill(int(self.pid_file.read_text().strip()), signal.SIGKILL)
        self.pid_file.unlink(missing_ok=True)

    def reset(self) -> None:
        """Back up and EMPTY: no exchange, no queue (the default user and vhost only), as a
        node that lost its definitions or a brand new cluster."""
        if not self.running:
            self.start()
        self.ctl("stop_app")
        self.ctl("reset")
        self.ctl("start_app")
        wait_until(
            self._accepts, timeout=60, message=f"private RabbitMQ {self.node} accepting AMQP"
        )

    def close(self) -> None:
        _ALIVE.discard(self)
        self.stop()


class PrivateRabbitMQCluster:
    """Private RabbitMQ nodes joined in one cluster (three by default), with an Erlang
    cookie of the cluster's own: the nodes and the CLI read it from a home folder of theirs.

    ``url`` lists every node's AMQP URL, comma-separated, as ``RABBITMQ_URL`` takes a
    cluster; ``url_from(i)`` the same list starting at node ``i``. A node killed or stopped
    comes back with ``nodes[i].start()``, still a member.
    """

    def __init__(self, base_dir: str | Path, size: int = 3) -> None:
        self.dir = Path(base_dir)
        home = self.dir / "home"
        home.mkdir(parents=True, exist_ok=True)
        cookie = home / ".erlang.cookie"
        cookie.write_text(uuid.uuid4().hex.upper())
        cookie.chmod(0o400)
        self.nodes = [PrivateRabbitMQ(self.dir, home=home) for _ in range(size)]
        self._joined = False
        _ALIVE.add(self)

    @property
    def url(self) -> str:
        return self.url_from(0)

    def url_from(self, first: int) -> str:
        order = self.nodes[first:] + self.nodes[:first]
        return ",".join(node.url for node in order)

    def start(self) -> None:
        """Every node running and, the first time, nodes 2.. joined to node 1."""
        for node in self.nodes:
            node.start()
        if not self._joined:
            seed, *others = self.nodes
            for node in others:
                node.ctl("stop_app")
                node.ctl("join_cluster", seed.node)
                node.ctl("start_app")
                wait_until(node._accepts, timeout=60, message=f"{node.node} accepting AMQP")
            self._joined = True
        self.wait_until_all_running()

    def running_nodes(self, asked: PrivateRabbitMQ | None = None) -> set[str]:
        """The members a running node sees running (``rabbitmqctl cluster_status``)."""
        asked = asked or next(node for node in self.nodes if node.running)
        status = json.loads(asked.ctl("cluster_status", "--formatter", "json").stdout)
        return set(status["running_nodes"])

    def wait_until_all_running(self, timeout: float = 120) -> None:
        names = {node.node for node in self.nodes}
        wait_until(
            lambda: all(self.running_nodes(node) == names for node in self.nodes),
            timeout=timeout,
            message=f"every node of {sorted(names)} running in the cluster",
        )

    def queue_members(self, prefix: str = "") -> dict[str, tuple[set[str], set[str]]]:
        """Per quorum queue (whose name starts with ``prefix``): its members and those
        online."""
        asked = next(node for node in self.nodes if node.running)
        rows = json.loads(
            asked.ctl(
                "list_queues", "name", "type", "members", "online", "--formatter", "json"
            ).stdout
        )
        return {
            row["name"]: (set(row["members"]), set(row["online"]))
            for row in rows
            if row["type"] == "quorum" and row["name"].startswith(prefix)
        }

    def queue_depths(self, prefix: str = "") -> dict[str, dict[str, object]]:
        """Per queue of ``prefix``: messages ready, unacknowledged, consumers, leader."""
        asked = next(node for node in self.nodes if node.running)
        rows = json.loads(
            asked.ctl(
                "list_queues", "name", "messages_ready", "messages_unacknowledged",
                "consumers", "leader", "--formatter", "json",
            ).stdout
        )  # fmt: skip
        return {row.pop("name"): row for row in rows if row["name"].startswith(prefix)}

    def wait_until_queues_whole(self, prefix: str, timeout: float = 120) -> None:
        """Every quorum queue of ``prefix`` with every node among its members, all online:
        safe to take the next node away."""
        names = {node.node for node in self.nodes}
        wait_until(
            lambda: all(
                members == online == names
                for members, online in self.queue_members(prefix).values()
            ),
            timeout=timeout,
            message=f"the quorum queues {prefix}* on every node, all online",
        )

    def close(self) -> None:
        _ALIVE.discard(self)
        for node in self.nodes:
            node.close()


class PrivateRedis:
    """A redis-server of its own, no persistence, as a child process."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="hd-redis-"))
        self.port = free_port()
        self.url = f"redis://{HOST}:{self.port}/0"
        self._process: subprocess.Popen | None = None
        _ALIVE.add(self)

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def start(self) -> None:
        if self.running:
            return
        self._process = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", HOST, "--save", "",
             "--appendonly", "no", "--daemonize", "no", "--dir", str(self.dir)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip
        wait_until(self._accepts, timeout=20, message="private Redis answering PING")

    def _accepts(self) -> bool:
        conn = redis.Redis.from_url(self.url, socket_connect_timeout=1)
        try:
            return conn.ping()
        except redis.RedisError:
            return False
        finally:
            conn.close()

    def stop(self) -> None:
        self.thaw()
        _kill_group(self._process)
        self._process = None

    def freeze(self) -> None:
        """SIGSTOP: connections are still accepted by the kernel and nothing answers (a hung
        server, not a dead one)."""
        assert self._process is not None
        os.kill(self._process.pid, signal.SIGSTOP)

    def thaw(self) -> None:
        if self._process is not None and self._process.poll() is None:
            os.kill(self._process.pid, signal.SIGCONT)

    def close(self) -> None:
        _ALIVE.discard(self)
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


# -- daemons against private services ------------------------------------------------------------


def private_environment(
    settings,
    *,
    postgres: PrivatePostgres | None = None,
    database: str = "hubdommed",
    rabbitmq: PrivateRabbitMQ | None = None,
    redis: PrivateRedis | None = None,
    **extra: str,
) -> dict[str, str]:
    """``process_environment`` with DATABASE_URL / RABBITMQ_URL / REDIS_URL pointing at the
    private instances given (the others stay this run's shared ones)."""
    pointed: dict[str, str] = {}
    if postgres is not None:
        pointed["DATABASE_URL"] = postgres.url(database)
    if rabbitmq is not None:
        pointed["RABBITMQ_URL"] = rabbitmq.url
    if redis is not None:
        pointed["REDIS_URL"] = redis.url
    return process_environment(settings, **{**pointed, **extra})


def migrate(postgres: PrivatePostgres, database: str, settings) -> None:
    """Create ``database`` on the private cluster and run ``manage.py migrate`` into it."""
    postgres.create_database(database)
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "--no-input", "-v", "0"],
        cwd=ROOT,
        env=private_environment(settings, postgres=postgres, database=database),
        check=True,
        capture_output=True,
        timeout=300,
    )


class Daemon:
    """``manage.py <command>`` as a subprocess (a daemon under test); its log lines (stderr)
    collected as they come, so a test can wait for one."""

    def __init__(self, command: str, *args: str, env: dict[str, str]) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "manage.py", command, *args],
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.process.stderr:
            self.lines.append(line.rstrip("\n"))

    @property
    def log(self) -> str:
        return "\n".join(self.lines)

    def wait_for_line(self, text: str, timeout: float, after: int = 0) -> str:
        """The first log line from number ``after`` on that contains ``text``."""

        def found():
            return next((line for line in self.lines[after:] if text in line), None)

        return wait_until(found, timeout=timeout, message=f"a log line with {text!r}")

    def stop(self, timeout: float = 20) -> int:
        """SIGTERM once the daemon handles it, wait (SIGKILL past ``timeout``); the exit
        code."""
        if self.process.poll() is None:
            wait_until_it_handles(self.process, signal.SIGTERM, timeout=60)
            self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout)
        finally:
            if self.process.poll() is None:
                self.process.kill()
                self.process.wait()
        self._reader.join(5)
        self.out = self.process.stdout.read() if not self.process.stdout.closed else ""
        self.process.stdout.close()
        return self.process.returncode


# -- fixtures (registered in tests/conftest.py) -------------------------------------------------

# Migrated once per private cluster; each test copies it (CREATE DATABASE … TEMPLATE).
MIGRATED_TEMPLATE = "hubdommed_template"


@pytest.fixture(scope="session")
def _private_postgres_cluster() -> Iterator[PrivatePostgres]:
    """One private cluster for the whole run of this process: starting one and migrating
    its template costs seconds, and no test leaves it broken (one that stops or restarts
    it, the point of such a test, leaves it to be started again)."""
    pg = PrivatePostgres()
    try:
        yield pg
    finally:
        pg.close()


@pytest.fixture(scope="module")
def private_postgres(_private_postgres_cluster) -> PrivatePostgres:
    """A private PostgreSQL cluster, running when the module begins (the run's one, see
    ``_private_postgres_cluster``). ``migrated_database`` gives a test its own migrated
    database on it."""
    if not _private_postgres_cluster.running:
        _private_postgres_cluster.start()
    return _private_postgres_cluster


@pytest.fixture
def migrated_database(private_postgres, settings) -> str:
    """The name of a fresh, migrated database on ``private_postgres`` (a copy of a template
    migrated once per module)."""
    if not private_postgres.running:
        private_postgres.start()
    exists = private_postgres.execute(
        "SELECT 1 FROM pg_database WHERE datname = %s", [MIGRATED_TEMPLATE]
    )
    if not exists:
        migrate(private_postgres, MIGRATED_TEMPLATE, settings)
    name = f"hd_{uuid.uuid4().hex[:10]}"
    private_postgres.create_database(name, template=MIGRATED_TEMPLATE)
    return name


@pytest.fixture(scope="module")
def private_rabbitmq_factory(tmp_path_factory) -> Iterator[Callable[..., PrivateRabbitMQ]]:
    """Start private RabbitMQ nodes (``factory(config={...})``); all closed at module end."""
    nodes: list[PrivateRabbitMQ] = []

    def factory(*, config: dict[str, str] | None = None) -> PrivateRabbitMQ:
        node = PrivateRabbitMQ(tmp_path_factory.mktemp("rabbitmq"), config=config)
        nodes.append(node)
        node.start()
        return node

    try:
        yield factory
    finally:
        for node in nodes:
            node.close()


@pytest.fixture(scope="session")
def _private_rabbitmq_node(tmp_path_factory) -> Iterator[PrivateRabbitMQ]:
    """One private RabbitMQ node (the default configuration) for the whole run of this
    process: starting one takes several seconds. A test that stops or resets it leaves it
    to be started again; names are each test's own, so what one module declared there is
    nothing another reads."""
    node = PrivateRabbitMQ(tmp_path_factory.mktemp("rabbitmq"))
    try:
        yield node
    finally:
        node.close()


@pytest.fixture(scope="module")
def private_rabbitmq(_private_rabbitmq_node) -> PrivateRabbitMQ:
    """A private RabbitMQ node, running when the module begins (nodes with a configuration
    of their own come from ``private_rabbitmq_factory``)."""
    _private_rabbitmq_node.start()
    return _private_rabbitmq_node


@pytest.fixture
def running_private_rabbitmq(private_rabbitmq) -> PrivateRabbitMQ:
    """``private_rabbitmq``, started again if an earlier test left it stopped."""
    private_rabbitmq.start()
    return private_rabbitmq


@pytest.fixture
def private_redis() -> Iterator[PrivateRedis]:
    server = PrivateRedis()
    try:
        server.start()
        yield server
    finally:
        server.close()
