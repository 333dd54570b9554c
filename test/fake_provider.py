#!/usr/bin/env python3
"""test/fake_provider.py: a fake billing provider on loopback, for the push tests.

    fake_provider.py --port-file PORT --log LOG
                     [--client-id ID --client-secret SECRET] [--bearer TOKEN]
                     [--hmac-secret SECRET] [--page-size 2] [--token-ttl 3600]

Listens on 127.0.0.1 on a free port, which it writes to --port-file once it
accepts connections.  HTTP/1.1 with keep-alive; every answer is JSON with a
Content-Length.  All state is in memory.  Runs until it is killed.

Kinde-like API (client credentials default to earmark-client/earmark-secret):
  POST /oauth2/token                    form body (or HTTP Basic for the id and
                                        secret): grant_type=client_credentials,
                                        client_id, client_secret, audience =
                                        http://127.0.0.1:PORT/api
  POST /api/v1/billing/meter_usage      {"customer_agreement_id", "billing_feature_code",
                                        "meter_value", "meter_type_code": absolute|delta}
  GET  /api/v1/billing/meter_usage      ?customer_agreement_id=A&billing_feature_code=F
  GET  /api/v1/billing/entitlements     ?customer_id=C[&starting_after=ID][&page_size=N]
  (every /api/ request needs "Authorization: Bearer <live token>")

Generic "http" provider (--bearer and/or --hmac-secret turn authentication on):
  PUT  /generic/meter                   {"account", "customer", "agreement", "feature",
                                        "cycle_start", "total"}
  GET  /generic/meter                   ?account=..&feature=..&cycle_start=..
  GET  /generic/limits                  ?account=..[&customer=..]
  HMAC: X-Earmark-Timestamp: <unix seconds>, X-Earmark-Signature: v1=<hex
  HMAC-SHA256(secret, ts + "." + METHOD + "." + path?query + "." + body)>.

Control (no authentication, not logged, not subject to faults):
  POST /_control   JSON object, any of:
                   "fail": {"status", "count", "path", "method", "query", "body_bytes"},
                   "answer": {"status", "body", "headers", "interim", "count", "path",
                              "method", "query"},
                   "rate_limit": {"count", "reset", "path", "method", "query"},
                   "hang": {"count", "seconds", "path", "method", "query"}, "slow": {"ms"},
                   "release": true, "token_expires_in": "<raw JSON text>" or null,
                   "down": bool, "set_meter", "set_entitlement" (with "remove": true, the
                   feature is no longer listed), "set_limit" (an object
                   or a list of them; "remove": true as for set_entitlement), "revoke_tokens": true, "reset_concurrency": true
                   (max_concurrent starts again from the requests open now).
  GET  /_state     meters, write counts, tokens issued, requests seen, requests in
                   flight (waiting on a hang or slow), rate_limited_until, and
                   max_concurrent: the most requests open at once (from arrival
                   until answered; "slow" holds each one open that long)
  POST /_reset     forgets meters, entitlements, limits, faults, counters and requests

Faults are checked in the order down (503), fail, answer, rate_limit (429 with
RateLimit-Reset and Retry-After in seconds; with "retry_after": "date" only a
Retry-After as an HTTP date, RFC 9110, of now + reset, cut to the second), hang,
slow; "fail", "answer", "rate_limit"
and "hang" each queue rules (first matching rule with a count left is used;
"count": 0 drops all rules of that kind).  A rule matches a request whose
path starts with "path", whose method is "method" and whose query string
contains "query" (each when given).  "fail" answers {"error": "injected"},
padded to "body_bytes" bytes when given.  "answer" sends "body" verbatim
(any text, valid JSON or not: a hostile provider) with "status" (200) and
the "headers" given (an object of strings, sent as they are), after an
interim "103 Early Hints" answer with the headers of "interim" when given.
"token_expires_in" puts its text verbatim as the token answer's expires_in
(e.g. "1e200000"; null goes back to --token-ttl).  A hung request ends early
when the client hangs up, and is then processed as usual (its answer goes
nowhere); "release" ends every hang and slow wait in progress at once (those
requests are then answered as usual).

Every request other than the control ones appends
"<unix time> <METHOD> <path without query> <status>" to --log (the time is
the request's arrival) before it is answered.
"""
import argparse
import base64
import datetime
import email.utils
import hashlib
import hmac
import http.server
import json
import math
import os
import re
import secrets
import select
import socket
import sys
import threading
import time
import urllib.parse

MAX_BODY = 1024 * 1024
HMAC_WINDOW = 300
CONTROL_PATHS = ("/_control", "/_state", "/_reset")
# the key under which an answer rule keeps its interim headers (no header
# name can contain a space)
INTERIM = "interim answer"
ROUTES = {
    "/oauth2/token": ("POST",),
    "/api/v1/billing/meter_usage": ("POST", "GET"),
    "/api/v1/billing/entitlements": ("GET",),
    "/generic/meter": ("PUT", "GET"),
    "/generic/limits": ("GET",),
    "/_control": ("POST",),
    "/_state": ("GET",),
    "/_reset": ("POST",),
}
DIGITS = re.compile(r"[0-9]+\Z")


class BadRequest(Exception):
    pass


class Raw:
    """An answer body sent as it is, not as JSON made from an object."""
    def __init__(self, text):
        self.data = text.encode("utf-8")


def is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def opt_limit(v, what):
    if v is None or is_int(v):
        return v
    raise BadRequest("%s must be an integer or null" % what)


def need_str(obj, key):
    v = obj.get(key)
    if not isinstance(v, str) or v == "":
        raise BadRequest("%s must be a non-empty string" % key)
    return v


def canonical_cycle_start(v):
    """ISO 8601 UTC timestamp -> "YYYY-MM-DDTHH:MM:SS[.ffffff]Z"."""
    if not isinstance(v, str) or "T" not in v:
        raise BadRequest("cycle_start must be an ISO 8601 UTC timestamp")
    try:
        d = datetime.datetime.fromisoformat(v)
    except ValueError:
        raise BadRequest("cycle_start must be an ISO 8601 UTC timestamp")
    if d.tzinfo is None or d.utcoffset() != datetime.timedelta(0):
        raise BadRequest("cycle_start must be in UTC")
    s = d.strftime("%Y-%m-%dT%H:%M:%S")
    if d.microsecond:
        s += ".%06d" % d.microsecond
    return s + "Z"


class State:
    def __init__(self):
        self.lock = threading.Lock()
        self.tokens = {}                # token -> expiry (unix time)
        self.open = 0                   # requests arrived and not yet answered
        self.reset()

    def reset(self):                    # callers hold the lock (or are __init__)
        self.kinde_meters = {}          # "agreement|feature" -> int
        self.generic_meters = {}        # "account|feature|cycle_start" -> int
        self.writes = {}                # meter key -> count of writes
        self.tokens_issued = 0
        self.entitlements = {}          # customer -> {feature: [id, limit]} (insertion order)
        self.next_ent = 1
        self.limits = {}                # account -> {feature: limit}
        self.requests = []
        self.fail_rules = []
        self.rate_rules = []
        self.answer_rules = []
        self.hang_rules = []
        self.slow_ms = 0
        self.down = False
        self.rate_limited_until = None
        self.token_expires_in = None    # raw JSON text, or None
        self.in_flight = {}             # id -> request waiting on a hang or slow
        self.release_gen = 0            # "release" ends the waits of older generations
        self.max_concurrent = self.open   # the most requests open at once


def take_rule(rules, method, path, query=""):
    """The first rule matching method, path and query with a count left, counted down."""
    for r in rules:
        if r["count"] <= 0:
            continue
        if r["path"] is not None and not path.startswith(r["path"]):
            continue
        if r["method"] is not None and r["method"] != method:
            continue
        if r["query"] is not None and r["query"] not in query:
            continue
        r["count"] -= 1
        return r
    return None


def parse_rule(spec, kind):
    if not isinstance(spec, dict):
        raise BadRequest("%s must be an object" % kind)
    count = spec.get("count", 1)
    if not is_int(count) or count < 0:
        raise BadRequest("%s.count must be an integer >= 0" % kind)
    path = spec.get("path")
    if path is not None and not isinstance(path, str):
        raise BadRequest("%s.path must be a string" % kind)
    method = spec.get("method")
    if method is not None:
        if not isinstance(method, str):
            raise BadRequest("%s.method must be a string" % kind)
        method = method.upper()
    query = spec.get("query")
    if query is not None and not isinstance(query, str):
        raise BadRequest("%s.query must be a string" % kind)
    rule = {"count": count, "path": path, "method": method, "query": query}
    if kind in ("fail", "answer"):
        status = spec.get("status", 500 if kind == "fail" else 200)
        if not is_int(status) or not 200 <= status <= 599:
            raise BadRequest("%s.status must be an integer in 200..599" % kind)
        rule["status"] = status
    if kind == "fail":
        pad = spec.get("body_bytes", 0)
        if not is_int(pad) or not 0 <= pad <= MAX_BODY:
            raise BadRequest("fail.body_bytes must be an integer in 0..%d" % MAX_BODY)
        rule["body_bytes"] = pad
    elif kind == "answer":
        body = spec.get("body")
        if not isinstance(body, str):
            raise BadRequest("answer.body must be a string")
        rule["body"] = body
        headers = spec.get("headers", {})
        if not isinstance(headers, dict) or not all(
                isinstance(k, str) and isinstance(v, str) and "\n" not in k + v and "\r" not in k + v
                for k, v in headers.items()):
            raise BadRequest("answer.headers must be an object of one-line strings")
        rule["headers"] = headers
        interim = spec.get("interim")
        if interim is not None and (not isinstance(interim, dict) or not all(
                isinstance(k, str) and isinstance(v, str) and "\n" not in k + v and "\r" not in k + v
                for k, v in interim.items())):
            raise BadRequest("answer.interim must be an object of one-line strings")
        if interim is not None:
            rule["headers"] = dict(headers, **{INTERIM: interim})
    elif kind == "rate_limit":
        reset = spec.get("reset", 1)
        if not isinstance(reset, (int, float)) or isinstance(reset, bool) or reset < 0:
            raise BadRequest("rate_limit.reset must be a number >= 0")
        rule["reset"] = int(math.ceil(reset))      # headers carry whole seconds
        form = spec.get("retry_after", "seconds")
        if form not in ("seconds", "date"):
            raise BadRequest("rate_limit.retry_after must be \"seconds\" or \"date\"")
        rule["date"] = form == "date"
    elif kind == "hang":
        seconds = spec.get("seconds", 10)
        if not isinstance(seconds, (int, float)) or isinstance(seconds, bool) or seconds < 0:
            raise BadRequest("hang.seconds must be a number >= 0")
        rule["seconds"] = float(seconds)
    return rule


def as_list(v, kind):
    items = v if isinstance(v, list) else [v]
    for it in items:
        if not isinstance(it, dict):
            raise BadRequest("%s must be an object or a list of objects" % kind)
    return items


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port-file", required=True)
    ap.add_argument("--log", required=True)
    ap.add_argument("--client-id", default="earmark-client")
    ap.add_argument("--client-secret", default="earmark-secret")
    ap.add_argument("--bearer")
    ap.add_argument("--hmac-secret")
    ap.add_argument("--page-size", type=int, default=2)
    ap.add_argument("--token-ttl", type=int, default=3600)
    args = ap.parse_args()
    if args.page_size < 1:
        ap.error("--page-size must be at least 1")

    st = State()
    base = {}                           # filled in once the port is known

    # ---- control -------------------------------------------------------

    def control(obj):
        if not isinstance(obj, dict):
            raise BadRequest("the body must be a JSON object")
        actions = []                    # validate everything, then apply at once
        for key, v in obj.items():
            if key in ("fail", "answer", "rate_limit", "hang"):
                rule = parse_rule(v, key)
                actions.append((key, rule))
            elif key == "release":
                if v is not True:
                    raise BadRequest("release must be true")
                actions.append((key, v))
            elif key == "token_expires_in":
                if v is not None and not isinstance(v, str):
                    raise BadRequest("token_expires_in must be a string (raw JSON text) or null")
                actions.append((key, v))
            elif key == "slow":
                ms = v.get("ms") if isinstance(v, dict) else None
                if not isinstance(ms, (int, float)) or isinstance(ms, bool) or ms < 0:
                    raise BadRequest("slow must be {\"ms\": number >= 0}")
                actions.append((key, ms))
            elif key == "down":
                if not isinstance(v, bool):
                    raise BadRequest("down must be true or false")
                actions.append((key, v))
            elif key == "revoke_tokens":
                if v is not True:
                    raise BadRequest("revoke_tokens must be true")
                actions.append((key, v))
            elif key == "reset_concurrency":
                if v is not True:
                    raise BadRequest("reset_concurrency must be true")
                actions.append((key, v))
            elif key == "set_meter":
                for m in as_list(v, key):
                    val = m.get("value")
                    if not is_int(val) or val < 0:
                        raise BadRequest("set_meter.value must be an integer >= 0")
                    if "agreement" in m:
                        k = "%s|%s" % (need_str(m, "agreement"), need_str(m, "feature"))
                        actions.append(("kinde_meter", (k, val)))
                    elif "account" in m:
                        k = "%s|%s|%s" % (need_str(m, "account"), need_str(m, "feature"),
                                          canonical_cycle_start(m.get("cycle_start")))
                        actions.append(("generic_meter", (k, val)))
                    else:
                        raise BadRequest("set_meter needs agreement or account")
            elif key == "set_entitlement":
                for e in as_list(v, key):
                    if e.get("remove") is True:
                        actions.append(("remove_entitlement", (need_str(e, "customer"),
                                                               need_str(e, "feature"))))
                        continue
                    actions.append((key, (need_str(e, "customer"), need_str(e, "feature"),
                                          opt_limit(e.get("limit"), "limit"))))
            elif key == "set_limit":
                for e in as_list(v, key):
                    if e.get("remove") is True:
                        actions.append(("remove_limit", (need_str(e, "account"),
                                                         need_str(e, "feature"))))
                        continue
                    actions.append((key, (need_str(e, "account"), need_str(e, "feature"),
                                          opt_limit(e.get("limit"), "limit"))))
            else:
                raise BadRequest("unknown control key %r" % key)
        with st.lock:
            for kind, a in actions:
                if kind in ("fail", "answer", "rate_limit", "hang"):
                    rules = {"fail": st.fail_rules, "answer": st.answer_rules,
                             "rate_limit": st.rate_rules, "hang": st.hang_rules}[kind]
                    if a["count"] == 0:
                        rules.clear()
                    else:
                        rules.append(a)
                elif kind == "slow":
                    st.slow_ms = a
                elif kind == "release":
                    st.release_gen += 1
                elif kind == "token_expires_in":
                    st.token_expires_in = a
                elif kind == "down":
                    st.down = a
                elif kind == "revoke_tokens":
                    st.tokens.clear()
                elif kind == "reset_concurrency":
                    st.max_concurrent = st.open
                elif kind == "kinde_meter":
                    st.kinde_meters[a[0]] = a[1]
                elif kind == "generic_meter":
                    st.generic_meters[a[0]] = a[1]
                elif kind == "remove_entitlement":
                    st.entitlements.get(a[0], {}).pop(a[1], None)
                elif kind == "set_entitlement":
                    cust, feat, lim = a
                    ents = st.entitlements.setdefault(cust, {})
                    if feat in ents:
                        ents[feat][1] = lim
                    else:
                        ents[feat] = ["ent_%d" % st.next_ent, lim]
                        st.next_ent += 1
                elif kind == "set_limit":
                    acct, feat, lim = a
                    st.limits.setdefault(acct, {})[feat] = lim
                elif kind == "remove_limit":
                    st.limits.get(a[0], {}).pop(a[1], None)
        return 200, {"ok": True}

    def state_json():
        with st.lock:
            return {
                "kinde_meters": dict(st.kinde_meters),
                "generic_meters": dict(st.generic_meters),
                "writes": dict(st.writes),
                "tokens_issued": st.tokens_issued,
                "requests": list(st.requests),
                "in_flight": list(st.in_flight.values()),
                "rate_limited_until": st.rate_limited_until,
                "max_concurrent": st.max_concurrent,
            }

    # ---- the APIs (called with st.lock held) -----------------------------

    def token(h, body):
        if h.media_type() != "application/x-www-form-urlencoded":
            return 400, {"error": "invalid_request",
                         "error_description": "expected a form body"}
        try:
            form = urllib.parse.parse_qs(body.decode("utf-8"), keep_blank_values=True,
                                         strict_parsing=False)
        except UnicodeDecodeError:
            return 400, {"error": "invalid_request"}
        f = {k: v[0] for k, v in form.items()}
        cid, csecret = f.get("client_id"), f.get("client_secret")
        auth = h.headers.get("Authorization", "")
        if auth[:6].lower() == "basic ":
            try:
                dec = base64.b64decode(auth[6:].strip(), validate=True).decode("utf-8")
                cid, csecret = [urllib.parse.unquote_plus(x) for x in dec.split(":", 1)]
            except Exception:
                cid = csecret = None
        if (f.get("grant_type") != "client_credentials" or cid is None or csecret is None
                or not hmac.compare_digest(cid.encode(), args.client_id.encode())
                or not hmac.compare_digest(csecret.encode(), args.client_secret.encode())):
            return 401, {"error": "invalid_client"}
        if f.get("audience") != base["url"] + "/api":
            return 400, {"error": "invalid_audience"}
        tok = secrets.token_urlsafe(32)
        now = time.time()
        for t in [t for t, exp in st.tokens.items() if exp <= now]:
            del st.tokens[t]
        st.tokens[tok] = now + args.token_ttl
        st.tokens_issued += 1
        if st.token_expires_in is not None:
            # a hostile or odd expires_in, exactly as given
            return 200, Raw('{"access_token": %s, "token_type": "bearer", "expires_in": %s, '
                            '"scope": %s}' % (json.dumps(tok), st.token_expires_in,
                                              json.dumps(f.get("scope", ""))))
        return 200, {"access_token": tok, "token_type": "bearer",
                     "expires_in": args.token_ttl, "scope": f.get("scope", "")}

    def kinde_authorized(h):
        auth = h.headers.get("Authorization", "")
        if auth[:7].lower() != "bearer ":
            return False
        exp = st.tokens.get(auth[7:].strip())
        return exp is not None and time.time() < exp

    def kinde_write(h, body):
        obj = h.json_body(body)
        agreement = need_str(obj, "customer_agreement_id")
        feature = need_str(obj, "billing_feature_code")
        v = obj.get("meter_value")
        if isinstance(v, str) and DIGITS.match(v):
            value = int(v)
        elif is_int(v) and v >= 0:
            value = v
        elif isinstance(v, float) and v >= 0 and v.is_integer():
            value = int(v)
        else:
            raise BadRequest("meter_value must be a non-negative decimal integer")
        mtype = obj.get("meter_type_code")
        if mtype is None:
            mtype = "absolute"
        if mtype not in ("absolute", "delta"):
            raise BadRequest("meter_type_code must be absolute or delta")
        ts = obj.get("meter_usage_timestamp")
        if ts is not None and not isinstance(ts, str):
            raise BadRequest("meter_usage_timestamp must be a string")
        key = "%s|%s" % (agreement, feature)
        if mtype == "absolute":
            st.kinde_meters[key] = value
        else:
            st.kinde_meters[key] = st.kinde_meters.get(key, 0) + value
        st.writes[key] = st.writes.get(key, 0) + 1
        return 200, {"code": "OK", "message": "Success"}

    def kinde_read(h, body):
        q = h.query_args()
        agreement = need_str(q, "customer_agreement_id")
        feature = need_str(q, "billing_feature_code")
        n = st.kinde_meters.get("%s|%s" % (agreement, feature), 0)
        return 200, {"code": "OK", "customer_agreement_id": agreement,
                     "billing_feature_code": feature, "meter_value": str(n)}

    def kinde_entitlements(h, body):
        q = h.query_args()
        customer = need_str(q, "customer_id")
        size = args.page_size
        if "page_size" in q:
            if not DIGITS.match(q["page_size"]) or int(q["page_size"]) < 1:
                raise BadRequest("page_size must be a positive integer")
            size = int(q["page_size"])
        items = [{"id": eid, "feature_code": feat, "feature_name": feat,
                  "entitlement_limit_max": lim, "entitlement_limit_min": None}
                 for feat, (eid, lim) in st.entitlements.get(customer, {}).items()]
        start = 0
        after = q.get("starting_after")
        if after:
            ids = [e["id"] for e in items]
            if after not in ids:
                raise BadRequest("starting_after is not an entitlement of this customer")
            start = ids.index(after) + 1
        page = items[start:start + size]
        return 200, {"code": "OK", "has_more": start + size < len(items),
                     "entitlements": page}

    def generic_authorized(h, body):
        if args.bearer is not None:
            auth = h.headers.get("Authorization", "")
            if auth[:7].lower() != "bearer " or not hmac.compare_digest(
                    auth[7:].strip().encode(), args.bearer.encode()):
                return False
        if args.hmac_secret is not None:
            ts = h.headers.get("X-Earmark-Timestamp", "").strip()
            sig = h.headers.get("X-Earmark-Signature", "").strip()
            if not DIGITS.match(ts) or abs(time.time() - int(ts)) > HMAC_WINDOW:
                return False
            if not sig.startswith("v1="):
                return False
            msg = ("%s.%s.%s." % (ts, h.command, h.path)).encode() + body
            want = hmac.new(args.hmac_secret.encode(), msg, hashlib.sha256).hexdigest()
            if not hmac.compare_digest(want.encode(), sig[3:].encode()):
                return False
        return True

    def generic_put(h, body):
        obj = h.json_body(body)
        account = need_str(obj, "account")
        feature = need_str(obj, "feature")
        for k in ("customer", "agreement"):
            if obj.get(k) is not None and not isinstance(obj[k], str):
                raise BadRequest("%s must be a string or null" % k)
        cycle = canonical_cycle_start(obj.get("cycle_start"))
        total = obj.get("total")
        if not is_int(total) or total < 0:
            raise BadRequest("total must be an integer >= 0")
        key = "%s|%s|%s" % (account, feature, cycle)
        st.generic_meters[key] = total
        st.writes[key] = st.writes.get(key, 0) + 1
        return 200, {"total": total}

    def generic_get(h, body):
        q = h.query_args()
        key = "%s|%s|%s" % (need_str(q, "account"), need_str(q, "feature"),
                            canonical_cycle_start(q.get("cycle_start")))
        return 200, {"total": st.generic_meters.get(key, 0)}

    def generic_limits(h, body):
        q = h.query_args()
        account = need_str(q, "account")
        return 200, {"limits": [{"feature": f, "limit": lim}
                                for f, lim in st.limits.get(account, {}).items()]}

    HANDLERS = {
        ("POST", "/oauth2/token"): token,
        ("POST", "/api/v1/billing/meter_usage"): kinde_write,
        ("GET", "/api/v1/billing/meter_usage"): kinde_read,
        ("GET", "/api/v1/billing/entitlements"): kinde_entitlements,
        ("PUT", "/generic/meter"): generic_put,
        ("GET", "/generic/meter"): generic_get,
        ("GET", "/generic/limits"): generic_limits,
    }

    def route(h, path, body):
        """The answer to a non-control request, as (status, object, headers)."""
        if path not in ROUTES:
            return 404, {"error": "not_found"}, {}
        if h.command not in ROUTES[path]:
            return 405, {"error": "method_not_allowed"}, {"Allow": ", ".join(ROUTES[path])}
        kinde = path.startswith("/api/")
        if kinde and not kinde_authorized(h):
            return 401, {"code": "UNAUTHORIZED"}, {}
        if path.startswith("/generic/") and not generic_authorized(h, body):
            return 401, {"error": "unauthorized"}, {}
        try:
            status, obj = HANDLERS[(h.command, path)](h, body)
        except BadRequest as e:
            if kinde:
                obj = {"code": "INVALID_REQUEST", "message": str(e)}
            else:
                obj = {"error": "bad_request", "message": str(e)}
            status = 400
        return status, obj, {}

    # ---- HTTP ----------------------------------------------------------

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        # answer headers and body without waiting for the client's ACK
        # (Nagle): a keep-alive client would otherwise wait ~40 ms a request
        disable_nagle_algorithm = True

        def media_type(self):
            return self.headers.get("Content-Type", "").split(";", 1)[0].strip().lower()

        def json_body(self, body):
            if self.media_type() != "application/json":
                raise BadRequest("Content-Type must be application/json")
            try:
                obj = json.loads(body.decode("utf-8"))
            except (UnicodeDecodeError, ValueError):
                raise BadRequest("the body is not valid JSON")
            if not isinstance(obj, dict):
                raise BadRequest("the body must be a JSON object")
            return obj

        def query_args(self):
            query = self.path.split("?", 1)[1] if "?" in self.path else ""
            return {k: v[0] for k, v in
                    urllib.parse.parse_qs(query, keep_blank_values=True).items()}

        def read_body(self):
            """The request body, or None when it is over MAX_BODY (or unreadable)."""
            if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
                chunks, size = [], 0
                while True:
                    line = self.rfile.readline(65537)
                    try:
                        n = int(line.split(b";", 1)[0].strip(), 16)
                    except ValueError:
                        return None
                    if n == 0:
                        while self.rfile.readline(65537) not in (b"\r\n", b"\n", b""):
                            pass        # trailers
                        return b"".join(chunks)
                    size += n
                    if size > MAX_BODY:
                        return None
                    chunks.append(self.rfile.read(n))
                    self.rfile.readline(65537)
            cl = self.headers.get("Content-Length")
            if cl is None:
                return b""
            if not DIGITS.match(cl.strip()) or int(cl) > MAX_BODY:
                return None
            n = int(cl)
            body = self.rfile.read(n) if n else b""
            return body if len(body) == n else None

        def client_gone(self):
            try:
                r, _, _ = select.select([self.connection], [], [], 0)
                if not r:
                    return False
                return self.connection.recv(1, socket.MSG_PEEK) == b""
            except (OSError, ValueError):
                return True

        def wait(self, seconds, watch):
            """Sleep, ending early if watch and the client hangs up (True) or on
            "release" (False)."""
            end = time.monotonic() + seconds
            with st.lock:
                gen = st.release_gen
            while True:
                left = end - time.monotonic()
                if left <= 0:
                    return False
                if watch and self.client_gone():
                    return True
                with st.lock:
                    if st.release_gen != gen:
                        return False
                time.sleep(min(left, 0.05))

        def answer(self, status, obj, headers=None):
            if status in (204, 304):
                body = b""
            elif isinstance(obj, Raw):
                body = obj.data
            else:
                body = json.dumps(obj).encode()
            headers = dict(headers or {})
            interim = headers.pop(INTERIM, None)
            try:
                if interim is not None:
                    # an interim answer (103 Early Hints) with its own headers
                    # before the final one
                    self.send_response_only(103)
                    for k, v in interim.items():
                        self.send_header(k, v)
                    self.end_headers()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                for k, v in headers.items():
                    self.send_header(k, v)
                if self.close_connection:
                    self.send_header("Connection", "close")
                self.end_headers()
                if body:
                    self.wfile.write(body)
                self.wfile.flush()
            except (BrokenPipeError, ConnectionResetError):
                self.close_connection = True    # the client gave up

        def fault(self, path, query):
            """The injected answer (status, obj, headers, hang seconds); status
            None when no rule applies.  Called with st.lock held."""
            r = take_rule(st.fail_rules, self.command, path, query)
            if r:
                obj = {"error": "injected"}
                if r["body_bytes"]:
                    # padded with spaces after the object: still valid JSON
                    text = json.dumps(obj)
                    obj = Raw(text + " " * max(r["body_bytes"] - len(text), 0))
                return r["status"], obj, {}, 0.0
            r = take_rule(st.answer_rules, self.command, path, query)
            if r:
                return r["status"], Raw(r["body"]), dict(r["headers"]), 0.0
            r = take_rule(st.rate_rules, self.command, path, query)
            if r and r["date"]:
                until = int(time.time() + r["reset"])      # an HTTP date has whole seconds
                st.rate_limited_until = until
                return 429, {"error": "rate_limited"}, {
                    "Retry-After": email.utils.formatdate(until, usegmt=True)}, 0.0
            if r:
                st.rate_limited_until = time.time() + r["reset"]
                return 429, {"error": "rate_limited"}, {"RateLimit-Reset": str(r["reset"]),
                                                       "Retry-After": str(r["reset"])}, 0.0
            r = take_rule(st.hang_rules, self.command, path, query)
            return None, None, {}, (r["seconds"] if r else 0.0)

        def handle_request(self):
            """One request; a non-control one counts as open until answered."""
            if self.path.split("?", 1)[0] in CONTROL_PATHS:
                self.handle_one()
                return
            with st.lock:
                st.open += 1
                st.max_concurrent = max(st.max_concurrent, st.open)
            try:
                self.handle_one()
            finally:
                with st.lock:
                    st.open -= 1

        def handle_one(self):
            t = time.time()
            path = self.path.split("?", 1)[0]
            query = self.path.split("?", 1)[1] if "?" in self.path else ""
            body = self.read_body()
            control_path = path in CONTROL_PATHS
            extra = {}
            gone = False
            if body is None:
                self.close_connection = True    # the rest of the body is not read
                status, obj = 413, {"error": "too_large"}
                body = b""
                if control_path:
                    self.answer(status, obj)
                    return
            elif control_path:
                if self.command not in ROUTES[path]:
                    self.answer(405, {"error": "method_not_allowed"},
                                {"Allow": ", ".join(ROUTES[path])})
                    return
                try:
                    if path == "/_control":
                        try:
                            obj = json.loads(body.decode("utf-8"))
                        except (UnicodeDecodeError, ValueError):
                            raise BadRequest("the body is not valid JSON")
                        status, obj = control(obj)
                    elif path == "/_state":
                        status, obj = 200, state_json()
                    else:
                        with st.lock:
                            st.reset()
                        status, obj = 200, {"ok": True}
                except BadRequest as e:
                    status, obj = 400, {"ok": False, "error": str(e)}
                self.answer(status, obj)
                return
            else:
                hang = 0.0
                with st.lock:
                    slow = st.slow_ms / 1000.0
                    if st.down:
                        status, obj = 503, {"error": "down"}
                    else:
                        status, obj, extra, hang = self.fault(path, query)
                # never hold the lock while sleeping
                if hang or slow:
                    with st.lock:
                        st.in_flight[id(self)] = {"method": self.command, "path": path,
                                                  "query": query}
                    if hang:
                        gone = self.wait(hang, True)
                    if slow and not gone:
                        gone = self.wait(slow, True)
                    with st.lock:
                        st.in_flight.pop(id(self), None)
                with st.lock:
                    if status is None:
                        status, obj, extra = route(self, path, body)
            with st.lock:
                st.requests.append({"t": t, "method": self.command, "path": path,
                                    "query": query, "status": status,
                                    "body": body.decode("utf-8", "replace"),
                                    "disconnected": gone})
                with open(args.log, "a") as log:
                    log.write("%.6f %s %s %d\n" % (t, self.command, path, status))
            if gone:
                self.close_connection = True
                return
            self.answer(status, obj, extra)

        do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = handle_request

        def log_message(self, *a):
            pass

    class Server(http.server.ThreadingHTTPServer):
        daemon_threads = True
        # a listen backlog of 5 (the default) drops the SYNs of a client
        # that opens 10 connections at once, which then waits 1 s to retry
        request_queue_size = 128

        def handle_error(self, request, client_address):
            if isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
                return
            super().handle_error(request, client_address)

    server = Server(("127.0.0.1", 0), Handler)
    port = server.server_address[1]
    base["url"] = "http://127.0.0.1:%d" % port
    # write the port atomically: the test polls for the file
    tmp = args.port_file + ".tmp"
    with open(tmp, "w") as f:
        f.write("%d\n" % port)
    os.rename(tmp, args.port_file)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
