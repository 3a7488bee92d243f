"""`breakwater lab serve`: the fleet lab's web page and its JSON API.

The page (static HTML, CSS, JavaScript and the vendored uPlot charting library, all shipped in the
package: no network at run time) drives the same library the terminal CLI uses. The server is the
standard library's threaded HTTP server; see `breakwater.lab.web.server` for the routes and the
security rules (loopback by default, Host/Origin checks against DNS rebinding, a bearer token for
anything else).
"""

from __future__ import annotations

from breakwater.lab.web.server import TOKEN_ENV, LabServer, ServeError, make_server, serve

__all__ = ["TOKEN_ENV", "LabServer", "ServeError", "make_server", "serve"]
