"""What `breakwater call` answers when the tool asks the client something mid-call, and how a refusal is reported.

`call` connects as a stdio `serve` does (sampling, elicitation and, for a server with one client, roots
declared: a server may list more tools to such a client), but no model and no user stand behind a
one-shot command. A sampling request, a form and a page to open are refused at once; a tool that then
failed was reported TOOL_ERROR or UPSTREAM_ERROR ("fix the input", "the server answered with error
-32600"), though nothing was wrong with the input or the server. Reported here as the gateway reports
it to a client that lacks the capability (`gateway._relay.explain_refusal`): CLIENT_CANNOT_ANSWER,
naming what the tool asked for and the way to run it (an agent that supports it, through `serve`). A
page to open is printed: the user can open it, and a server's URL elicitation is meant for the user's
eyes (a client shows the full address and never opens it unasked; nor does this).

`roots/list` is answered with the current directory as the one root, where `serve` would ask its client:
Claude Code answers with the directory it was started in, and `call`, run from a project, stands in
for an agent started there. A filesystem server started without directories works in it, as it would
under the agent; refusing left such a server with no directory at all.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import mcp.types as types
from mcp.client.session import ClientRequestContext

from breakwater._wire import ENVELOPE_META_KEY
from breakwater.config import ServerSpec
from breakwater.connect._upstream import ClientHooks
from breakwater.errors import CallError, ClientCannotAnswerError, ErrorCode, visible
from breakwater.gate._envelope import error_result

__all__ = ["OneShotAnswers", "Question", "asked_text"]

#: What the fix says: where a tool that asks gets its answer.
_ELSEWHERE = "run the tool from an agent that supports {what}, e.g. with its server behind `breakwater serve`"


@dataclass(frozen=True)
class Question:
    """One request of the called server that `call` could not answer."""

    #: The gateway's word for it, the envelope's `request`: "sampling" or "elicitation".
    kind: str
    #: What the tool asked for, as the sentence names it.
    what: str
    #: Why no answer came (the envelope's `reason`), and the fix.
    why: str
    fix: str
    #: A URL elicitation as the server sent it (the envelope's `elicitations`), so a program can open the page.
    page: dict[str, Any] | None = None

    def message(self) -> str:
        """The envelope's message: what was asked, why there was no answer, what to do."""
        return f"The tool asked {self.what}, and got no answer: {self.why}; {self.fix}."


def _sampling() -> Question:
    return Question(
        kind="sampling",
        what="the client for sampling (a reply from the client's model)",
        why="`breakwater call` has no model to ask",
        fix=_ELSEWHERE.format(what="sampling"),
    )


def _elicitation(params: types.ElicitRequestParams) -> Question:
    said = visible(params.message)
    if isinstance(params, types.ElicitRequestURLParams):
        page = params.model_dump(mode="json", by_alias=True, exclude_none=True)
        return Question(
            kind="elicitation",
            what=f"the user to open a page ({said}): {visible(params.url)}",
            why="`breakwater call` cannot wait for the user on a page",
            fix=f"open it yourself and run the call again, or {_ELSEWHERE.format(what='URL elicitation')}",
            page=page,
        )
    return Question(
        kind="elicitation",
        what=f"the user to fill in a form ({said})",
        why="`breakwater call` cannot show a form",
        fix=_ELSEWHERE.format(what="elicitation"),
    )


def _refusal(question: Question) -> types.ErrorData:
    # What the server reads (and a tool that catches it may pass on): the gateway's code for a refused request.
    return types.ErrorData(code=types.INVALID_REQUEST, message=f"breakwater: {question.why}; {question.fix}")


@dataclass(eq=False)
class OneShotAnswers:
    """The client side of one `breakwater call`: refuses sampling and elicitation, lists `root` as the roots."""

    root: Path = field(default_factory=Path.cwd)
    #: What the called server asked during the call and got no answer to, in order.
    asked: list[Question] = field(default_factory=list)
    _server: str | None = None

    def hooks(self, base: ClientHooks) -> ClientHooks:
        """`base`'s client arguments (the capabilities `serve` declares), with these answers in place of its own."""

        def hooks(spec: ServerSpec) -> Mapping[str, Any]:
            kwargs = dict(base(spec))
            if "sampling_callback" in kwargs:
                kwargs["sampling_callback"] = self._sampling_callback(spec.name)
            if "elicitation_callback" in kwargs:
                kwargs["elicitation_callback"] = self._elicitation_callback(spec.name)
            if "list_roots_callback" in kwargs:  # only where `serve` would ask its client: not a shared server
                kwargs["list_roots_callback"] = self._list_roots
            return kwargs

        return hooks

    @contextlib.contextmanager
    def calling(self, server: str) -> Iterator[None]:
        """The call to `server`: what it asks meanwhile is the call's (another server's request is no one's)."""
        self.asked.clear()
        self._server = server
        try:
            yield
        finally:
            self._server = None

    def _refuse(self, server: str, question: Question) -> types.ErrorData:
        if server == self._server:
            self.asked.append(question)
        return _refusal(question)

    def _sampling_callback(self, server: str) -> Any:
        async def sampling(context: ClientRequestContext, params: types.CreateMessageRequestParams) -> types.ErrorData:
            return self._refuse(server, _sampling())

        return sampling

    def _elicitation_callback(self, server: str) -> Any:
        async def elicitation(context: ClientRequestContext, params: types.ElicitRequestParams) -> types.ErrorData:
            return self._refuse(server, _elicitation(params))

        return elicitation

    async def _list_roots(self, context: ClientRequestContext) -> types.ListRootsResult:
        root = types.Root.model_validate({"uri": self.root.as_uri(), "name": self.root.name or str(self.root)})
        return types.ListRootsResult(roots=[root])

    def explain(self, result: types.CallToolResult) -> types.CallToolResult:
        """A tool error (or the server's error answer) that followed a refused request, as CLIENT_CANNOT_ANSWER.

        As `gateway._relay.explain_refusal` does for a client without the capability: the tool's own words stay
        first, the last refused request is the reason.
        """
        structured = result.structured_content
        if not result.is_error or not self.asked or not isinstance(structured, Mapping):
            return result
        if structured.get("code") not in (ErrorCode.TOOL_ERROR.value, ErrorCode.UPSTREAM_ERROR.value):
            return result
        question = self.asked[-1]
        detail: dict[str, Any] = {"request": question.kind, "reason": question.why}
        if question.page is not None:
            detail["elicitations"] = [question.page]
        err = ClientCannotAnswerError(
            question.message(),
            server=structured.get("server"),
            tool=structured.get("tool"),
            attempt=int(structured.get("attempt") or 1),
            max_attempts=int(structured.get("max_attempts") or 1),
            operation_id=structured.get("operation_id"),
            detail=detail,
        )
        ours = error_result(err)
        own = [block for block in result.content if not (block.meta or {}).get(ENVELOPE_META_KEY)]
        return ours.model_copy(update={"content": [*own, *ours.content]})


def asked_text(err: CallError) -> str:
    """A CLIENT_CANNOT_ANSWER for the person at the command line: where, and the message (what the tool asked, the
    fix, a page's address); not the advice, which is the model's ("give the user the address")."""
    where = f"Tool '{err.tool}' on server '{err.server}': " if err.tool and err.server else ""
    text = f"{where}{err.message}".rstrip()
    return text if text.endswith((".", "!", "?")) else f"{text}."
