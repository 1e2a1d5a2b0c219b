"""Issue #35 item 5: the viewer's `?at=` takes what the CLI's `--at` takes (a version, +1.6s
into the call, an ISO time) and refuses a point outside the call instead of showing its last
event."""

from __future__ import annotations

import re


from .conftest import running_viewer, viewer_client
from .helpers import at


async def test_at_takes_a_version_an_offset_or_a_time(loaded):
    with running_viewer(loaded) as base:
        async with viewer_client(base) as http:
            async def version_of(point: str) -> int:
                r = await http.get("/api/state/support-1", params={"at": point})
                assert r.status_code == 200, (point, r.text)
                return r.json()["version"]

            assert await version_of("12") == 12
            # support-1: v11 at +1.52 s, v12 at +1.82 s (tests/tools/helpers.support_call)
            assert await version_of("+1.6s") == 11
            assert await version_of("+1600ms") == 11
            assert await version_of(at(1820)) == 12
            page = await http.get("/calls/support-1", params={"at": "+1.6s"})
            assert page.status_code == 200
            assert re.search(r'selected"[^>]*data-v="11"', page.text), "v11 not selected"

            for bad, said in (("999", "versions 1–25"), ("0", "versions 1–25"),
                              ("yesterday", "not a point")):
                for path in ("/api/state/support-1", "/calls/support-1"):
                    r = await http.get(path, params={"at": bad})
                    assert r.status_code == 400, (path, bad, r.status_code)
                    assert said in r.text, (path, bad, r.text[:300])
