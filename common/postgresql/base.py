"""Django's PostgreSQL backend with one change: with several hosts in ``DATABASE_URL``, a
process asks first the host that took its last connection.

libpq tries the hosts of a connection string in the order given. After a failover whose
old primary vanished (a machine switched off: no reset, no answer), every new connection
would wait ``DB_CONNECT_TIMEOUT`` on it before trying the next host, for as long as the URL
names it first: each request of a process that had to reconnect, each of the relay's claim
connections, one after the other. So each process remembers, per database alias, the host
that served it last and puts it first. A host that is no longer the primary is left by
libpq's own check (``target_session_attrs``) at once, and the others are tried in their
order, as before. The settings are not changed: the order is the process's memory.
"""

from __future__ import annotations

from typing import Any

from django.db.backends.postgresql import base

# alias -> (host, port) of the host that took that alias's last connection in this
# process; each value replaced whole, so a thread never reads half of one.
_served_last: dict[str, tuple[str, str]] = {}


class DatabaseWrapper(base.DatabaseWrapper):
    def get_connection_params(self) -> dict[str, Any]:
        params = super().get_connection_params()
        served = _served_last.get(self.alias)
        if served is not None:
            served_first(params, served)
        return params

    def get_new_connection(self, conn_params: dict[str, Any]) -> Any:
        connection = super().get_new_connection(conn_params)
        if "," in str(conn_params.get("host", "")):
            _served_last[self.alias] = (connection.info.host, str(connection.info.port))
        return connection


def served_first(params: dict[str, Any], served: tuple[str, str]) -> None:
    """Move the (host, port) pair ``served`` to the front of ``params``' host list, when it
    is one of them. A port for each host, or one for all (or none: libpq's default)."""
    hosts = str(params.get("host", "")).split(",")
    ports = str(params.get("port", "")).split(",")
    if len(hosts) < 2 or len(ports) not in (1, len(hosts)):
        return
    each_own_port = len(ports) == len(hosts)
    pairs = list(zip(hosts, ports if each_own_port else ports * len(hosts), strict=True))
    host, port = served
    at = next(
        (i for i, (h, p) in enumerate(pairs) if h == host and (p == port or not p)),
        None,
    )
    if not at:  # not found, or first already
        return
    pairs.insert(0, pairs.pop(at))
    params["host"] = ",".join(h for h, _ in pairs)
    if each_own_port:
        params["port"] = ",".join(p for _, p in pairs)
