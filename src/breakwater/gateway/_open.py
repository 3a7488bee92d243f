"""The gateway's composition root: a `Breakwater`, the tool catalog and a `Gateway` over them, opened together.

`breakwater serve` and `breakwater tools` both start here, and so can a program that embeds the
gateway: what it then does with the `Gateway` (serve stdio, mount the HTTP app, search) is its own.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import anyio

from breakwater._breakwater import Breakwater
from breakwater.catalog._catalog import Catalog, default_catalog_dir
from breakwater.config import Config
from breakwater.gateway._relay import Relay
from breakwater.gateway._roots import ClientRoots, gateway_client_hooks, one_client_servers
from breakwater.gateway._server import Gateway
from breakwater.journal import AttemptObserver

__all__ = ["gateway_catalog", "open_gateway"]


def gateway_catalog(config: Config) -> Catalog:
    """The on-disk catalog of last-known tools `[gateway]` names (default: the user's cache directory)."""
    policy = config.gateway
    directory = Path(policy.catalog_dir).expanduser() if policy.catalog_dir else default_catalog_dir()
    return Catalog(template=policy.tool_name_template, directory=directory, name_max=policy.tool_name_max)


@contextlib.asynccontextmanager
async def open_gateway(
    config: Config,
    *,
    observers: Sequence[AttemptObserver] = (),
    catalog: Catalog | None = None,
    watch: bool = True,
    one_client: bool = False,
    as_serve: bool = False,
) -> AsyncIterator[Gateway]:
    """Connect to every configured server and yield the `Gateway` in front of them; close it all on exit.

    `observers` see every attempt (after the journal), e.g. the HTTP app's `Metrics`. With `watch`
    (the default) the gateway follows state and tool-list changes while open: it refreshes the
    catalog and sends `list_changed` to its clients; a one-shot reader of the catalog turns it off.
    `one_client` says the gateway serves one client (a stdio `serve` of its own): then its servers get
    that client's roots (`breakwater.gateway._roots`), and its stdio servers may be spoken to in the
    cheaper revision (`breakwater.connect._protocol_memory`). `as_serve` connects as a stdio `serve` of `config` would,
    with no client behind it (`gateway_client_hooks`): a one-shot reader sees, and saves, the tools `serve` lists.
    Enter and exit in the same task, as with `Breakwater`.
    """
    # The relay first: every connection carries its callbacks from the first connect on.
    relay = Relay()
    roots = ClientRoots(relay) if one_client else None
    hooks = roots.hooks(relay.client_kwargs) if roots is not None else relay.client_kwargs
    clients: bool | tuple[str, ...] = one_client
    if as_serve:
        hooks, clients = gateway_client_hooks(config, relay), one_client_servers(config)
    async with Breakwater(config, observers=observers, client_hooks=hooks, one_client=clients) as bw:
        gateway = Gateway(bw, config.gateway, catalog=catalog if catalog is not None else gateway_catalog(config), relay=relay)
        if roots is not None:
            roots.serve(gateway.server, lambda: [bw.upstream(spec.name) for spec in config.servers])
        if not watch:
            yield gateway
            return
        async with anyio.create_task_group() as tg:
            tg.start_soon(gateway.watch)
            yield gateway
            tg.cancel_scope.cancel()
