"""A scriptable, recording Gemini Live (BidiGenerateContent) server on 127.0.0.1.

The real google-genai client (and so the real Pipecat service) connects to it through
``http_options``. Each connection follows a :class:`~.script.Script`; everything the
client sends is recorded and judged against the model state of its session lineage, so
a test can assert that no tool result was lost, duplicated or sent for a call the
session does not know. Each connection also follows the wire rules of the model
generation its setup names (:mod:`.profiles`): a message that generation refuses closes
the socket as the real API does.
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

from . import certs, profiles, protocol
from .profiles import INVALID_ARGUMENT, Profile, Refusal
from .intake import Intake
from .model_state import ToolResult
from .record import Connection, HandleRecord
from .script import Script
from .server_record import ServerRecord
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
    harness in another process can read it. ``profile`` (a :class:`~.profiles.Profile` or
    its name) makes every connection follow that generation's rules whatever model its
    setup names; by default each follows ``profiles.profile_for(setup model)``.
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
        profile: Profile | str | None = None,
        hold_until_input: float = 0.0,
    ) -> None:
        self.scripts = scripts
        self.profile = profiles.resolve(profile)
        # A fresh model says nothing before it has input: with this many seconds, a fresh
        # session's first model output (audio, transcript, toolCall, turnComplete) waits at
        # most that long for the client's first message after the setup (its seed, audio,
        # text); handles and the like are not held. 0: scripts run as written.
        self.hold_until_input = hold_until_input
        self.host = host
        self.port = port
        self.keep_audio = keep_audio
        self.setup_timeout = setup_timeout
        self.record_path = Path(record_path) if record_path is not None else None
        self.connections: list[Connection] = []
        self.shared = ServerRecord()
        self._intake = Intake(self.shared, keep_audio)
        self._certificate = certs.ensure_certificate(cert_dir)
        self._server: Server | None = None
        self._sessions: dict[int, LiveSession] = {}

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

    # --- what it recorded across connections --------------------------------------------

    @property
    def violations(self) -> list[dict[str, Any]]:
        return self.shared.violations

    @property
    def handles(self) -> dict[str, HandleRecord]:
        return self.shared.handles

    @property
    def errors(self) -> list[str]:
        return self.shared.errors

    # --- test controls -----------------------------------------------------------------

    def signal(self, name: str) -> None:
        """Release every :class:`~.script.WaitSignal` on ``name``, now and later."""
        self.shared.signal_event(name).set()
        self.shared.notify()

    def inject(self, connection: int, steps: Sequence[Any]) -> None:
        """Queue steps on a live connection; they run after what it is sending now."""
        session = self._sessions.get(connection)
        if session is None:
            raise LookupError(f"connection {connection} is not open")
        session.enqueue(tuple(steps))

    async def wait_until(self, condition: Callable[[], bool], timeout: float = 5.0) -> None:
        """Return once ``condition()`` holds; it is re-checked after every recorded event."""
        await self.shared.wait_until(condition, timeout)

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

    # --- connection handling -----------------------------------------------------------

    def _check_path(self, connection: ServerConnection, request: Request) -> Response | None:
        """Serve any BidiGenerateContent endpoint (v1beta, v1alpha, Constrained, Vertex)."""
        path = request.path.split("?", 1)[0]
        if _ENDPOINT in path.rsplit("/", 1)[-1]:
            return None
        return connection.respond(404, f"no BidiGenerateContent endpoint at {path}\n")

    async def _handle(self, websocket: ServerConnection) -> None:
        path = websocket.request.path if websocket.request is not None else ""
        record = Connection(len(self.connections), path, time.time())
        self.connections.append(record)
        self.shared.notify()
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
            self.shared.add_violation(
                "setup_expected", record.index, None, f"no setup within {self.setup_timeout}s"
            )
            await websocket.close(1007, "expected a setup message")
            return
        message = self._intake.record_frame(record, frame)
        if message is None or message.kind != "setup" or not isinstance(message.body, dict):
            self.shared.add_violation(
                "setup_expected", record.index, None, "first client message was not a setup"
            )
            await websocket.close(1007, "expected a setup message")
            return
        record.setup = message.body
        profile = self.profile or profiles.profile_for(str(record.setup.get("model") or ""))
        record.profile = profile.name
        refusal = profiles.refuse_declarations(
            profile, protocol.declared_behaviors(record.setup.get("tools"))
        )
        if refusal is not None:
            await self._refuse(websocket, record, refusal)
            return
        record.state = self._intake.initial_state(record, profile)
        session = LiveSession(
            self.shared, websocket, record, self._script_for(record), profile,
            keep_audio=self.keep_audio,
            hold_until_input=self.hold_until_input,
        )
        self.shared.notify()
        if not await session.open():
            return
        self._sessions[record.index] = session
        runner = asyncio.create_task(session.run())
        try:
            async for frame in websocket:
                message = self._intake.record_frame(record, frame)
                if message is None:
                    continue
                try:
                    refusal = self._intake.apply(session, message)
                except (AttributeError, TypeError, ValueError) as error:
                    self.shared.add_violation(
                        "malformed_client_message", record.index, None,
                        f"{message.kind} #{message.index} has an unexpected shape: {error!r}",
                    )
                    continue
                if refusal is not None:
                    await self._refuse(websocket, record, refusal)
                    break
        finally:
            runner.cancel()
            session.cancel_timers()
            await asyncio.gather(runner, return_exceptions=True)

    def _script_for(self, record: Connection) -> Script:
        source = self.scripts
        if source is None:
            return Script()
        if isinstance(source, Script):
            return source
        if callable(source):
            return source(record)
        return source[record.index] if record.index < len(source) else Script()

    async def _refuse(self, websocket: ServerConnection, record: Connection, refusal: Refusal) -> None:
        """Close as the Live API does on a message or setup its model will not take."""
        self.shared.add_violation(refusal.kind, record.index, None, refusal.detail)
        await websocket.close(*INVALID_ARGUMENT)

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
        self.shared.notify()
