"""Schemathesis hooks for docs/openapi.yaml against a live webhook-ingest
(crates/webhook-ingest/tests/it/openapi.rs sets the OPENAPI_* variables read below).
Generated requests would all stop at the signature check, so most are signed over
the exact bytes sent, some steered to the seeded orders or resent (every `status`
and the replay), some too large, the rest unsigned or badly signed (the 401s, 413).
"""

import base64
import hashlib
import hmac
import itertools
import json
import os
import random
import time

import schemathesis
from schemathesis.core import NotSet

WEBHOOK_PATH = "/webhooks/payments"
MAX_BODY_BYTES = 256 * 1024
# Further in the past than any tolerance the test sets.
STALE_SECS = 3600

SCHEME = os.environ.get("OPENAPI_SCHEME", "standard")
SECRET = os.environ.get("OPENAPI_SECRET", "")
PAYMENT_IDS = [p for p in os.environ.get("OPENAPI_PAYMENT_IDS", "").split(",") if p]
RANDOM = random.Random(int(os.environ.get("OPENAPI_HOOK_SEED", "1")))  # a run is reproducible
SIGNATURE_HEADERS = {"webhook-id", "webhook-timestamp", "webhook-signature", "stripe-signature"}

# How a request is signed, and how often; as_generated keeps schemathesis's own (malformed) headers.
SIGNINGS = {"signed": 80, "unsigned": 6, "wrong_secret": 5, "stale": 5, "as_generated": 4}
# What is done to a signed body first: a new `id` (generated ones repeat, so replay), a
# payment or refund of a seeded order, an earlier body again (a redelivery), an oversized one.
STEERS = {"as_generated": 40, "fresh_id": 15, "seeded_order": 30, "resend": 12, "oversized": 3}

_fresh_ids = itertools.count(1)
_sent = []  # bodies sent signed, to resend


def _pick(weighted):
    return RANDOM.choices(list(weighted), list(weighted.values()))[0]


def _signature_headers(raw, secret, timestamp):
    """The headers a provider would send for `raw`."""
    if SCHEME == "standard":
        key = base64.b64decode(secret.removeprefix("whsec_"))
        msg_id = f"msg_{next(_fresh_ids)}"
        tag = hmac.new(key, f"{msg_id}.{timestamp}.".encode() + raw, hashlib.sha256).digest()
        signature = "v1," + base64.b64encode(tag).decode()
        return {"webhook-id": msg_id, "webhook-timestamp": str(timestamp), "webhook-signature": signature}
    tag = hmac.new(secret.encode(), f"{timestamp}.".encode() + raw, hashlib.sha256).hexdigest()
    return {"Stripe-Signature": f"t={timestamp},v1={tag}"}


def _serialize(body):
    """The bytes schemathesis would send for `body` as application/json."""
    if isinstance(body, NotSet):
        return b""
    if isinstance(body, bytes):
        return body
    return json.dumps(body, allow_nan=False).encode("utf-8")


def _steer(case):
    """Changes `case.body` (a signed one) as STEERS says; returns the bytes to send, or None."""
    steer = _pick(STEERS)
    if steer == "resend" and _sent:
        raw = RANDOM.choice(_sent)
        case.body = json.loads(raw)
        return raw
    if steer == "seeded_order" and PAYMENT_IDS:
        body = case.body if isinstance(case.body, dict) else {}
        data = body.get("data") if isinstance(body.get("data"), dict) else {}
        data["payment_id"] = RANDOM.choice(PAYMENT_IDS)
        kind = RANDOM.choice(["payment.succeeded", "payment.succeeded", "payment.refunded"])
        body.update(id=f"evt_openapi_{next(_fresh_ids)}", type=kind, data=data)
        case.body = body
    elif steer == "fresh_id" and isinstance(case.body, dict):
        case.body["id"] = f"evt_openapi_{next(_fresh_ids)}"
    elif steer == "oversized":
        case.body = {"id": f"evt_openapi_{next(_fresh_ids)}", "type": "payment.succeeded",
                     "padding": "x" * MAX_BODY_BYTES}
    return None


# The admin endpoints' text bodies, decoded so they are checked too.
@schemathesis.deserializer("text/plain", "application/openmetrics-text")
def _text(_context, response):
    return response.content.decode("utf-8")


@schemathesis.hook
def before_call(context, case, kwargs):
    # `kwargs` (not `**kwargs`): the transport's own arguments, so the body
    # set here is what is sent, byte for byte as signed.
    if case.operation.path != WEBHOOK_PATH:
        return
    signing = _pick(SIGNINGS)
    if signing == "as_generated":
        return
    headers = {k: v for k, v in (case.headers or {}).items() if k.lower() not in SIGNATURE_HEADERS}
    raw = _steer(case) if signing == "signed" else None
    if raw is None:
        try:
            raw = _serialize(case.body)
        except (TypeError, ValueError):
            # Not JSON-serialisable as it is: sent as schemathesis sends it, unsigned.
            case.headers = headers
            return
    if signing != "unsigned":
        secret = SECRET
        timestamp = int(time.time())
        if signing == "wrong_secret":
            secret = "whsec_" + base64.b64encode(b"not-the-ingest-secret-at-all").decode()
        elif signing == "stale":
            timestamp -= STALE_SECS
        headers.update(_signature_headers(raw, secret, timestamp))
    if signing == "signed" and len(raw) <= MAX_BODY_BYTES and raw[:1] == b"{":
        _sent.append(raw)
    case.headers = headers
    kwargs["data"] = raw
