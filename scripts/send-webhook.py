#!/usr/bin/env python3
"""Send one signed webhook by hand, as the payment provider would.

    scripts/send-webhook.py pay_42                      # payment.succeeded for pay_42
    scripts/send-webhook.py pay_42 --type payment.refunded
    scripts/send-webhook.py pay_42 --id evt_abc         # again: replayed, no new effect

Signs with the first of WEBHOOK_SECRETS (or --secret) in the `standard`
scheme (a whsec_ secret) or the `stripe` scheme (--scheme stripe), posts to
--url (default http://127.0.0.1:8080/webhooks/payments, where `make run
RUN_KEEP=1` serves), and prints the status, the Idempotent-Replayed header and
the body. Exit 0 on a 2xx. Standard library only.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import hmac
import json
import os
import secrets
import sys
import time
import urllib.error
import urllib.request


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("payment_id", help="the order's payment id, e.g. pay_42")
    ap.add_argument("--type", default="payment.succeeded", help="event type (default payment.succeeded)")
    ap.add_argument("--id", default=None, help="event id (default a new evt_<random>)")
    ap.add_argument("--amount", type=int, default=4200)
    ap.add_argument("--url", default="http://127.0.0.1:8080/webhooks/payments")
    ap.add_argument("--secret", default=None, help="default: the first of WEBHOOK_SECRETS")
    ap.add_argument("--scheme", choices=("standard", "stripe"), default=None,
                    help="default: WEBHOOK_SIGNATURE_SCHEME, else standard")
    args = ap.parse_args()

    secret = args.secret or os.environ.get("WEBHOOK_SECRETS", "").split(",")[0].strip()
    if not secret:
        print("send-webhook: no secret: pass --secret or set WEBHOOK_SECRETS", file=sys.stderr)
        return 2
    scheme = args.scheme or os.environ.get("WEBHOOK_SIGNATURE_SCHEME", "standard")
    event_id = args.id or f"evt_{secrets.token_hex(12)}"
    ts = str(int(time.time()))
    body = json.dumps({"id": event_id, "type": args.type, "created": int(ts),
                       "data": {"payment_id": args.payment_id, "amount": args.amount, "currency": "gbp"}},
                      separators=(",", ":")).encode()

    headers = {"Content-Type": "application/json"}
    if scheme == "standard":
        if not secret.startswith("whsec_"):
            print("send-webhook: the standard scheme needs a whsec_<base64> secret", file=sys.stderr)
            return 2
        key = base64.b64decode(secret[len("whsec_"):])
        mac = hmac.new(key, f"{event_id}.{ts}.".encode() + body, hashlib.sha256).digest()
        headers.update({"webhook-id": event_id, "webhook-timestamp": ts,
                        "webhook-signature": "v1," + base64.b64encode(mac).decode()})
    else:
        mac = hmac.new(secret.encode(), f"{ts}.".encode() + body, hashlib.sha256).hexdigest()
        headers["Stripe-Signature"] = f"t={ts},v1={mac}"

    req = urllib.request.Request(args.url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            status, replayed, text = resp.status, resp.headers.get("Idempotent-Replayed"), resp.read()
    except urllib.error.HTTPError as e:
        status, replayed, text = e.code, e.headers.get("Idempotent-Replayed"), e.read()
    except OSError as e:
        print(f"send-webhook: {args.url}: {e}", file=sys.stderr)
        return 1
    print(f"{status} event {event_id}" + (f"  Idempotent-Replayed: {replayed}" if replayed else ""))
    print(text.decode(errors="replace"))
    return 0 if 200 <= status < 300 else 1


if __name__ == "__main__":
    sys.exit(main())
