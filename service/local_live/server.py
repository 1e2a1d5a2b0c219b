"""A scriptable, recording Gemini Live (BidiGenerateContent) server on 127.0.0.1.

The real google-genai client (and so the real Pipecat service) connects to it through
``http_options``. Each connection follows a :class:`~.script.Script`; everything the
client sends is recorded and judged against the model state of its session lineage, so
a test can assert that no tool result was lost, duplicated or sent for a call the
session does not know.
"""

from __future__ import annotations

import asyncio
import json
import os
import ssl
import time
from pathlib import Path
from typing import Any, Callable, Sequence, Union

from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response

from . import certs, protocol
from .record import (
    ClientMessage,
    Connection,
    HandleRecord,
    ModelState,
    ToolResult,
    admit,
    judge_content_result,
    judge_tool_response,
)
from .script import Script
from .session import LiveSession

ScriptSource = Union[None, Script, Sequence[Script], Callable[[Connection], Script]]

_ENDPOINT = "BidiGenerateContent"


def http_options(base_url: str, cert_path: Path | str) -> Any:
    """``google.genai.types.HttpOptions`` for a server known only by URL and certificate.

    For a client in another process than the server (the crash harness). google-genai
    is imported here only, so the server itself runs without it.
    """
    from google.genai import types

    return types.HttpOptions(
        base_url=base_url, async_client_args={"ssl": certs.client_context(cert_path)}
    )


class LocalLiveServer:
    """Gemini Live over TLS websockets, driven by scripts, recording every message.

    ``scripts`` chooses each connection's script: one :class:`Script` for all, a list
    indexed by connection number (an empty ``Script()`` beyond its end), or a callable
    given the :class:`Connection` (its setup already parsed) that returns one.
    ``keep_audio`` records audio payloads instead of their sizes. With ``record_path``
    the record is dumped there whenever a connection closes and on :meth:`stop`, so a
    harness in another process can read it.
    """

    def __init__(
        self,
        scripts: ScriptSource = None,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        keep_audio: bool = False,
        setup_timeout: float = 10.0,
        cert_dir: Path | None = None,
        record_path: Path | str | None = None,
    ) -> None:
        self.scripts = scripts
        self.host = host
        self.port = port
        self.keep_audio = keep_audio
        self.setup_timeout = setup_timeout
        self.record_path = Path(record_path) if record_path is not None else None
        self.connections: list[Connection] = []
        self.violations: list[dict[str, Any]] = []
        self.handles: dict[str, HandleRecord] = {}
        self.errors: list[str] = []
        self._certificate = certs.ensure_certificate(cert_dir)
        self._server: Server | None = None
        self._sessions: dict[int, LiveSession] = {}
        self._signals: dict[str, asyncio.Event] = {}
        self._changed = asyncio.Event()
        self._handle_count = 0

    # --- lifecycle ---------------------------------------------------------------------

    async def start(self) -> LocalLiveServer:
        self._server = await serve(
            self._handle,
            self.host,
            self.port,
            ssl=certs.server_context(self._certificate),
            process_request=self._check_path,
            max_size=None,
        )
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        """Close every connection (code 1001) and stop listening."""
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        if self.record_path is not None:
            self.dump(self.record_path)

    async def __aenter__(self) -> LocalLiveServer:
        return await self.start()

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    # --- how clients reach it ----------------------------------------------------------

    @property
    def base_url(self) -> str:
        """``https://127.0.0.1:PORT``, without the trailing slash that would yield ``//ws``."""
        return f"https://{self.host}:{self.port}"

    @property
    def cert_path(self) -> Path:
        """The PEM certificate a client in another process must trust."""
        return self._certificate.cert_path

    def ssl_client_context(self) -> ssl.SSLContext:
        return certs.client_context(self._certificate.cert_path)

    def http_options(self) -> Any:
        """``google.genai.types.HttpOptions`` pointing the real client at this server."""
        return http_options(self.base_url, self.cert_path)

    # --- test controls -----------------------------------------------------------------

    def signal(self, name: str) -> None:
        """Release every :class:`~.script.WaitSignal` on ``name``, now and later."""
        self.signal_event(name).set()
        self._notify()

    def signal_event(self, name: str) -> asyncio.Event:
        return self._signals.setdefault(name, asyncio.Event())

    def inject(self, connection: int, steps: Sequence[Any]) -> None:
        """Queue steps on a live connection; they run after what it is sending now."""
        session = self._sessions.get(connection)
        if session is None:
            raise LookupError(f"connection {connection} is not open")
        session.enqueue(tuple(steps))

    async def wait_until(self, condition: Callable[[], bool], timeout: float = 5.0) -> None:
        """Return once ``condition()`` holds; it is re-checked after every recorded event."""
        deadline = asyncio.get_running_loop().time() + timeout
        while not condition():
            remaining = deadline - asyncio.get_running_loop().time()
            if remaining <= 0:
                raise TimeoutError(f"condition not met within {timeout}s")
            changed = self._changed
            try:
                await asyncio.wait_for(changed.wait(), remaining)
            except TimeoutError:
                pass

    async def wait_for_connection(self, index: int, timeout: float = 5.0) -> Connection:
        """The connection with this index, once its setup has arrived."""
        await self.wait_until(
            lambda: len(self.connections) > index and self.connections[index].setup is not None,
            timeout,
        )
        return self.connections[index]

    async def wait_for_close(self, index: int, timeout: float = 5.0) -> Connection:
        await self.wait_until(
            lambda: len(self.connections) > index and not self.connections[index].is_open,
            timeout,
        )
        return self.connections[index]

    # --- queries -----------------------------------------------------------------------

    def tool_responses(self) -> list[ToolResult]:
        """Every function result received, over all connections, in arrival order."""
        results = [result for connection in self.connections for result in connection.results]
        return sorted(results, key=lambda result: result.at)

    def violations_of(self, kind: str) -> list[dict[str, Any]]:
        return [violation for violation in self.violations if violation["kind"] == kind]

    def assert_clean(self, allow: Sequence[str] = ()) -> None:
        """Raise ``AssertionError`` listing every violation whose kind is not allowed."""
        found = [violation for violation in self.violations if violation["kind"] not in allow]
        if not found and not self.errors:
            return
        lines = [f"local Gemini Live server saw {len(found)} violation(s):"]
        for violation in found:
            lines.append(
                f"  - {violation['kind']} on connection {violation['connection']}"
                f" (id={violation['id']}): {violation['detail']}"
            )
        lines.extend(f"  - server error: {error}" for error in self.errors)
        lines.append("results received:")
        for result in self.tool_responses():
            lines.append(
                f"  conn {result.connection} #{result.client_message_index} {result.via}"
                f" id={result.id} {result.name} accepted={result.accepted}"
            )
        raise AssertionError("\n".join(lines))

    def to_json(self) -> dict[str, Any]:
        return {
            "base_url": self.base_url,
            "connections": [connection.to_json() for connection in self.connections],
            "violations": list(self.violations),
            "handles": {name: record.to_json() for name, record in self.handles.items()},
            "errors": list(self.errors),
        }

    def dump(self, path: str | Path) -> None:
        """Write the whole record as JSON, atomically, for a reader in another process."""
        target = Path(path)
        partial = target.with_name(f".{target.name}.{os.getpid()}.partial")
        partial.write_text(json.dumps(self.to_json(), indent=1, default=str))
        os.replace(partial, target)

    # --- used by sessions --------------------------------------------------------------

    def add_violation(self, kind: str, connection: int, call_id: str | None, detail: str) -> None:
        self.violations.append(
            {"kind": kind, "connection": connection, "id": call_id, "detail": detail, "at": time.time()}
        )
        self._notify()

    def new_handle_name(self, connection: int) -> str:
        self._handle_count += 1
        return f"handle-{connection}-{self._handle_count}"

    # --- connection handling -----------------------------------------------------------

    def _check_path(self, connection: ServerConnection, request: Request) -> Response | None:
        """Serve any BidiGenerateContent endpoint (v1beta, v1alpha, Constrained, Vertex)."""
        path = request.path.split("?", 1)[0]
        if _ENDPOINT in path.rsplit("/", 1)[-1]:
            return None
        return connection.respond(404, f"no BidiGenerateContent endpoint at {path}\n")

    async def _handle(self, websocket: ServerConnection) -> None:
        record = Connection(len(self.connections), websocket.request.path, time.time())
        self.connections.append(record)
        self._notify()
        try:
            await self._serve(websocket, record)
        except ConnectionClosed:
            pass
        except Exception as error:  # noqa: BLE001 - one bad connection must not stop the server
            self.errors.append(f"connection {record.index}: {error!r}")
        finally:
            self._sessions.pop(record.index, None)
            if websocket.close_code is None:
                await websocket.close(1011, "local server ended the connection")
            self._record_close(websocket, record)

    async def _serve(self, websocket: ServerConnection, record: Connection) -> None:
        try:
            frame = await asyncio.wait_for(websocket.recv(), self.setup_timeout)
        except TimeoutError:
            self.add_violation(
                "setup_expected", record.index, None, f"no setup within {self.setup_timeout}s"
            )
            await websocket.close(1007, "expected a setup message")
            return
        message = self._record_frame(record, frame)
        if message is None or message.kind != "setup" or not isinstance(message.body, dict):
            self.add_violation(
                "setup_expected", record.index, None, "first client message was not a setup"
            )
            await websocket.close(1007, "expected a setup message")
            return
        record.setup = message.body
        record.state = self._initial_state(record)
        session = LiveSession(self, websocket, record, self._script_for(record))
        self._notify()
        if not await session.open():
            return
        self._sessions[record.index] = session
        runner = asyncio.create_task(session.run())
        try:
            async for frame in websocket:
                message = self._record_frame(record, frame)
                if message is None:
                    continue
                try:
                    self._apply(session, message)
                except (AttributeError, TypeError, ValueError) as error:
                    self.add_violation(
                        "malformed_client_message", record.index, None,
                        f"{message.kind} #{message.index} has an unexpected shape: {error!r}",
                    )
        finally:
            runner.cancel()
            session.cancel_timers()
            await asyncio.gather(runner, return_exceptions=True)

    def _initial_state(self, record: Connection) -> ModelState:
        """A fresh session knows nothing; a resumed one knows what its handle captured."""
        handle = record.resumption_handle
        if handle is None:
            return ModelState()
        issued = self.handles.get(handle)
        if issued is None:
            self.add_violation(
                "unknown_resumption_handle", record.index, None, f"handle {handle!r} never issued"
            )
            return ModelState()
        record.resumed_from = handle
        return issued.state.snapshot()

    def _script_for(self, record: Connection) -> Script:
        source = self.scripts
        if source is None:
            return Script()
        if isinstance(source, Script):
            return source
        if callable(source):
            return source(record)
        return source[record.index] if record.index < len(source) else Script()

    def _record_frame(self, record: Connection, frame: str | bytes) -> ClientMessage | None:
        """Decode, normalise and record one client frame; None if it was malformed."""
        index = len(record.received)
        try:
            text = frame.decode("utf-8") if isinstance(frame, bytes) else frame
            decoded = json.loads(text)
            if not isinstance(decoded, dict):
                raise ValueError("a client message must be a JSON object")
        except ValueError as error:
            shown = frame if isinstance(frame, str) else repr(frame)
            record.received.append(ClientMessage(index, "malformed", shown, time.time()))
            self.add_violation("malformed_client_message", record.index, None, f"{error}: {shown[:200]}")
            return None
        message = protocol.normalise(decoded)
        kind = protocol.message_kind(message)
        body = message if kind == "unknown" else message[kind]
        if not self.keep_audio and kind == "realtime_input":
            body = protocol.summarise_audio(body)
        recorded = ClientMessage(index, kind, body, time.time())
        record.received.append(recorded)
        if kind == "unknown":
            self.add_violation(
                "unknown_client_message", record.index, None, f"keys {sorted(message)}"
            )
        self._notify()
        return recorded

    def _apply(self, session: LiveSession, message: ClientMessage) -> None:
        """Take a client message into the model state and fire the script's triggers."""
        body = message.body if isinstance(message.body, dict) else {}
        if message.kind == "tool_response":
            for response in body.get("function_responses") or []:
                self._take_result(
                    session, message, response.get("id"), str(response.get("name", "")),
                    protocol.as_response_dict(response.get("response", {})), "tool_response",
                )
        elif message.kind == "client_content":
            state = session.record.state
            turns = body.get("turns") or []
            complete = bool(body.get("turn_complete"))
            state.history_calls.extend(protocol.content_calls(turns))
            for found in protocol.content_results(turns):
                self._take_result(
                    session, message, found.call_id, found.name, found.response, "content",
                    acted_on=complete,
                )
            if complete:
                # The turn is complete: Gemini now goes on with every result it was given
                # as content meanwhile (turnComplete false only adds to the context).
                waited = bool(state.awaiting_turn)
                state.awaiting_turn.clear()
                if waited and not state.outstanding():
                    session.trigger("tool_result")
                session.trigger("turn_complete")
        self._notify()

    def _take_result(
        self,
        session: LiveSession,
        message: ClientMessage,
        call_id: str | None,
        name: str,
        response: Any,
        via: str,
        acted_on: bool = True,
    ) -> None:
        record = session.record
        state = record.state
        if via == "tool_response":
            verdict = judge_tool_response(state, call_id, name)
        else:
            verdict = judge_content_result(
                state, protocol.ContentResult(name, response, call_id)
            )
        result = ToolResult(
            connection=record.index,
            id=verdict.call_id,
            name=name,
            response=response,
            via=via,
            accepted=verdict.accepted,
            client_message_index=message.index,
            at=message.at,
        )
        record.results.append(result)
        if verdict.violation is not None:
            self.add_violation(verdict.violation, record.index, verdict.call_id, verdict.detail)
        if verdict.accepted:
            admit(state, result, call_id)
            if not acted_on and result.id is not None:
                state.awaiting_turn.add(result.id)
            elif not state.outstanding():
                session.trigger("tool_result")

    def _record_close(self, websocket: ServerConnection, record: Connection) -> None:
        protocol_state = websocket.protocol
        record.closed_at = time.time()
        record.close_code = websocket.close_code
        record.close_reason = websocket.close_reason
        if protocol_state.close_rcvd is None:
            record.closed_by = "abnormal" if protocol_state.close_sent is None else "server"
        else:
            record.closed_by = "client" if protocol_state.close_rcvd_then_sent else "server"
        if self.record_path is not None:
            self.dump(self.record_path)
        self._notify()

    def _notify(self) -> None:
        """Wake everything waiting in :meth:`wait_until`."""
        self._changed.set()
        self._changed = asyncio.Event()
