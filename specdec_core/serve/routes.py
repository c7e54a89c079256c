"""The HTTP side: GET /v1/models and POST /v1/chat/completions (streamed as server-sent events,
or not), GET /metrics (Prometheus), who may call them, and every failure as one OpenAI-shaped
error, never a traceback.

The routes are plain starlette routes, so the app can put them on the server gradio runs.
"""

from __future__ import annotations

import asyncio
import functools
import hmac
import ipaddress
import json
import logging
import threading
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass
from urllib.parse import urlsplit

import anyio
import torch
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Match, Route

from ..errors import DeviceBusy, LoadError, QueueFull
from ..presets.config import AUTO
from ..presets.holder import Cancelled, ModelHolder
from .completion import Completion
from .errors import ApiError
from .metrics import ServerMetrics
from .request import ChatRequest, parse_chat_request, parse_json
from .response import ChunkWriter, chat_completion

log = logging.getLogger("specdec.api")

API_KEY_ENV = "SPECDEC_API_KEY"
DISCONNECTED = 499  # nginx's "client closed request": nobody reads it, but logs show why
# A request body larger than this is refused (413) before it is read whole: a context-length
# conversation is a few hundred KB of JSON even for long-context models.
MAX_BODY_BYTES = 4 * 1024 * 1024
ALL_METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]


@dataclass(frozen=True)
class ApiAccess:
    """Whether the API is on, the key it requires (None: open), and the web pages besides the
    server's own that may call it (their origins, as `http://localhost:3000`)."""

    enabled: bool
    key: str | None
    allowed_origins: tuple[str, ...] = ()

    def launch_line(self, url: str) -> str:
        """The one line the app prints at launch about the API."""
        if not self.enabled:
            return ("OpenAI-compatible API off: this server is reachable from other machines and has no key; "
                    f"start it with --api-key KEY (or set {API_KEY_ENV}) to turn it on.")
        guard = "requires 'Authorization: Bearer <key>'" if self.key else "open to this machine, no key"
        return f"OpenAI-compatible API at {url.rstrip('/')}/v1 ({guard})"


def access_for(host: str, share: bool, key: str | None, allowed_origins: Collection[str] = ()) -> ApiAccess:
    """Open on the loopback address with no key; with a key, guarded; reachable from elsewhere
    (a share link, a non-loopback host) with no key: off, so no public link exposes an open
    generation endpoint."""
    return ApiAccess(enabled=bool(key) or (is_loopback(host) and not share), key=key or None,
                     allowed_origins=tuple(_origin(o) for o in allowed_origins))


def is_loopback(host: str) -> bool:
    """Whether an address to serve on (or a Host name) only this machine can reach."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a host name: it may resolve to anything
        return False


def _origin(url: str) -> str:
    """An origin as browsers send it: scheme://host[:port], lower case, no path or slash."""
    parts = urlsplit(url.strip())
    return f"{parts.scheme}://{parts.netloc}".lower() if parts.scheme and parts.netloc else url.strip().lower()


def api_routes(holder: ModelHolder, presets: Collection[str], access: ApiAccess,
               default_max_tokens: int = 256) -> list[Route]:
    """The API's routes over the shared models (when off, they say how to turn it on)."""
    if not access.enabled:
        return [Route(path, _api_off, methods=ALL_METHODS) for path in ("/v1", "/v1/{path:path}", "/metrics")]
    presets = list(presets)
    metrics = ServerMetrics(waiting=lambda: holder.turns.waiting)

    async def models(request: Request) -> Response:
        return await _answer(request, access, lambda: _models_body(presets, holder))

    async def model(request: Request) -> Response:
        def body() -> dict:
            name = request.path_params["model"]
            found = [m for m in _models_body(presets, holder)["data"] if m["id"] == name]
            if not found:
                raise ApiError(404, f"The model '{name}' does not exist: use one of {', '.join([AUTO, *presets])}.",
                               param="model", code="model_not_found")
            return found[0]
        return await _answer(request, access, body)

    async def chat_completions(request: Request) -> Response:
        try:
            _check_access(request, access)
            _check_json_type(request)
            body = parse_json(await _read_body(request))
            chat = parse_chat_request(body, presets, default_max_tokens)
        except ApiError as error:
            return error_response(error)
        return await _complete(request, holder, chat, metrics)

    async def scrape(request: Request) -> Response:
        try:
            _check_access(request, access)
        except ApiError as error:
            return error_response(error)
        text, content_type = metrics.scrape(request.headers.get("accept"))
        return Response(text, media_type=content_type)

    routes = [Route("/v1/models", _last_resort(models), methods=["GET"]),
              Route("/v1/models/{model}", _last_resort(model), methods=["GET"]),
              Route("/v1/chat/completions", _last_resort(chat_completions), methods=["POST"]),
              Route("/metrics", _last_resort(scrape), methods=["GET"])]

    async def elsewhere(request: Request) -> Response:
        """Any other /v1 path or method, answered in OpenAI's shape (Starlette's is {"detail"})."""
        for route in routes:
            if route.matches(request.scope)[0] == Match.PARTIAL:  # the path, with another method
                allowed = sorted(route.methods - {"HEAD"})
                return error_response(ApiError(405, f"{request.method} is not allowed on {request.url.path}: "
                                                    f"use {', '.join(allowed)}.", code="method_not_allowed"))
        served = ", ".join(f"{min(r.methods - {'HEAD'})} {r.path}" for r in routes)
        return error_response(ApiError(404, f"There is no {request.method} {request.url.path} here: this server "
                                            f"answers {served}.", code="unknown_url"))

    return [*routes, Route("/v1", _last_resort(elsewhere), methods=ALL_METHODS),
            Route("/v1/{path:path}", _last_resort(elsewhere), methods=ALL_METHODS)]


def _last_resort(handler: Callable[[Request], Awaitable[Response]]) -> Callable[[Request], Awaitable[Response]]:
    """The handler, with any error it did not expect turned into OpenAI's shape (a 500 with
    one line) and one line in the log, never Starlette's plain-text 500 and a traceback."""

    @functools.wraps(handler)
    async def guarded(request: Request) -> Response:
        try:
            return await handler(request)
        except Exception as error:  # noqa: BLE001 - the last resort: every failure is one line
            line = _first_line(error)
            log.error("%s %s failed: %s", request.method, request.url.path, line)
            return error_response(ApiError(500, f"Internal error ({line}); the server's log has this line.",
                                           type="server_error"))

    return guarded


async def _answer(request: Request, access: ApiAccess, body: Callable[[], dict]) -> Response:
    try:
        _check_access(request, access)
        return JSONResponse(body())
    except ApiError as error:
        return error_response(error)


def _models_body(presets: list[str], holder: ModelHolder) -> dict:
    loaded = holder.models.preset.name if holder.models else None
    return {"object": "list", "data": [
        {"id": name, "object": "model", "created": 0, "owned_by": "specdec", "loaded": name == loaded}
        for name in [AUTO, *presets]
    ]}


async def _api_off(request: Request) -> Response:
    return error_response(ApiError(
        403, f"The API is off: this server is reachable from other machines and was started without a key. "
             f"Restart it with --api-key KEY (or set {API_KEY_ENV}).", type="permission_error", code="api_off"))


def _check_access(request: Request, access: ApiAccess) -> None:
    """Every route's guard: a page of another site is refused, then a missing or wrong key."""
    _check_origin(request, access)
    _check_key(request, access.key)


def _check_key(request: Request, key: str | None) -> None:
    if key is None:
        return
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), key.encode()):
        raise ApiError(401, "Missing or wrong API key: send 'Authorization: Bearer KEY' with the key the "
                            f"server was started with (--api-key or {API_KEY_ENV}).", code="invalid_api_key")


def _check_origin(request: Request, access: ApiAccess) -> None:
    """Refuse requests a web page sent from another site (cross-site request forgery).

    Browsers send `Origin` with every cross-site request, including the "simple" ones they send
    without asking first; SDKs and curl send none. The page's own origin is the server's: the
    Host it called. While the API has no key that must be a loopback name, or a site whose name
    resolves to 127.0.0.1 (DNS rebinding) would pass for the server itself."""
    origin = request.headers.get("origin")
    if origin is None or _origin(origin) in access.allowed_origins:
        return
    host = request.headers.get("host", "").lower()
    own = urlsplit(origin.lower()).netloc == host and (access.key is not None or is_loopback(_host_name(host)))
    if not own:
        raise ApiError(403, f"Requests from the web page at {origin} are refused, so other sites can't use this "
                            "server: to let that page call the API, start the app with --allowed-origins "
                            f"{_origin(origin)}.", type="permission_error", code="origin_not_allowed")


def _host_name(host: str) -> str:
    """`127.0.0.1:7860` -> `127.0.0.1`, `[::1]:7860` -> `::1`."""
    return urlsplit(f"//{host}").hostname or ""


def _check_json_type(request: Request) -> None:
    """A body must say it is JSON: a browser sends text/plain or form bodies cross-site without
    asking the server first, and JSON only after the server's CORS rules allow it."""
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind != "application/json":
        raise ApiError(415, f"The body must be JSON sent with 'Content-Type: application/json' (got "
                            f"{kind or 'no Content-Type'}).", code="unsupported_media_type")


async def _read_body(request: Request) -> bytes:
    """The body, refused with 413 as soon as it is known to exceed MAX_BODY_BYTES."""
    too_large = ApiError(413, f"The request body is over {MAX_BODY_BYTES // 2**20} MiB, this server's limit: send "
                              "a shorter conversation.", code="request_too_large")
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise too_large
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise too_large
        chunks.append(chunk)
    return b"".join(chunks)


# ---------------------------------------------------------------- generating


async def _complete(request: Request, holder: ModelHolder, chat: ChatRequest, metrics: ServerMetrics) -> Response:
    """Wait for the device, then answer at once (non-streamed) or as server-sent events.

    Everything that can refuse the request (a full queue, a model that can't load, a prompt
    over the context) happens before the first byte, so it gets its own status code."""
    gone = threading.Event()  # set when the client disconnects: waiting and generating stop
    watcher = asyncio.ensure_future(_watch_disconnect(request, gone))
    try:
        job = await anyio.to_thread.run_sync(Completion.start, holder, chat, gone, metrics)
    except Cancelled:
        watcher.cancel()
        return Response(status_code=DISCONNECTED)
    except Exception as error:  # noqa: BLE001 - every failure is one OpenAI-shaped line
        watcher.cancel()
        return error_response(api_error(error))
    if chat.stream:
        return EventStream(job, watcher)
    try:
        pieces = await anyio.to_thread.run_sync(lambda: list(job.pieces()))
        return JSONResponse(chat_completion(job, pieces))
    except Exception as error:  # noqa: BLE001
        return error_response(api_error(error))
    finally:
        watcher.cancel()
        job.close()


async def _watch_disconnect(request: Request, gone: threading.Event) -> None:
    """Read the connection until the client goes (the body has been read already)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
    gone.set()


class EventStream:
    """A streamed reply (an ASGI response): `data: {chunk}` per step, then `data: [DONE]`.
    Closing it (the end, an error, a client that left) ends the generation and hands the
    device on."""

    raw_headers = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache"),
                   (b"x-accel-buffering", b"no")]

    def __init__(self, job: Completion, watcher: asyncio.Future) -> None:
        self._job = job
        self._watcher = watcher
        self._pieces = job.pieces()

    async def __call__(self, scope, receive, send) -> None:
        try:
            await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            async for event in self._events():
                await send({"type": "http.response.body", "body": event, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except OSError:  # the client went away mid-send
            pass
        finally:
            self._watcher.cancel()
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(self._close)

    async def _events(self):
        writer = ChunkWriter(self._job)
        yield _sse(writer.first())
        try:
            while (piece := await anyio.to_thread.run_sync(next, self._pieces, None)) is not None:
                yield _sse(writer.piece(piece))
        except Exception as error:  # noqa: BLE001 - headers are out: the error goes in the stream
            yield _sse(api_error(error).body())
            return
        yield _sse(writer.last())
        if self._job.request.include_usage:
            yield _sse(writer.usage())
        yield b"data: [DONE]\n\n"

    def _close(self) -> None:
        try:
            self._pieces.close()
        finally:
            self._job.close()


def _sse(payload: dict) -> bytes:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n".encode()


# ---------------------------------------------------------------- errors


def error_response(error: ApiError) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status)


def api_error(error: BaseException) -> ApiError:
    """Any failure of a request as an ApiError: one line, the status that says whose it is."""
    if isinstance(error, ApiError):
        return error
    if isinstance(error, QueueFull):
        return ApiError(429, str(error), type="rate_limit_error", code="rate_limit_exceeded")
    if isinstance(error, (DeviceBusy, LoadError)):  # the loader's one line says what to do
        return ApiError(503, str(error), type="server_error", code="model_unavailable")
    if isinstance(error, (torch.OutOfMemoryError, MemoryError)) or "out of memory" in str(error).lower():
        return ApiError(503, "Out of memory: ask for fewer max_tokens, send a shorter conversation, or load a "
                             "smaller model.", type="server_error", code="out_of_memory")
    if isinstance(error, ValueError):  # a setting the engine refuses
        return ApiError(400, f"{error}.")
    log.error("chat completion failed", exc_info=error)
    return ApiError(500, f"Generation failed ({_first_line(error)}); the server's console has the details.",
                    type="server_error")


def _first_line(error: BaseException) -> str:
    first = str(error).splitlines()[0] if str(error) else ""
    return f"{type(error).__name__}: {first}"
