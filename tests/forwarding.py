"""A loopback port in front of a real server that a test opens and closes: the server
seen through it comes and goes (an outage, a late start) while the server itself runs on."""

from __future__ import annotations

import contextlib
import socket
import threading

from tests.ports import free_port


class Forwarder:
    """Connections to ``port`` reach ``target`` while open; refused while closed (and
    those open at the moment of closing are cut)."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.port = free_port()
        self._listener: socket.socket | None = None
        self._sockets: set[socket.socket] = set()
        self._lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def open(self) -> Forwarder:
        listener = socket.create_server(("127.0.0.1", self.port), backlog=64)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()
        return self

    def close(self) -> None:
        # Under the lock, with the connections: one being set up right now either was
        # registered before (and is cut here) or sees the forwarder closed (and drops
        # itself), never forwarded through the outage.
        with self._lock:
            listener, self._listener = self._listener, None
            sockets, self._sockets = self._sockets, set()
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=5)
                upstream.settimeout(None)
            except OSError:
                client.close()
                continue
            with self._lock:
                closed = self._listener is not listener
                if not closed:
                    self._sockets.update((client, upstream))
            if closed:
                # Closed while this connection was being set up: cut as the others were.
                for sock in (client, upstream):
                    with contextlib.suppress(OSError):
                        sock.shutdown(socket.SHUT_RDWR)
                    sock.close()
                continue
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(source, sink), daemon=True).start()

    @staticmethod
    def _pipe(source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                sink.sendall(data)
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)
