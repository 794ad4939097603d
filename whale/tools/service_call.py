"""One POST to a tool service, standard library only: the same retries and the same failure words for the
environments' clients (``whale.tools.client``, over httpx) and the proposer's prototyping kit
(``proto/whale/tools/service_call.py``, this file's source, over urllib), so a service that fails gives the kit
the tool error a candidate's model would read.

:func:`post_json` takes the transport as a function (one attempt: ``(url, payload) -> (status, body text)``,
raising :class:`TransportFailure` when the service cannot be reached) and decides what the answer means: a
4xx is refused at once, a 5xx or a transport failure is tried :data:`RETRIES` times, then raised as
:class:`ToolServiceError` naming the URL and the last failure.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

RETRIES = 3
RETRY_BACKOFF_S = 0.5
#: characters of a failed answer's body quoted in the error
DETAIL_CHARS = 300
#: the code tool's result when its service failed (the output the model reads is this, as the tool error)
CODE_SERVICE_FAILED = "The code interpreter service failed: "


class ToolServiceError(RuntimeError):
    """A tool service could not be reached or refused the request."""


class TransportFailure(Exception):
    """One attempt reached no answer (connection refused, timed out); ``str()`` says why."""


#: one attempt: (url, JSON payload) -> (HTTP status, body text); TransportFailure when no answer came
Send = Callable[[str, dict], "tuple[int, str]"]


def post_json(send: Send, url: str, payload: dict, sleep: Callable[[float], None] = time.sleep) -> Any:
    """The JSON answer of ``url`` to ``payload``; :class:`ToolServiceError` after a 4xx, or after
    :data:`RETRIES` attempts that failed (5xx, no answer)."""
    last: object = None
    for attempt in range(RETRIES):
        try:
            status, body = send(url, payload)
        except TransportFailure as exc:
            last = exc
        else:
            if status < 400:
                return json.loads(body)
            detail = body[:DETAIL_CHARS]
            if status < 500:
                raise ToolServiceError(f"{url} refused the request ({status}): {detail}")
            last = ToolServiceError(f"{url} failed ({status}): {detail}")
        if attempt + 1 < RETRIES:
            sleep(RETRY_BACKOFF_S * (attempt + 1))
    raise ToolServiceError(f"{url} unreachable after {RETRIES} attempts: {last}")
