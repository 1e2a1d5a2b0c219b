"""What every page of the viewer shares: the store, the state cache, redaction, templates.

The pages (`call_list.py`, `fleet.py`, `call_pages.py`) are handlers over one `Viewer`;
`app.py` routes to them.
"""

from __future__ import annotations

import anyio
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import quote

import jinja2
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response

from ..audit import RedactionConfig, Redactor
from ..audit.fmt import iso
from ..audit.queries import StateCache
from .params import href
from .security import SECURITY_HEADERS, JSONResponse

if TYPE_CHECKING:
    from ..storage import SqlEventStore

HERE = Path(__file__).resolve().parent


class Viewer:
    """What the pages share over one store (opened in the app's lifespan)."""

    _store: SqlEventStore | None

    @property
    def store(self) -> SqlEventStore:
        """The store, open while the app runs (its lifespan opens and closes it)."""
        if self._store is None:
            raise RuntimeError("the viewer's store is not open: the app's lifespan opens it")
        return self._store

    @store.setter
    def store(self, store: SqlEventStore) -> None:
        self._store = store

    def __init__(self, url: str, schema: str | None, redaction: RedactionConfig,
                 page_size: int = 500):
        self.url, self.schema, self.page_size = url, schema, page_size
        self._store = None
        self.cache = StateCache()  # whole states (the inspector, ?full=1)
        self._preview_cache = StateCache(previews=True)  # folds of previews (the pages)
        self.redactors = {False: Redactor(redaction), True: Redactor(redaction.with_enabled())}
        self.forced = redaction.enabled
        self.stopping: anyio.Event | None = None
        env = jinja2.Environment(loader=jinja2.FileSystemLoader(HERE / "templates"),
                                 autoescape=True, undefined=jinja2.StrictUndefined)
        env.filters["q"] = lambda s: quote(str(s), safe="")
        env.globals["href"] = href
        env.globals["iso"] = iso
        env.filters["n"] = lambda n, word, words=None: (
            f"{n:,} {word if n == 1 else (words or word + 's')}")
        self.env = env

    def cache_for(self, previews: bool) -> StateCache:
        """The state cache for folds of previews, or for whole states."""
        return self._preview_cache if previews else self.cache

    def redacting(self, request: Request) -> bool:
        return self.forced or request.query_params.get("redact") in ("1", "true", "yes", "on")

    def redactor(self, request: Request) -> Redactor:
        return self.redactors[self.redacting(request)]

    def page(self, name: str, status: int = 200, **ctx) -> HTMLResponse:
        html = self.env.get_template(name).render(**ctx)
        return HTMLResponse(html, status_code=status, headers=SECURITY_HEADERS)

    def not_found(self, request: Request, call_id: str, api: bool) -> Response:
        if api:
            return JSONResponse({"error": "not found", "call": call_id}, 404,
                                headers=SECURITY_HEADERS)
        return self.page("error.html", 404, title="not found",
                         message=f"call {call_id!r} not found", redact=self.redacting(request))

    async def static(self, request: Request) -> Response:
        name = request.path_params["name"]
        types = {"app.js": "text/javascript", "style.css": "text/css"}
        if name not in types:
            raise HTTPException(404)
        return Response((HERE / "static" / name).read_bytes(), media_type=types[name],
                        headers={**SECURITY_HEADERS, "cache-control": "max-age=300"})
