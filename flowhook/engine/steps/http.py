"""``http``: an outbound request, every string templated.

``request: {method, url, headers, query, json | body}``; output ``{status_code, headers,
json | body}``. A non-2xx answer is a step error unless its code is in ``accept_status``.
Redirects are not followed (a redirect could lead past the target guard). The request
carries an ``Idempotency-Key`` (:func:`idempotency_key`), the same on every attempt and after
a restart and another for each map item and parallel branch, so a receiver can drop a retried
duplicate and still act on every item; and ``traceparent`` with the run's trace id and the
attempt's own span id (W3C Trace Context; a ``traceparent`` the step sets itself wins).
Default timeout 30 s.

``{{ secrets.NAME }}`` in the request's ``url``, ``headers`` and body reads a step secret of
the run's workspace and mode, read as the request is built; one deleted since the flow was
saved fails the step with error type ``secret``. Every value read is replaced by
``[secret:NAME]`` in the attempt's output (an answer that echoes it included), error and
span (:mod:`flowhook.engine.redact`).
"""

from __future__ import annotations

from typing import Any

import aiohttp
import orjson

from flowhook import tracing
from flowhook.definition import ExpressionError, compile_value, evaluate, secret_names
from flowhook.definition.requests import request_problem
from flowhook.definition.secret_refs import SECRET_FIELDS, SecretUse
from flowhook.engine.redact import Redactor
from flowhook.engine.steps.base import Action, Context, Outcome, StepBase, StepEnv, error
from flowhook.outbound import classify
from flowhook.targets import TargetRefused, check_url

__all__ = ["HttpStep", "MAX_RESPONSE_BYTES"]

MAX_RESPONSE_BYTES = 1024 * 1024
DEFAULT_TIMEOUT = 30.0


def idempotency_key(env: StepEnv, step_id: str) -> str:
    """``<run_id>:<step_id>`` for a step of the run itself (a sub-flow run is a run of its
    own, with its own id); inside a map item or a parallel branch,
    ``<run_id>:<part_id>:<step_id>``. A part's row is written once, when its parent fans out,
    so its id is the same on every attempt and after a crash, and no two items share it."""
    if env.row_id and env.row_id != env.run_id:
        return f"{env.run_id}:{env.row_id}:{step_id}"
    return f"{env.run_id}:{step_id}"


class HttpStep(StepBase, kind="http", pure=False, external=True):
    def __init__(self, spec: dict[str, Any]) -> None:
        super().__init__(spec)
        self.timeout = spec.get("timeout_seconds", DEFAULT_TIMEOUT)
        self._request = compile_value(spec["request"])
        self._accept = set(spec.get("accept_status", []))
        request = spec["request"]
        try:
            self._secrets = frozenset(
                name for part in SECRET_FIELDS for name in secret_names(request.get(part))
            )
        except SecretUse:  # saved before secrets were: ``secrets`` is undefined, as it was
            self._secrets = frozenset()

    async def run(self, ctx: Context, env: StepEnv) -> Outcome:
        if not self._secrets:
            return await self._send(ctx, env)
        assert env.secrets is not None, "the executor gives steps the secrets' reader"
        values = await env.secrets(self._secrets)
        gone = sorted(self._secrets - values.keys())
        if gone:
            return error(
                "secret",
                f"secret {gone[0]!r} does not exist in this workspace and mode (deleted since "
                "the flow was saved?); create it again or change the flow",
            )
        redactor = Redactor(values)
        try:
            outcome = await self._send({**ctx, "secrets": values}, env)
        except Exception as exc:  # noqa: BLE001 - its message may hold a value: redacted here
            outcome = error("internal", f"{type(exc).__name__}: {exc}")
        finally:  # a timeout too: the executor ends the span with what it holds
            if env.span is not None:
                redactor.in_place(env.span)
        outcome.output = redactor.value(outcome.output)
        outcome.error = redactor.value(outcome.error)
        return outcome

    async def _send(self, ctx: Context, env: StepEnv) -> Outcome:
        try:
            request = await evaluate(self._request, ctx)
        except ExpressionError as exc:
            return error("expression", str(exc))
        method = str(request.get("method", "GET")).upper()
        url = str(request["url"])
        try:
            check_url(url, allow_private=env.allow_private_targets)
        except TargetRefused as exc:
            return error("destination_blocked", exc.message)
        headers = {str(k): str(v) for k, v in (request.get("headers") or {}).items()}
        problem = request_problem(method, headers)
        if problem:
            return error("invalid_request", problem)
        if not any(k.lower() == "idempotency-key" for k in headers):
            headers["Idempotency-Key"] = idempotency_key(env, self.id)
        if not any(k.lower() == "traceparent" for k in headers):
            trace = tracing.run_trace(env.row_id or env.run_id, env.traceparent)
            span_id = tracing.step_span_id(env.row_id or env.run_id, env.idx, env.attempt)
            headers["traceparent"] = tracing.header(trace, span_id)
        if env.span is not None:
            env.span.update(tracing.http_attributes(method, url, None))
        params = {
            str(k): v if isinstance(v, str) else orjson.dumps(v).decode()
            for k, v in (request.get("query") or {}).items()
        }
        kwargs: dict[str, Any] = {"headers": headers, "params": params, "allow_redirects": False}
        if "json" in request:
            kwargs["data"] = orjson.dumps(request["json"])
            headers.setdefault("Content-Type", "application/json")
        elif "body" in request:
            kwargs["data"] = str(request["body"]).encode()
        assert env.http is not None, "the worker gives http steps a session"
        try:
            async with env.http.request(method, url, **kwargs) as response:
                raw = await response.content.read(MAX_RESPONSE_BYTES + 1)
                if len(raw) > MAX_RESPONSE_BYTES:
                    return error("http", f"response larger than {MAX_RESPONSE_BYTES} bytes")
                output: dict[str, Any] = {
                    "status_code": response.status,
                    "headers": {str(k): v for k, v in response.headers.items()},
                }
                if response.content_type == "application/json" or response.content_type.endswith(
                    "+json"
                ):
                    try:
                        output["json"] = orjson.loads(raw) if raw else None
                    except orjson.JSONDecodeError:
                        output["body"] = raw.decode("utf-8", "replace")
                else:
                    output["body"] = raw.decode("utf-8", "replace")
        except (TargetRefused, aiohttp.ClientError) as exc:
            return error(*classify(exc, where=f"{url}: "))
        status = output["status_code"]
        if env.span is not None:
            env.span["http.response.status_code"] = status
        if 200 <= status < 300 or status in self._accept:
            return Outcome(output=output)
        return Outcome(
            output=output,
            error={
                "type": "http",
                "message": f"{method} {url} answered {status}",
                "status_code": status,
            },
            action=Action.FAIL,
        )
