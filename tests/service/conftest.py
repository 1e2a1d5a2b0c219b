"""The `flavour` fixture: each wire scenario runs our service on SQLite and on PostgreSQL
(the same databases as the shared `store` fixture: a fresh file, or a fresh schema) and
pipecat's stock GeminiLiveLLMService once (no store: the log assertions are ours only).

A scenario marked `@pytest.mark.stock_bug("...")` is expected to fail on the stock service
(strict xfail: it shows the test can fail, and if upstream fixes the bug the run says so).

Model generations: every scenario that does not name its own model runs on each Gemini Live
generation, the local server applying that generation's wire rules. By default (`make test`,
CI) each generation on some of the databases, so that every generation and every database
is covered without crossing them all (DEFAULT_MATRIX); GEMINI_MODELS (comma-separated
generations: 2.5, 3.1, 3.8, 3.8-thinking, or "all") runs the ones named on both databases.
Stock pipecat runs on 2.5 only (its 3.x failures are in test_generations.py). A scenario
whose premise holds only on some generations says which with
`@pytest.mark.generations("2.5", ...)`; on the others it is skipped with its reason.
"""

from __future__ import annotations

import os
import uuid

import asyncpg
import pytest

from rig.testing.pipeline import MODEL

from tests.conftest import PG_DSN, PG_URL, Backend

from .helpers import Flavour


#: A model id per generation, as a user names it.
GENERATION_MODELS = {"2.5": MODEL, "3.1": "models/gemini-3.1-flash-live-preview",
                     "3.8": "models/gemini-3.8-live",
                     "3.8-thinking": "models/gemini-3.8-live-extended-thinking"}


#: The default matrix: generation -> the flavours it runs on.
DEFAULT_MATRIX = {"2.5": {"sqlite", "postgres", "stock"}, "3.1": {"sqlite"},
                  "3.8": {"postgres"}, "3.8-thinking": {"sqlite"}}


def selected_generations() -> list[str]:
    chosen = os.environ.get("GEMINI_MODELS", "all").strip()
    names = list(GENERATION_MODELS) if chosen == "all" else [
        n.strip() for n in chosen.split(",") if n.strip()]
    unknown = [n for n in names if n not in GENERATION_MODELS]
    if unknown or not names:
        raise pytest.UsageError(f"GEMINI_MODELS: unknown generation(s) {unknown}; use "
                                f"{', '.join(GENERATION_MODELS)} or all")
    return names


def pytest_collection_modifyitems(config, items):
    """Without GEMINI_MODELS, keep each generation's scenarios on its DEFAULT_MATRIX flavours."""
    if os.environ.get("GEMINI_MODELS"):
        return
    kept, dropped = [], []
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        generation, flavour = params.get("generation"), params.get("flavour_name")
        if generation is None or flavour is None or flavour in DEFAULT_MATRIX[generation]:
            kept.append(item)
        else:
            dropped.append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


def pytest_generate_tests(metafunc):
    if ("generation" in metafunc.fixturenames
            and metafunc.definition.get_closest_marker("own_model") is None):
        metafunc.parametrize("generation", selected_generations(), indirect=True)


@pytest.fixture
def generation(request):
    """The model generation a scenario runs on (GEMINI_MODELS), or skip if it says it does
    not hold there."""
    name = getattr(request, "param", "2.5")
    marker = request.node.get_closest_marker("generations")
    if marker is not None and name not in marker.args:
        pytest.skip(f"holds on {', '.join(marker.args)} only: "
                    f"{marker.kwargs.get('reason', 'see test_generations.py')}")
    return name


@pytest.fixture(params=["sqlite", "postgres", "stock"])
def flavour_name(request):
    if request.param == "stock":
        if request.getfixturevalue("generation") != "2.5":
            # Stock pipecat is the baseline on 2.5; its 3.x failures are in
            # test_generations.py (every scenario there runs on it too).
            pytest.skip("stock pipecat is compared on 2.5")
        marker = request.node.get_closest_marker("stock_bug")
        if marker is not None:
            request.applymarker(pytest.mark.xfail(
                strict=True, reason=f"upstream bug: {marker.args[0]}"))
    return request.param


@pytest.fixture
async def flavour(flavour_name, generation, tmp_path):
    model = GENERATION_MODELS[generation]
    if flavour_name == "stock":
        yield Flavour("stock", model=model)
        return
    schema = None
    if flavour_name == "sqlite":
        backend = Backend("sqlite", f"sqlite+aiosqlite:///{tmp_path / 'log.db'}")
    else:
        schema = f"t_{uuid.uuid4().hex[:12]}"
        conn = await asyncpg.connect(PG_DSN)
        try:
            await conn.execute(f"CREATE SCHEMA {schema}")
        finally:
            await conn.close()
        backend = Backend("postgres", PG_URL, {"schema": schema})
    try:
        await backend.migrate()
        store = await backend.open()
        try:
            yield Flavour(flavour_name, store, model=model)
        finally:
            await store.close()
    finally:
        if schema is not None:
            conn = await asyncpg.connect(PG_DSN)
            try:
                await conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
            finally:
                await conn.close()
