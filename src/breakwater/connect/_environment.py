"""What a server's process inherits of the environment breakwater runs in."""

from __future__ import annotations

import os
from collections.abc import Mapping

from mcp.client.stdio import DEFAULT_INHERITED_ENV_VARS

from breakwater.config import ServerSpec
from breakwater.config._redact import is_credential_name, path_like, register_secrets

__all__ = ["OWN_PREFIX", "inherited", "without_own_variables"]


def inherited(spec: ServerSpec, given: Mapping[str, str] | None) -> dict[str, str]:
    """What `spec`'s process inherits of `given` (default: this process's environment), by `[connect] inherit_env`.

    All of it by default, as the agents breakwater stands in for start their servers: with the SDK's few, a server
    reading a token exported in the shell (`GITHUB_TOKEN`, `HTTPS_PROXY`, `NODE_EXTRA_CA_CERTS`) worked when the
    agent started it and exited behind breakwater. Credential-named values join the redacted secrets.

    Never the entry's `env_unset` (VS Code's `"env": {"NAME": null}`): that server is not to see them, whoever set them.
    """
    source = os.environ if given is None else given
    if spec.env_unset:
        source = {k: v for k, v in source.items() if k not in spec.env_unset}
    if spec.connect.inherit_env == "minimal":
        return {k: v for k, v in source.items() if k in DEFAULT_INHERITED_ENV_VARS and not v.startswith("()")}
    register_secrets(v for k, v in source.items() if is_credential_name(k) and not path_like(v, k))
    return without_own_variables(source)


#: The prefix of breakwater's own environment variables (its knobs, `BREAKWATER_TOKEN`).
OWN_PREFIX = "BREAKWATER_"


def without_own_variables(source: Mapping[str, str]) -> dict[str, str]:
    """`source` without breakwater's own variables: they are the gateway's, not its servers'.

    Inherited whole, `BREAKWATER_TOKEN` (the bearer token of a gateway on the network) reached every stdio server,
    an npm package among them, which could then call every other server's tools through the gateway; a knob's URL
    carries a database's password as well. A server that needs one is given it by its entry's `env`.
    """
    return {k: v for k, v in source.items() if not k.startswith(OWN_PREFIX)}
