"""A real S3-compatible server on localhost for tests and benchmarks (moto in server mode).

Clients speak to it over HTTP exactly as to S3 (s3fs, boto3: nothing is patched); the
environment that points them at it is :meth:`S3Server.env`. A ``hook`` sees every request
before the server does, which lets a test deny access, hang, or kill a client mid-upload
the way a real store or network would. Needs ``moto[server]`` (the ``test`` extra).

>>> with S3Server(bucket="demo") as server:                      # doctest: +SKIP
...     server.url("graph")
's3://demo/graph'
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

Hook = Callable[["Request"], "Response | None"]


@dataclass(frozen=True)
class Request:
    method: str
    path: str  # /bucket/key


@dataclass(frozen=True)
class Response:
    """What a hook answers instead of the server (an S3 error document)."""

    status: int
    code: str
    message: str

    def wsgi(self, start_response: Callable[..., Any]) -> Iterable[bytes]:
        body = (f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{self.code}</Code>'
                f"<Message>{self.message}</Message></Error>").encode()
        start_response(f"{self.status} {self.code}", [("Content-Type", "application/xml"),
                                                     ("Content-Length", str(len(body)))])
        return [body]


ACCESS_DENIED = Response(403, "AccessDenied", "Access Denied")


class S3Server:
    """moto's S3 on ``127.0.0.1`` (a free port), with ``bucket`` created; a context manager."""

    def __init__(self, bucket: str = "pbg-test", hook: Hook | None = None) -> None:
        self.bucket = bucket
        self.hook = hook
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self.requests = 0
        self.bytes_received = 0  # request bodies (uploads)
        self.bytes_sent = 0  # response bodies (downloads, listings)

    @property
    def endpoint(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def env(self) -> dict[str, str]:
        """Variables that point S3 clients (s3fs, boto3, a child process) at this server."""
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": "testing",
                "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
                "AWS_EC2_METADATA_DISABLED": "true"}

    def url(self, key: str = "") -> str:
        return f"s3://{self.bucket}/{key}".rstrip("/")

    def start(self) -> S3Server:
        from moto.server import DomainDispatcherApplication, create_backend_app  # type: ignore[attr-defined]
        from werkzeug.serving import make_server

        logging.getLogger("werkzeug").setLevel(logging.ERROR)
        app = DomainDispatcherApplication(create_backend_app)

        def hooked(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
            self.requests += 1
            self.bytes_received += int(environ.get("CONTENT_LENGTH") or 0)
            if self.hook is not None:
                answer = self.hook(Request(environ["REQUEST_METHOD"], environ.get("PATH_INFO", "")))
                if answer is not None:
                    return answer.wsgi(start_response)
            return self._counted(app(environ, start_response))

        self._server = make_server("127.0.0.1", 0, hooked, threaded=True)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True, name="s3-server")
        self._thread.start()
        os.environ.update(self.env())
        import s3fs

        s3fs.S3FileSystem.clear_instance_cache()
        s3fs.S3FileSystem(use_listings_cache=False, skip_instance_cache=True).mkdir(self.bucket)
        return self

    def _counted(self, body: Iterable[bytes]) -> Iterable[bytes]:
        try:
            for chunk in body:
                self.bytes_sent += len(chunk)
                yield chunk
        finally:
            close = getattr(body, "close", None)
            if close is not None:
                close()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join()
        import s3fs

        s3fs.S3FileSystem.clear_instance_cache()

    def __enter__(self) -> S3Server:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
