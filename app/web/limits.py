"""The console server's input-limits layer and security headers, installed before any blueprint.

Before every view (app.input_limits holds the rules, shared with both gateways):
  - route segments: `<int:…>` ids are at most 2⁶³−1 (a larger one matches no route: 404); string
    segments carry no NUL or lone surrogate;
  - query parameters: strings within bounds, documented integer parameters within their SQL type;
  - bodies: JSON at most MAX_JSON_BYTES, parsed once through the bounded parser (depth, NUL, surrogates,
    bigint range, no NaN) whoever calls `request.get_json()`; form fields checked like query parameters.
After every response: frame-ancestors/X-Frame-Options (no clickjacking of the Fleet page's buttons), a
Content-Security-Policy that allows only this site's scripts and styles (the console has no inline
script: static/console.js carries its few handlers and htmx runs with allowEval off), nosniff, and the
session cookie's Secure flag whenever the request arrived over HTTPS.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any, TypeVar

from flask import Flask, Response, request
from flask.json.provider import DefaultJSONProvider
from flask.sessions import SecureCookieSessionInterface
from pydantic import BaseModel, ValidationError, ValidationInfo
from werkzeug.routing import IntegerConverter

from tuneplane.app import input_limits
from tuneplane.app.errors import Refusal

MAX_ID = 2**63 - 1
FORM_MIMETYPES = ("application/x-www-form-urlencoded", "multipart/form-data")

CONTENT_SECURITY_POLICY = "; ".join(
    [
        "default-src 'self'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self' data:",
        "connect-src 'self'",
        "object-src 'none'",
        "base-uri 'self'",
        "form-action 'self'",
        "frame-ancestors 'none'",
    ]
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
}

M = TypeVar("M", bound=BaseModel)


class BoundedIntConverter(IntegerConverter):
    """`<int:…>` that matches only what fits PostgreSQL's bigint (a larger id is a 404, not a 500)."""

    def __init__(self, url_map: Any, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("max", MAX_ID)
        super().__init__(url_map, *args, **kwargs)


class LimitedJSONProvider(DefaultJSONProvider):
    """Flask's JSON with request bodies parsed by the bounded parser (a refusal, not a RecursionError)."""

    def loads(self, s: str | bytes, **kwargs: Any) -> Any:
        if kwargs:  # the session serializer's own use (object_hook): signed data this server wrote
            return super().loads(s, **kwargs)
        return input_limits.load_json(s)


class HttpsAwareSessionInterface(SecureCookieSessionInterface):
    """The session cookie is marked Secure when the request came over HTTPS (or the config says so)."""

    def get_cookie_secure(self, app: Flask) -> bool:
        return bool(app.config["SESSION_COOKIE_SECURE"]) or request.is_secure


def check_request() -> None:
    input_limits.check_query(request.args)
    for name, value in (request.view_args or {}).items():
        input_limits.check_route_value(name, value)
    if request.is_json:
        request.max_content_length = input_limits.MAX_JSON_BYTES
        if request.content_length or request.headers.get("Transfer-Encoding"):
            request.get_json()
    elif request.mimetype in FORM_MIMETYPES:
        if request.mimetype == FORM_MIMETYPES[0]:
            request.max_content_length = input_limits.MAX_JSON_BYTES
        for key, value in request.form.items(multi=True):
            input_limits.check_text(key, "form field name", 200)
            input_limits.check_text(value, key)


def security_headers(response: Response) -> Response:
    for name, value in SECURITY_HEADERS.items():
        response.headers.setdefault(name, value)
    return response


def install(app: Flask) -> None:
    """Call before registering blueprints: the int converter is bound when routes are added."""
    app.url_map.converters["int"] = BoundedIntConverter
    app.json = LimitedJSONProvider(app)
    app.session_interface = HttpsAwareSessionInterface()
    app.before_request(check_request)
    app.after_request(security_headers)


def body_dict(allowed: Collection[str] | None = None) -> dict[str, Any]:
    """The request's JSON object, or its form fields: the body of an endpoint that takes either. With
    `allowed`, a JSON body naming any other field is refused by its name (a form carries the CSRF token
    and the page's hidden fields beside its own)."""
    if request.is_json:
        body = request.get_json()
        if not isinstance(body, dict):
            raise Refusal("the body must be a JSON object", status=400, field="body")
        if allowed is not None:
            refuse_unknown(body, allowed)
        return body
    return request.form.to_dict()


def refuse_unknown(body: dict[str, Any], known: Collection[str]) -> None:
    unknown = [str(key) for key in body if key not in known]
    if unknown:
        refusal = Refusal(f"{unknown[0]}: unknown field", status=400, field=unknown[0])
        refusal.fields.update({key: "unknown field" for key in unknown})
        raise refusal


def parse_body(model: type[M], data: dict[str, Any] | None = None) -> M:
    """`data` (default: body_dict()) validated by a pydantic model; a 400 naming every bad field.

    A JSON body is held to the model strictly, whatever the model's own config: an unknown field is
    refused by its name (a misspelt `limt_gpus` is not silently dropped) and no value is coerced
    (`"overcommit": "yes"` is not true, `"5"` is not 5). A form post carries every value as text, the
    CSRF token and the page's own hidden fields beside them: its values are converted, extras ignored."""
    strict = request.is_json if data is None else True
    if data is None:
        data = body_dict()
    if strict:
        refuse_unknown(
            data, set(model.model_fields) | {f.alias for f in model.model_fields.values() if f.alias}
        )
    try:
        return model.model_validate(data, strict=strict or None, context={"form": not strict})
    except ValidationError as exc:
        raise refusal_from_errors(exc) from None


def from_form(info: ValidationInfo) -> bool:
    """Whether a validator sees a form post's text (parse_body's context), not a JSON client's value."""
    return bool(info.context and info.context.get("form"))


def refusal_from_errors(exc: ValidationError, status: int = 400) -> Refusal:
    fields: dict[str, str] = {}
    for error in exc.errors(include_url=False, include_input=False):
        name = ".".join(str(p) for p in error["loc"]) or "body"
        message = "unknown field" if error["type"] == "extra_forbidden" else error["msg"]
        fields.setdefault(name, message.removeprefix("Value error, "))
    name, message = next(iter(fields.items()))
    refusal = Refusal(f"{name}: {message}", status=status, field=name)
    refusal.fields.update(fields)
    return refusal


def query_int(
    name: str, default: int | None, low: int = 1, high: int = MAX_ID, *, clamp: bool = False
) -> int | None:
    """An integer query parameter within [low, high] (absent or empty: `default`), else 400 naming it.

    `clamp`: [low, high] is only the SQL type and the stored function the value goes to checks (and
    states) the range it accepts: a value beyond the type is passed as the type's bound, so that one
    parameter is always refused with one range, the function's."""
    raw = request.args.get(name, "")
    if raw == "":
        return default
    return input_limits.parse_int(raw, name, low, high, clamp=clamp)
