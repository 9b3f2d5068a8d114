"""The pipeline page: a small HTTP server (standard library, one thread) that serves the
graph of a running pipeline at ``/`` and its data as JSON at ``/api/pipeline``.

``creditflow top --web [HOST:]PORT URL...`` serves it for scraped ``/metrics`` endpoints
(:class:`Scraper`); ``creditflow.spark.Monitor(web=PORT)`` for the tasks of Spark jobs. The
page is one static file shipped in the package (``pipeline.html``: inline SVG, JavaScript
and CSS; nothing is fetched from anywhere else) that asks for ``/api/pipeline`` every second
and redraws without reloading.

Like :class:`~creditflow.NetworkEnvironment`, the server binds to loopback by default and
refuses a non-loopback address unless it is given a ``token`` (then every request must carry
it, as ``?token=...`` or ``Authorization: Bearer ...``; the printed URL includes it) or
``insecure=True``.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import socket
import threading
import time
import urllib.parse
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import TYPE_CHECKING

from creditflow.tools.pipeline import Pipeline, from_view
from creditflow.tools.snapshot import Snapshot, scrape_all, summarize

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = ["PipelineServer", "Scraper", "check_bind", "page", "parse_bind", "serve", "split_name"]

#: The page's file, beside this module.
ASSET = "pipeline.html"


def page() -> bytes:
    """The page (HTML with its script and style inline)."""
    return resources.files("creditflow.tools").joinpath(ASSET).read_bytes()


def parse_bind(value: str | int) -> tuple[str, int]:
    """``PORT``, ``HOST:PORT`` or ``[V6HOST]:PORT`` as ``(host, port)``; the host defaults to
    ``127.0.0.1``."""
    text = str(value).strip()
    host, sep, port = text.rpartition(":")
    if not sep:
        host, port = "127.0.0.1", text
    host = host.strip("[]") or "127.0.0.1"
    if not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"expected PORT or HOST:PORT with a port in 0..65535, got {text!r}")
    return host, int(port)


def _is_loopback(host: str) -> bool:
    try:
        infos = socket.getaddrinfo(host, None)
    except OSError:
        return False
    return bool(infos) and all(ipaddress.ip_address(str(i[4][0]).split("%")[0]).is_loopback for i in infos)


def check_bind(host: str, port: int, token: str | None, insecure: bool) -> None:
    """Refuses (``ValueError``) a non-loopback address without a token or ``insecure``, the
    rule :class:`~creditflow.NetworkEnvironment` applies to its own listener."""
    if token is None and not insecure and not _is_loopback(host):
        raise ValueError(
            f"refusing to serve the pipeline page on {host}:{port} without a token: anyone who can "
            "reach it could see your pipeline (addresses, partitions, throughput). Pass a token "
            "(--token, token=... or web_token=...), bind a loopback address, or pass --insecure "
            "(insecure=True or web_insecure=True)"
        )


def split_name(arg: str) -> tuple[str | None, str]:
    """``NAME=URL`` as ``(NAME, URL)``; a plain URL as ``(None, URL)``."""
    name, sep, url = arg.partition("=")
    if sep and name and not any(c in name for c in "/:?&"):
        return name, url
    return None, arg


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, host: str, port: int, app: PipelineServer) -> None:
        self.address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.app = app
        super().__init__((host, port), _Handler)


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base class's name
        """Quiet: a request a second is not worth a line on the terminal."""

    def _send(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        # Nothing but this page's own inline script and style, and its own /api/pipeline.
        self.send_header(
            "Content-Security-Policy",
            "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
            "connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'",
        )
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def do_GET(self) -> None:
        """``/`` (the page) and ``/api/pipeline`` (JSON)."""
        url = urllib.parse.urlsplit(self.path)
        app = self.server.app
        tokens = urllib.parse.parse_qs(url.query).get("token", [])
        if not app.authorized(tokens, self.headers.get("Authorization")):
            self._send(403, b"a valid token is needed (?token=...)\n", "text/plain; charset=utf-8")
        elif url.path in ("/", "/index.html"):
            self._send(200, page(), "text/html; charset=utf-8")
        elif url.path == "/api/pipeline":
            try:
                body = json.dumps(app.pipeline().to_json(), allow_nan=False).encode()
            except Exception as e:  # shown by the page, which keeps polling
                body = json.dumps({"error": f"{type(e).__name__}: {e}"}).encode()
                self._send(500, body, "application/json")
            else:
                self._send(200, body, "application/json")
        else:
            self._send(404, b"not found\n", "text/plain; charset=utf-8")

    do_HEAD = do_GET


class PipelineServer:
    """Serves the page and ``/api/pipeline`` for ``pipeline`` (called on every API request)
    on ``bind`` (``PORT`` or ``HOST:PORT``; port 0: any free one) in a thread of its own, until
    :meth:`close` (which then calls ``on_close``)."""

    def __init__(
        self,
        pipeline: Callable[[], Pipeline],
        bind: str | int = 0,
        *,
        token: str | None = None,
        insecure: bool = False,
        on_close: Callable[[], None] | None = None,
    ) -> None:
        host, port = parse_bind(bind)
        if token is not None and not token:
            raise ValueError("token must not be empty")
        check_bind(host, port, token, insecure)
        self.pipeline = pipeline
        self._on_close = on_close
        self._token = token
        self._server = _Server(host, port, self)
        self.host: str = host
        self.port: int = int(self._server.server_address[1])
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            name="creditflow-web",
            kwargs={"poll_interval": 0.2},
            daemon=True,
        )
        self._thread.start()
        self._closed = False

    def authorized(self, query_tokens: Sequence[str], authorization: str | None) -> bool:
        """Whether a request with these ``?token=`` values and ``Authorization`` header may see
        the page (always, without a token)."""
        if self._token is None:
            return True
        given = list(query_tokens)
        if authorization and authorization.startswith("Bearer "):
            given.append(authorization[len("Bearer ") :])
        want = self._token.encode()
        return any(hmac.compare_digest(t.encode(), want) for t in given)

    @property
    def url(self) -> str:
        """The page's address (with ``?token=...`` when there is one)."""
        host = socket.getfqdn() if self.host in ("0.0.0.0", "::") else self.host
        host = f"[{host}]" if ":" in host else host
        query = f"?token={urllib.parse.quote(self._token)}" if self._token else ""
        return f"http://{host}:{self.port}/{query}"

    def close(self) -> None:
        """Stops serving. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()
        if self._on_close is not None:
            self._on_close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_args: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"PipelineServer(url={self.url!r}, closed={self._closed})"


class Scraper:
    """Scrapes ``/metrics`` URLs every ``interval`` seconds in a thread of its own (as
    ``creditflow top`` does) and keeps the latest :class:`~creditflow.tools.pipeline.Pipeline`.
    ``names``: display names by URL (the environments scraped from it get that name).
    Throughputs are averaged over the last ``window`` seconds (at least one interval): data
    moves in whole buffers, so rates over a shorter time jump up and down. Levels and the
    bottleneck come from the latest scrape alone."""

    def __init__(
        self,
        urls: Sequence[str],
        interval: float = 1.0,
        names: Mapping[str, str] | None = None,
        window: float = 2.0,
    ) -> None:
        if not urls:
            raise ValueError("Scraper needs at least one URL")
        if not interval > 0:
            raise ValueError(f"interval must be positive, got {interval}")
        self.urls = list(urls)
        self.interval = interval
        self.window = max(window, interval)
        self.names = dict(names or {})
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._history: deque[Snapshot] = deque()
        self._latest = Pipeline("creditflow pipeline (waiting for the first two scrapes)", [], [])
        self.scrape()
        self._thread = threading.Thread(target=self._run, name="creditflow-scraper", daemon=True)
        self._thread.start()

    def scrape(self) -> Pipeline:
        """Scrapes every URL now; returns (and keeps) the pipeline."""
        snap, errors = scrape_all(self.urls, timeout=max(self.interval, 1.0))
        names = snap.names(self.names)
        with self._lock:
            history = self._history
            # The base of the rates: the newest earlier scrape at least `window` old.
            while len(history) > 1 and snap.time - history[1].time >= self.window:
                history.popleft()
            prev = history[0] if history else None
            history.append(snap)
        title = f"creditflow pipeline: {len(self.urls)} endpoint{'s' if len(self.urls) > 1 else ''}"
        pipeline = from_view(summarize(prev, snap), names, errors, title)
        with self._lock:
            self._latest = pipeline
        return pipeline

    def pipeline(self) -> Pipeline:
        """The latest pipeline."""
        with self._lock:
            return self._latest

    def _run(self) -> None:
        due = time.monotonic()
        while True:
            due += self.interval
            if self._stop.wait(max(0.0, due - time.monotonic())):
                return
            self.scrape()

    def close(self) -> None:
        """Stops scraping. Idempotent."""
        self._stop.set()
        self._thread.join()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_args: object) -> None:
        self.close()


def serve(
    urls: Sequence[str],
    bind: str | int = 0,
    *,
    interval: float = 1.0,
    names: Mapping[str, str] | None = None,
    token: str | None = None,
    insecure: bool = False,
) -> PipelineServer:
    """Scrapes ``urls`` every ``interval`` seconds (:class:`Scraper`; ``names`` by URL) and
    serves their page on ``bind``; closing the server stops the scraping. What ``creditflow
    top --web`` runs."""
    check_bind(*parse_bind(bind), token, insecure)  # before anything starts
    scraper = Scraper(urls, interval, names)
    try:
        return PipelineServer(scraper.pipeline, bind, token=token, insecure=insecure, on_close=scraper.close)
    except BaseException:
        scraper.close()
        raise
