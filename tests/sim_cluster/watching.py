"""Reading a raw watch response in tests: its JSON lines, as they arrive."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any


def watch_lines(resp: Any) -> Iterator[Any]:
    buf = b""
    for chunk in resp.stream(amt=None, decode_content=False):
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            yield json.loads(line)
