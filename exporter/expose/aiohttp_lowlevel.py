"""aiohttp's low-level HTTP server, imported without aiohttp's client.

``import aiohttp.web_server`` first runs ``aiohttp/__init__.py``, which imports the whole
client (connector, cookie jar, resolver, tracing, form data ...): about 6 MB resident in a
process that never opens an HTTP client. So unless something imported aiohttp already, the
package is entered as a bare module of its real spec (its ``__path__``, so submodules import
as usual) and its ``__init__`` runs on the first attribute the bare module lacks (a later
``aiohttp.ClientSession``): nothing changes for any other user of aiohttp in the process.
The server modules need nothing from ``__init__`` but ``__version__`` (for their ``Server``
header, which exporter/expose/server.py replaces anyway), taken from the installed distribution.
"""

from __future__ import annotations

import importlib.machinery
import importlib.metadata
import importlib.util
import sys
import threading
from typing import Any

_PACKAGE = "aiohttp"


def _enter_without_client() -> None:
    spec = importlib.util.find_spec(_PACKAGE)
    if spec is None or spec.loader is None or spec.submodule_search_locations is None:
        return  # not installed as a package: the imports below fail as they would anyway
    package = importlib.util.module_from_spec(spec)
    loader = spec.loader
    lock = threading.RLock()
    initialised = False

    def finish_init(name: str) -> Any:
        """Module ``__getattr__``: run the real ``__init__`` once, then look again. A
        submodule's name (``from . import hdrs``) is left to the import system."""
        nonlocal initialised
        if importlib.machinery.PathFinder.find_spec(f"{_PACKAGE}.{name}", package.__path__):
            raise AttributeError(f"module {_PACKAGE!r} has no attribute {name!r}")
        with lock:
            if not initialised:
                initialised = True
                loader.exec_module(package)
        try:
            return package.__dict__[name]
        except KeyError:
            raise AttributeError(f"module {_PACKAGE!r} has no attribute {name!r}") from None

    package.__version__ = importlib.metadata.version(_PACKAGE)  # type: ignore[attr-defined]
    package.__getattr__ = finish_init  # type: ignore[method-assign]
    sys.modules[_PACKAGE] = package


if _PACKAGE not in sys.modules:
    _enter_without_client()

from aiohttp.web_protocol import RequestHandler as RequestHandler  # noqa: E402
from aiohttp.web_request import BaseRequest as BaseRequest  # noqa: E402
from aiohttp.web_response import Response as Response  # noqa: E402
from aiohttp.web_response import StreamResponse as StreamResponse  # noqa: E402
from aiohttp.web_server import Server as Server  # noqa: E402

__all__ = ["BaseRequest", "RequestHandler", "Response", "Server", "StreamResponse"]
