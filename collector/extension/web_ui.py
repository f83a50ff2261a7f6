"""The request timeline web view: the files in `collector/ui/` (a page, its two scripts, its
stylesheet; no build step, nothing fetched from elsewhere), served under ``/ui`` by the Jaeger
query API's server. The page draws from the same server's ``/api/llm/heatmap`` (the overview),
``/api/llm/bubbleup``, ``/api/llm/timeline`` and ``/api/traces/{traceID}``.

Its state is the URL's fragment, so every view is a link: ``/ui#trace=<traceID>`` opens that
trace's waterfall (``/ui/trace/<traceID>`` redirects there: an exemplar's trace id is all a link
needs), and ``lookback``/``start``/``end``, ``model``, ``instance``, ``finishReason``,
``ttftAbove``, ``e2eAbove`` and ``span`` are the window, the filters (the timeline endpoint's
parameters) and the selected span; ``metric`` the overview's, and ``rstart``/``rend`` (µs),
``rmin``/``rmax`` (s) the region selected in it.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import NamedTuple

UI_DIR = Path(__file__).parent / "ui"
_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
          ".css": "text/css; charset=utf-8"}
_FILES = {"": "index.html", "index.html": "index.html", "timeline.js": "timeline.js", "overview.js": "overview.js",
          "timeline.css": "timeline.css"}
_TRACE_ID = re.compile(r"[0-9a-fA-F]{1,32}")


class UiResponse(NamedTuple):
    status: int
    content_type: str
    body: bytes
    location: str | None = None  # for a redirect


def ui_response(parts: list[str]) -> UiResponse:
    """The answer to ``GET /ui/<parts...>`` (the path's segments after ``ui``)."""
    name = _FILES.get("/".join(parts))
    if name is not None:
        return UiResponse(200, _TYPES[Path(name).suffix], (UI_DIR / name).read_bytes())
    if len(parts) == 2 and parts[0] == "trace" and _TRACE_ID.fullmatch(parts[1]):
        return UiResponse(302, "text/plain; charset=utf-8", b"", f"/ui#trace={parts[1].lower()}")
    return UiResponse(404, "text/plain; charset=utf-8", b"not found; the timeline is at /ui\n")
