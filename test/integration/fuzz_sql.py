#!/usr/bin/env python3
"""test/integration/fuzz_sql.py: the corpus of bad calls that fuzz_sql.sh runs.

    fuzz_sql.py --seed N --calls N --functions FILE --docs DIR --out DIR
                [--errcodes errcodes.h]

Writes, into --out:

  calls.copy    COPY text of fuzz.call (id, fn, cls, refuse, pre, sql): one
                SQL call of one extension function per row; refuse is true
                when an argument is of a class the docs refuse (REFUSED: a
                NULL where NULL means nothing, an empty name, a name of 256
                characters or 1 MB), so the call must fail.  Values of the fixture
                (job and event ids) are markers @@REF:name@@ that the
                harness replaces once the fixture exists; values larger
                than a few kB are fuzz.v('name') lookups.
  vals.copy     COPY text of fuzz.val (name, v): the large values.
  casts.copy    COPY text of fuzz.cast_check (kind, expr): every typed
                literal the corpus uses, so that the harness can prove that
                no argument fails before the function is entered.
  fixture.sql   the state the calls run against: accounts, limits, jobs in
                every state, recorded usage, reports, evidence, inbox events
                in every status, webhook secrets, a key set with good and
                broken keys, handlers, plan limits.
  allowed.copy  COPY text of fuzz.allowed (fn, state): the SQLSTATEs each
                function documents, read from docs/api.md (its error table
                and the function's own section) and docs/inbox.md (its
                SQLSTATE table for the inbox functions, and the function's
                own section or bullet).

Everything comes from one random.Random(seed), the RSA keys of the key set
included, so a seed replays the same corpus (webhook timestamps are taken
from the clock at generation time, so they are "now" on every run).

--functions lists the extension's functions, one per line, as the harness
reads them from the catalog: schema|name|argnames|argtypes|ndefaults|retset.
A function this file has no specific argument kinds for is still fuzzed,
from its argument types.
"""
import argparse
import base64
import datetime
import hashlib
import hmac
import json
import math
import os
import random
import re
import time

# --------------------------------------------------------------------------
# literals
# --------------------------------------------------------------------------

I64_MAX = 2**63 - 1
I64_MIN = -2**63
I32_MAX = 2**31 - 1
I32_MIN = -2**31
REF = "@@REF:%s@@"


def q(s):
    """A SQL string literal (standard_conforming_strings)."""
    return "'" + s.replace("'", "''") + "'"


def b64(b):
    return base64.b64encode(b).decode()


def b64url(b):
    return base64.urlsafe_b64encode(b).rstrip(b"=").decode()


# The classes of bad input the docs refuse in any call: NULL in an argument
# whose NULL means nothing (22004), an empty name (22023), a name of 256
# characters or a 1 MB one (22001).  A call with such an argument must fail;
# the harness keeps what one that succeeds did, and fails.  Other classes
# ("numeric", "timestamp", "odd", ...) hold values that may be valid.
REFUSED = {"null", "empty", "long", "huge"}


class Val:
    """One argument value: its SQL text and the bad-input class it belongs to
    (None for a value that is meant to be valid)."""
    __slots__ = ("sql", "cls")

    def __init__(self, sql, cls=None):
        self.sql = sql
        self.cls = cls


NULL = "NULL"


# --------------------------------------------------------------------------
# RSA (pure Python, deterministic from the seed)
# --------------------------------------------------------------------------

SMALL_PRIMES = [p for p in range(3, 2000) if all(p % d for d in range(2, int(p ** 0.5) + 1))]


def is_probable_prime(n, rnd):
    if n < 2:
        return False
    for p in SMALL_PRIMES:
        if n % p == 0:
            return n == p
    d, s = n - 1, 0
    while d % 2 == 0:
        d //= 2
        s += 1
    for _ in range(24):
        a = rnd.randrange(2, n - 1)
        x = pow(a, d, n)
        if x in (1, n - 1):
            continue
        for _ in range(s - 1):
            x = pow(x, 2, n)
            if x == n - 1:
                break
        else:
            return False
    return True


def gen_prime(rnd, bits):
    while True:
        p = rnd.getrandbits(bits) | (1 << (bits - 1)) | (1 << (bits - 2)) | 1
        if is_probable_prime(p, rnd):
            return p


def rsa_key(rnd, bits):
    e = 65537
    while True:
        p = gen_prime(rnd, bits // 2)
        qq = gen_prime(rnd, bits // 2)
        n = p * qq
        phi = (p - 1) * (qq - 1)
        if p == qq or n.bit_length() != bits or math.gcd(e, phi) != 1:
            continue
        d = pow(e, -1, phi)
        return {"n": n, "e": e, "p": p, "q": qq, "dp": d % (p - 1), "dq": d % (qq - 1),
                "qinv": pow(qq, -1, p)}


def int_bytes(i):
    return i.to_bytes(max(1, (i.bit_length() + 7) // 8), "big")


def rs256_sign(key, msg):
    digest_info = bytes.fromhex("3031300d060960864801650304020105000420") + hashlib.sha256(msg).digest()
    k = (key["n"].bit_length() + 7) // 8
    em = b"\x00\x01" + b"\xff" * (k - len(digest_info) - 3) + b"\x00" + digest_info
    m = int.from_bytes(em, "big")
    m1 = pow(m, key["dp"], key["p"])
    m2 = pow(m, key["dq"], key["q"])
    h = (key["qinv"] * (m1 - m2)) % key["p"]
    return (m2 + h * key["q"]).to_bytes(k, "big")


# --------------------------------------------------------------------------
# the documented SQLSTATEs
# --------------------------------------------------------------------------

FN_RE = re.compile(r"earmark[._][a-z_]+")
CODE_RE = re.compile(r"(?<![0-9A-Za-z])(EM[0-9]{3}|[0-9][0-9A-Z]{4})(?![0-9A-Za-z])")
RANGE_RE = re.compile(r"`?(EM)([0-9]{3})`?\s+to\s+`?EM([0-9]{3})`?")


def strip_fences(text):
    out, fenced = [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if not fenced:
            out.append(line)
    return out


def codes_in(text, valid, prose=False):
    """The SQLSTATEs a piece of the docs names.  In prose, a class's generic
    code (22000, 40000, ...) is not taken: there such a number is an amount
    ("the job needs 40000 and 20000 is left"); the error tables name them."""
    found = set()
    for m in RANGE_RE.finditer(text):
        for i in range(int(m.group(2)), int(m.group(3)) + 1):
            found.add("EM%03d" % i)
    for m in CODE_RE.finditer(text):
        c = m.group(1)
        if prose and c.endswith("000") and not c.startswith("EM") and "`%s`" % c not in text:
            continue
        if c.startswith("EM") or c in valid or not valid:
            found.add(c)
    return found


def sections(lines):
    """(heading, [lines]) for every markdown heading."""
    cur, body, out = None, [], []
    for line in lines:
        if re.match(r"^#{1,6} ", line):
            if cur is not None:
                out.append((cur, body))
            cur, body = line, []
        else:
            body.append(line)
    if cur is not None:
        out.append((cur, body))
    return out


def blocks(body):
    """Paragraphs and list items of a section."""
    out, cur = [], []
    for line in body:
        if not line.strip() or re.match(r"^\s*[-*] ", line) or line.startswith("|"):
            if cur:
                out.append(" ".join(cur))
            cur = []
            if line.strip():
                cur = [line]
            if line.startswith("|"):
                out.append(line)
                cur = []
            continue
        cur.append(line)
    if cur:
        out.append(" ".join(cur))
    return out


def table_rows(body):
    rows = []
    for line in body:
        if line.startswith("|") and not re.match(r"^\|\s*-", line):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            rows.append(cells)
    return rows[1:]  # without the header


def documented_states(docs_dir, fns, arg_types, valid):
    """fn -> {SQLSTATE: where it is documented}"""
    api = strip_fences(open(os.path.join(docs_dir, "api.md"), encoding="utf-8").read())
    inbox = strip_fences(open(os.path.join(docs_dir, "inbox.md"), encoding="utf-8").read())
    allowed = {f: {} for f in fns}

    def add(f, codes, where):
        if f in allowed:
            for c in codes:
                allowed[f].setdefault(c, where)

    api_secs = sections(api)
    inbox_fns = set()
    for head, body in api_secs:
        if "webhook inbox" in head.lower():
            for b in body:
                if b.startswith("|"):
                    inbox_fns |= set(FN_RE.findall(b.split("|")[1]))
    inbox_fns.add("earmark.apply_plan_change")

    # 1. the error table of api.md
    for head, body in api_secs:
        if head.strip() != "## Errors":
            continue
        for cells in table_rows(body):
            if len(cells) < 2:
                continue
            codes = codes_in(cells[0], valid)
            by = cells[1]
            named = set(FN_RE.findall(by))
            if named:
                targets = named
            elif by.startswith("all that take names"):
                targets = {f for f in fns if "text" in arg_types.get(f, [])}
            elif by.startswith("all") or by.startswith("any"):
                targets = set(fns)
            elif "inbox" in by:
                targets = inbox_fns
            else:
                targets = set()
            for f in targets:
                add(f, codes, "api.md errors table")

    # 2. inbox.md's SQLSTATE table: the inbox functions
    for head, body in sections(inbox):
        if head.startswith("## SQLSTATEs"):
            for cells in table_rows(body):
                for f in inbox_fns:
                    add(f, codes_in(cells[0], valid), "inbox.md SQLSTATE table")

    # 3. each function's own section (or its own bullet in a shared one)
    for doc, secs in (("api.md", api_secs), ("inbox.md", sections(inbox))):
        for head, body in secs:
            head_fns = set(FN_RE.findall(head))
            if not head_fns:
                continue
            for b in blocks(body):
                m = re.match(r"^\s*(?:[-*]\s+)?`(earmark[._][a-z_]+)\(", b)
                targets = {m.group(1)} if m else head_fns
                for f in targets:
                    add(f, codes_in(b, valid, prose=True), "%s %s" % (doc, head.strip("# ").strip()))

    # 4. the 0.2.0 forms of the account-first functions: what api.md's
    # section on moving from 0.2.0 says of them (the blocks that name them)
    for head, body in api_secs:
        if "0.2.0" not in head:
            continue
        for b in blocks(body):
            named = set(FN_RE.findall(b))
            for f, name in V020.items():
                if name in named:
                    add(f, codes_in(b, valid, prose=True), "api.md %s" % head.strip("# ").strip())
    return allowed


def valid_sqlstates(errcodes_h):
    valid = set()
    try:
        for line in open(errcodes_h, encoding="utf-8"):
            m = re.search(r"MAKE_SQLSTATE\('(.)','(.)','(.)','(.)','(.)'\)", line)
            if m:
                valid.add("".join(m.groups()))
    except OSError:
        pass
    return valid


# --------------------------------------------------------------------------
# the corpus
# --------------------------------------------------------------------------

class Corpus:
    def __init__(self, seed, now):
        self.r = random.Random(seed)
        self.now = now
        self.vals = {}          # name -> text (fuzz.val)
        self.casts = set()      # (type, sql) to check before the run
        self.uniq = 0
        self.token_pool = []
        try:
            import cryptography.hazmat.primitives.asymmetric.rsa  # noqa: F401
            self.fast_rsa = {}
        except ImportError:
            self.fast_rsa = None
        self.setup_keys()
        self.setup_vals()

    # ---- helpers ------------------------------------------------------------
    def pick(self, seq):
        return seq[self.r.randrange(len(seq))]

    def u(self):
        self.uniq += 1
        return self.uniq

    def big(self, name, text):
        self.vals[name] = text
        return "fuzz.v(%s)" % q(name)

    ASCII = [chr(i) for i in range(32, 127)]

    def rand_ascii(self, n):
        return "".join(self.r.choices(self.ASCII, k=n))

    def text(self, s):
        """SQL text of a string: a literal, or a fuzz.v() lookup when it is large."""
        if len(s) < 4096:
            return q(s)
        name = "h_" + hashlib.sha1(s.encode()).hexdigest()
        self.vals[name] = s
        return "fuzz.v(%s)" % q(name)

    def rand_unicode(self, n):
        ranges = ((1, 0x80), (0x80, 0x800), (0x800, 0xD800), (0xE000, 0x10000), (0x10000, 0x110000))
        out = []
        for lo, hi in self.r.choices(ranges, k=n):
            out.append(chr(lo + self.r.getrandbits(20) % (hi - lo)))
        return "".join(out)

    def rand_control(self, n):
        return "".join(chr(self.pick(list(range(1, 32)) + [0x7f, 0x85, 0x2028, 0x2029, 0x202e, 0xfeff, 0xfffd, 0x200b]))
                       for _ in range(n))

    # ---- keys and secrets -----------------------------------------------------
    def setup_keys(self):
        r = self.r
        self.k1 = rsa_key(r, 2048)
        self.k2 = rsa_key(r, 2048)
        self.small = rsa_key(r, 512)
        self.sec1 = bytes(r.getrandbits(8) for _ in range(24))
        self.sec2a = bytes(r.getrandbits(8) for _ in range(32))
        self.sec2b = bytes(r.getrandbits(8) for _ in range(64))
        self.sec_other = bytes(r.getrandbits(8) for _ in range(32))
        n1 = b64url(int_bytes(self.k1["n"]))
        e1 = b64url(int_bytes(self.k1["e"]))

        def key(kid, **kw):
            d = {"kty": "RSA", "kid": kid, "use": "sig", "alg": "RS256", "n": n1, "e": e1}
            for k, v in kw.items():
                if v is None:
                    d.pop(k, None)
                else:
                    d[k] = v
            return d
        huge_n = (1 << 8199) | r.getrandbits(8199) | 1
        big_n = (1 << 8191) | r.getrandbits(8191) | 1
        self.jwks = [
            key("fz-k1"),
            key("fz-k2", n=b64url(int_bytes(self.k2["n"]))),
            key("fz-noalg", alg=None, use=None),
            key("fz-ec", kty="EC"),
            key("fz-kty-missing", kty=None),
            key("fz-rs512", alg="RS512"),
            key("fz-enc", use="enc"),
            key("fz-no-n", n=None),
            key("fz-no-e", e=None),
            key("fz-bad-n", n="!!not-base64!!"),
            key("fz-std-n", n=b64(int_bytes(self.k1["n"]))),
            key("fz-pad-n", n=b64url(int_bytes(self.k1["n"])) + "=="),
            key("fz-n-num", n=12345),
            key("fz-small", n=b64url(int_bytes(self.small["n"]))),
            key("fz-huge", n=b64url(int_bytes(huge_n))),
            key("fz-8192", n=b64url(int_bytes(big_n))),
            key("fz-zero-n", n="AAAAAAAA"),
            key("fz-lead0", n=b64url(b"\x00\x00" + int_bytes(self.k1["n"]))),
            key("fz-e-even", e=b64url(b"\x02")),
            key("fz-e-one", e=b64url(b"\x01")),
            key("fz-e-9", e=b64url(b"\x01" * 9)),
            key("fz-e-8", e=b64url(b"\x7f" * 7 + b"\x01")),
            key("fz-e-empty", e=""),
            key("fz-dup", n=b64url(int_bytes(self.k2["n"]))),
            key("fz-dup"),
            {"kid": 42, "kty": "RSA", "n": n1, "e": e1},
            "junk", 17, None, [], {},
            key("k" * 255),
            key("fz-\u00e9\u202e\u0001"),
        ]
        self.kids = [k["kid"] for k in self.jwks if isinstance(k, dict) and isinstance(k.get("kid"), str)]

    # ---- large values -----------------------------------------------------------
    def setup_vals(self):
        r = self.r
        self.V_A1M = self.big("a1m", "a" * (1 << 20))
        self.V_A1M1 = self.big("a1m1", "a" * ((1 << 20) + 1))
        self.V_E1M = self.big("e1m", "\u00e9" * (1 << 19))
        self.V_U64K = self.big("u64k", self.rand_unicode(65536))
        self.V_CTL8K = self.big("ctl8k", self.rand_control(8192))
        self.V_A4096 = self.big("a4096", "a" * 4096)
        self.V_A4097 = self.big("a4097", "a" * 4097)
        deep = "[" * 3000 + "]" * 3000
        self.V_DEEP = self.big("json_deep", deep)
        self.casts.add(("jsonb", "fuzz.v('json_deep')::jsonb"))
        wide = json.dumps({"type": "fz.wide", **{"k%d" % i: i for i in range(20000)}})
        self.V_WIDE = self.big("json_wide", wide)
        self.casts.add(("jsonb", "fuzz.v('json_wide')::jsonb"))
        bigstr = json.dumps({"type": "fz.big", "s": "x" * 1000000})
        self.V_BIGSTR = self.big("json_bigstr", bigstr)
        self.casts.add(("jsonb", "fuzz.v('json_bigstr')::jsonb"))
        bignum = '{"type": "fz.num", "n": 1' + "0" * 100000 + "}"
        self.V_BIGNUM = self.big("json_bignum", bignum)
        self.casts.add(("jsonb", "fuzz.v('json_bignum')::jsonb"))
        self.big_text_vals = [self.V_A1M, self.V_A1M1, self.V_E1M, self.V_U64K, self.V_CTL8K,
                              self.V_A4096, self.V_A4097]

    # ---- value pools --------------------------------------------------------------
    def bad_text(self, allow_huge=True):
        """A text that is wrong as a name, key, source or free text."""
        r = self.r
        choices = [
            ("null", lambda: NULL),
            ("empty", lambda: "''"),
            ("blank", lambda: "' '"),
            ("blank", lambda: q("\t")),
            ("long", lambda: q("x" * 256)),
            ("long", lambda: q("\u00e9" * 256)),
            ("long", lambda: q("\U0001d11e" * 256)),
            ("long", lambda: q("e\u0301" * 128)),
            ("long", lambda: q(self.rand_ascii(r.randrange(256, 3000)))),
            ("edge", lambda: q("x" * 255)),
            ("edge", lambda: q("\u00e9" * 255)),
            ("edge", lambda: q("\U0001d11e" * 255)),
            ("control", lambda: q(self.rand_control(r.randrange(1, 40)))),
            ("control", lambda: q("\x1b[31mred\x1b[0m")),
            ("control", lambda: q("a\nb\rc\td\x7f")),
            ("unicode", lambda: q(self.rand_unicode(r.randrange(1, 60)))),
            ("unicode", lambda: q("\u202eevil")),
            ("unicode", lambda: q("\ufeff")),
            ("unicode", lambda: q("\ufffd\ufffd")),
            ("odd", lambda: q("'; DROP TABLE earmark.account; --")),
            ("odd", lambda: q("%s%s%s%n%x")),
            ("odd", lambda: q("\\0\\x00\\u0000")),
            ("odd", lambda: q("null")),
            ("odd", lambda: q("NULL")),
            ("odd", lambda: q('"quoted"')),
            ("odd", lambda: q("$$")),
            ("odd", lambda: q(self.rand_ascii(r.randrange(1, 40)))),
        ]
        if allow_huge:
            choices += [("huge", lambda: self.pick(self.big_text_vals))] * 3
        cls, make = self.pick(choices)
        return Val(make(), cls)

    def name_good(self, kind):
        r = self.r
        if kind == "account":
            return Val(q(self.pick(["fz_a", "fz_a", "fz_anch", "fz_unl", "fz_zero", "fz_nolimit", "fz_esc",
                                    "fz_huge", "fz_new_%d" % self.u(), "\u00e9t\u00e9"])))
        if kind == "feature":
            return Val(q(self.pick(["default", "default", "f1", "f2", "nofeature"])))
        if kind == "key":
            return Val(q(self.pick(["k-%d" % self.u(), "k-%d" % self.u(), "running", "completed", "click-1",
                                    "f1job"])))
        if kind == "provider":
            return Val(q(self.pick(["cus_%d" % self.u(), "cus_fz_a", "agr_fz_a"])))
        if kind == "source":
            return Val(q(self.pick(["fz", "fz_src", "fz_src2", "kinde", "src_%d" % self.u()])))
        if kind == "event_type":
            return Val(q(self.pick(["fz.type", "customer.plan_changed", "fz.handled", "t_%d" % self.u()])))
        if kind == "plan":
            return Val(q(self.pick(["pro", "free", "plan_%d" % self.u()])))
        return Val(q("name_%d" % self.u()))

    def bigint(self, good=True):
        if good:
            return Val(str(self.pick([1, 1, 10, 100, 1000, 40000, 99999])))
        v = self.pick([0, -1, -2, I64_MIN, I64_MAX, I64_MAX - 1, I64_MIN + 1, 10**15, 10**15 + 1,
                       -10**15, -10**15 - 1, 2**31, 2**31 - 1, -2**31, 2**32, 2**62, 2**62 + 1,
                       self.r.randrange(I64_MIN, I64_MAX)])
        return Val("(%d)::bigint" % v, "numeric")

    def int4(self, good_values, bad=True):
        if not bad:
            return Val(str(self.pick(good_values)))
        v = self.pick([0, -1, 1, 255, 256, 257, 1000, I32_MAX, I32_MIN, I32_MAX - 1,
                       self.r.randrange(I32_MIN, I32_MAX)])
        return Val("(%d)::int" % v, "numeric")

    TS_BAD = [
        "'infinity'", "'-infinity'",
        "'294276-12-31 23:59:59.999999+00'", "'294276-12-31 00:00:00+00'", "'294276-01-01 00:00:00+00'",
        "'294276-12-28 12:00:00+00'", "'294246-01-01 00:00:00+00'",
        "'4714-11-24 00:00:00+00 BC'", "'4714-11-30 00:00:00+00 BC'", "'4713-01-15 00:00:00+00 BC'",
        "'0001-01-01 00:00:00+00'", "'1970-01-01 00:00:00+00'", "'epoch'", "'2000-01-01 00:00:00+00'",
        "'9999-12-31 23:59:59+00'", "'10000-01-01 00:00:00+00'", "'2024-02-29 12:00:00+00'",
        "'2026-01-31 23:59:59.999999+00'", "'2026-03-31 12:00:00+00'", "'2026-10-31 23:00:00-04'",
        "'2026-03-01 00:00:00+14'", "'2026-01-29 00:00:00+00'", "'2026-01-28 23:59:59.999999+00'",
        "'2026-11-20 15:29:00+00'", "now() + interval '4 minutes'", "now() + interval '6 minutes'",
        "now() + interval '1 year'", "now() - interval '40 days'", "now() - interval '1000 years'",
        "clock_timestamp()", "now()",
    ]

    def timestamptz(self):
        v = self.pick(self.TS_BAD + [None, None])
        if v is None:
            # a random time between the years 1 and 9999
            t = datetime.datetime(1, 1, 1) + datetime.timedelta(
                seconds=self.r.randrange(0, 315537897599), microseconds=self.r.randrange(0, 1000000))
            v = "'%04d-%02d-%02d %02d:%02d:%02d.%06d+00'" % (t.year, t.month, t.day, t.hour, t.minute,
                                                            t.second, t.microsecond)
        sql = v if v.startswith("now") or v.startswith("clock") else "%s::timestamptz" % v
        self.casts.add(("timestamptz", sql))
        return Val(sql, "timestamp")

    INTERVALS = [
        "'0'", "'0 seconds'", "'-1 second'", "'1 microsecond'", "'-1 microsecond'", "'1 mon -30 days'",
        "'1 mon -31 days'", "'-1 mon 31 days'", "'1 day -86400 seconds'", "'1 day -86399 seconds'",
        "'178000000 years'", "'-178000000 years'", "'170000000 years'", "'290000 years'", "'300000 years'",
        "'2147483647 days'", "'-2147483648 days'", "'2147483647 mons'", "'-2147483648 mons'",
        "'2562047788 hours'", "'-2562047788 hours'", "'2562047788:00:54.775807'",
        "'-2562047788:00:54.775807'", "'1 year'", "'100 years'", "'2 minutes'", "'1 second'",
        "'30 seconds'", "'P1Y2M3DT4H5M6S'", "'P-1D'", "'@ 1 minute ago'",
    ]

    def interval(self):
        sql = "%s::interval" % self.pick(self.INTERVALS)
        self.casts.add(("interval", sql))
        return Val(sql, "interval")

    # ---- jsonb payloads ---------------------------------------------------------------
    TIME_STRINGS = [
        "", " ", "zz", "now", "today", "tomorrow", "yesterday", "epoch", "infinity", "-infinity",
        "allballs", "J2451545", "294277-01-01", "294276-12-31T23:59:59.9999999999+00", "4714-11-23 BC",
        "4714-11-24 00:00:00+00 BC", "2026-13-01", "2026-02-30", "2026-00-10", "1.5", "1700000000",
        "2026-10-21T02:29:24.481368869+11:00", "2026-10-21T02:29:24.999999999+11:00",
        "2026-10-21T02:29:24.9999995+11:00", "2026-10-21T02:29:24." + "9" * 400 + "Z",
        "2026-01-01 00:00:00 America/New_York", "2026-01-01 00:00 +99:00", "2026-01-01 00:00 +15:59",
        "2026-01-01 00:00 Mars/Olympus", "-1-01-01", "0000-01-01", "2026-01-01T24:00:00Z",
        "2026-01-01T23:59:60Z", "2026-W01-1", "2026-001", "\u0662\u0660\u0662\u0666-01-01",
        "2026-10-21T02:29:23.403633+11:00", "2026-10-21", "99999-01-01", "2026-1-1 1:1:1",
        "2026-10-21T02:29:23,5Z", "2026-10-21T02:29:23.Z", "2026-10-21T02:29:23..5Z", "1 2 3",
    ]

    def json_time_value(self):
        r = self.r
        c = r.randrange(10)
        if c < 7:
            return self.pick(self.TIME_STRINGS)
        return self.pick([None, True, 1700000000, 1.5e300, -1, [], {}, {"t": "2026-01-01"}, "x" * 300])

    def payload_obj(self):
        r = self.r
        d = {}
        if r.random() < 0.7:
            d["type"] = self.pick(["fz.type", "customer.plan_changed", "", "t" * 300, 1, None, ["a"]])
        for key in ("event_timestamp", "timestamp", "occurred_at"):
            if r.random() < 0.4:
                d[key] = self.json_time_value()
        if r.random() < 0.3:
            d["data"] = self.pick([{"plan": {"key": "pro"}, "customer_id": "cus_fz_a"},
                                   {"plan": {"key": None}}, {"plan": "pro"}, [], "x", {"customer_id": 7}])
        if r.random() < 0.2:
            d[self.rand_unicode(r.randrange(1, 20))] = self.rand_unicode(r.randrange(0, 50))
        return d

    def jsonb(self):
        r = self.r
        c = r.randrange(20)
        if c < 12:
            text = json.dumps(self.payload_obj(), ensure_ascii=r.random() < 0.5)
        elif c == 12:
            text = self.pick(["[]", "null", "0", '"str"', "true", "1e1000", "-0", "[{}]", '{"": ""}',
                              '{"a": {"b": {"c": {"d": []}}}}', '"\\ud83d\\ude00"'])
        elif c == 13:
            return Val("fuzz.v('json_deep')::jsonb", "big-json")
        elif c == 14:
            return Val("fuzz.v('json_wide')::jsonb", "big-json")
        elif c == 15:
            return Val("fuzz.v('json_bigstr')::jsonb", "big-json")
        elif c == 16:
            return Val("fuzz.v('json_bignum')::jsonb", "big-json")
        elif c == 17:
            return Val(NULL, "null")
        else:
            text = json.dumps({"type": "fz.type", "event_timestamp": self.pick(self.TIME_STRINGS),
                               "nested": [[[[self.rand_unicode(5)]]]]}, ensure_ascii=False)
        sql = "%s::jsonb" % q(text)
        self.casts.add(("jsonb", sql))
        return Val(sql, "jsonb")

    # ---- Standard Webhooks --------------------------------------------------------------
    def wh_body_good(self):
        return json.dumps({"type": "fz.signed", "timestamp": "2026-10-21T02:29:23.403633+11:00",
                           "data": {"n": self.u()}})

    def wh_body_bad(self):
        r = self.r
        c = r.randrange(14)
        return self.pick([
            "", "{", "[]", '"x"', "null", "{}", '{"type": 1}', '{"type": ""}', '{"type": null}',
            json.dumps({"type": "t" * 256}), json.dumps({"type": "\u00e9" * 255}),
            '{"type": "fz.signed", "event_timestamp": %s}' % json.dumps(self.json_time_value()),
            '{"type": "fz.signed", "s": "\\u0000"}', '{"type": "fz.signed", "s": "\\ud800"}',
            '{"type": "fz.signed", "n": 1e1000000}', "[" * 20000 + "]" * 20000,
            '{"type": "fz.signed"} trailing', "\ufeff{\"type\": \"x\"}", '{"type": "a", "type": "b"}',
            json.dumps({"type": "fz.signed", "x": self.rand_unicode(r.randrange(0, 200))}, ensure_ascii=False),
            self.rand_unicode(r.randrange(1, 100)),
        ]) if c < 13 else json.dumps(self.payload_obj(), ensure_ascii=False)

    def wh_sig_entries(self, mac):
        """webhook-signature header text around a correct MAC (or None)."""
        r = self.r
        good = "v1," + b64(mac) if mac is not None else "v1," + b64(bytes(32))
        c = r.randrange(24)
        if c < 8:
            return good, None
        if c == 8:
            return good.rstrip("="), None                          # unpadded: still valid
        bad = [
            "", " ", "v1,", "v1", "v1,=", "v1," + b64(bytes(31)), "v1," + b64(bytes(33)),
            "v1," + b64url(mac or bytes(32)), "v1," + b64(mac or bytes(32))[:-2] + "A=",
            "v1a," + b64(bytes(64)), "v2," + b64(bytes(32)), "V1," + b64(bytes(32)),
            "v1;" + b64(bytes(32)), "v1, " + b64(bytes(32)), good + "\t" + good,
            good.replace("v1,", "v1,,"), "  " + good + "  ", good + " v1a,abc v2,xyz",
            "v1," + b64(bytes(32)) + " " + good, good + " v1,!!!", "\u3000" + good,
            " ".join("v1," + b64(bytes([i]) * 32) for i in range(r.randrange(2, 91))) + " " + good,
            "v1," + "A" * r.randrange(0, 200), "v1," + self.rand_ascii(44),
        ]
        return self.pick(bad), "webhook"

    def wh_ts(self):
        r = self.r
        now = self.now
        c = r.randrange(24)
        if c < 10:
            return str(now), None
        return self.pick([
            "", " ", "0", "-1", "+%d" % now, "%d.5" % now, " %d" % now, "%d " % now, "0%d" % now,
            str(now - 300), str(now + 300), str(now - 301), str(now + 301), str(now - 100000),
            "9" * 12, "9" * 13, "1" * 12, "0" * 12, "0" * 64, "1" * 65, "1e9", "0x65f0a1b2",
            "\u0661\u0667\u0660\u0660", str(now) + "\n", self.rand_ascii(r.randrange(1, 20)),
        ]), "webhook"

    def signed_call(self, fn):
        """(args dict, cls): receive_signed or signature_valid, signed over what is sent."""
        r = self.r
        cls = None
        # the secret
        if fn == "earmark_inbox_receive_signed":
            src = self.pick(["fz_src", "fz_src", "fz_src2", "fz_src2", "fz_nosecret", "fz_badsecret"])
            key = {"fz_src": self.sec1, "fz_src2": self.pick([self.sec2a, self.sec2b])}.get(src, self.sec_other)
        else:
            key = self.pick([self.sec1, self.sec2a, self.sec2b])
        wid = self.pick(["msg_%d" % self.u(), "msg_%d" % self.u(), "\u00e9" * 255, "id with space",
                         "x" * 255])
        ts, c = self.wh_ts()
        cls = cls or c
        body = self.wh_body_good() if r.random() < 0.55 else self.wh_body_bad()
        if body and not body.startswith("{\"type\": \"fz.signed\", \"timestamp\""):
            cls = cls or "webhook"
        mac = hmac.new(key, ("%s.%s.%s" % (wid, ts, body)).encode(), hashlib.sha256).digest()
        if r.random() < 0.15:
            mac = hmac.new(self.sec_other, ("%s.%s.%s" % (wid, ts, body)).encode(), hashlib.sha256).digest()
            cls = cls or "webhook"
        sig, c = self.wh_sig_entries(mac)
        cls = cls or c
        # tamper after signing
        if r.random() < 0.1:
            body = body + " "
            cls = cls or "webhook"
        args = {}
        if fn == "earmark_inbox_receive_signed":
            args["source"] = Val(q(src))
        else:
            sec = self.pick([
                "whsec_" + b64(key), "whsec_" + b64(key), b64(key), "whsec_" + b64(key).rstrip("="),
                "whsec_" + b64url(key), "whsec_", "whsec_!!", "", "whsec_" + b64(bytes(700)),
                "A" * 1025, "whsec_" + b64(key) + "\n", "whsec_=", "whsec_QQ==", "whsec_QR==",
            ])
            if sec != "whsec_" + b64(key):
                cls = cls or "webhook"
            args["secret"] = Val(q(sec))
        args["webhook_id"] = Val(q(wid))
        args["webhook_timestamp"] = Val(q(ts))
        args["webhook_signature"] = Val(self.text(sig))
        args["body"] = Val(self.text(body))
        if fn != "earmark_inbox_receive_signed":
            at = self.pick([None, None, None, "now()"] + self.TS_BAD)
            if at is None:
                args["at"] = Val("to_timestamp(%d)" % int(ts) if ts.isdigit() and len(ts) < 12 else "now()")
            elif at == "now()":
                args["at"] = Val("now()")
            else:
                sql = at if at.startswith("now") or at.startswith("clock") else "%s::timestamptz" % at
                self.casts.add(("timestamptz", sql))
                args["at"] = Val(sql, "timestamp")
                cls = cls or "timestamp"
        # big pieces
        if r.random() < 0.03:
            which = self.pick(["body", "webhook_signature", "webhook_timestamp", "webhook_id"])
            args[which] = Val(self.pick([self.V_A1M, self.V_A1M1, self.V_A4096, self.V_A4097, self.V_E1M]), "big")
            cls = "big"
        if r.random() < 0.02:
            # a signed body of exactly 1 MB (the most accepted) or one byte more
            size = self.pick([1048576, 1048577])
            big_body = '{"type": "fz.signed", "pad": "' + "p" * (size - 32) + '"}'
            wid2 = "msg_big_%d" % self.u()
            mac = hmac.new(key, ("%s.%s.%s" % (wid2, str(self.now), big_body)).encode(), hashlib.sha256).digest()
            args["webhook_id"] = Val(q(wid2))
            args["webhook_timestamp"] = Val(q(str(self.now)))
            args["webhook_signature"] = Val(q("v1," + b64(mac)))
            cls = "huge" if size > 1048576 else "edge"
            args["body"] = Val(self.text(big_body), cls)
        return args, cls

    # ---- Kinde tokens ----------------------------------------------------------------------
    def claims(self):
        r = self.r
        d = {"type": "fz.kinde", "event_id": "ev_%d" % self.u(),
             "event_timestamp": "2026-10-21T02:29:23.403633+11:00",
             "data": {"customer_id": "cus_fz_a"}}
        bad = False
        for _ in range(r.randrange(0, 3)):
            bad = True
            c = r.randrange(12)
            if c == 0:
                d.pop("type", None)
            elif c == 1:
                d["type"] = self.pick([1, "", "t" * 256, None, {"a": 1}, "\u00e9" * 255, self.rand_control(5)])
            elif c == 2:
                d["exp"] = self.pick([1, 0, -1, self.now - 1, self.now + 3600, 2**31, 2**63, 1e308,
                                      "9999999999", None, True, [], {}, 1.5e9, self.now + 0.5])
            elif c == 3:
                d["event_id"] = self.pick([1, "", "e" * 256, None, "\u00e9" * 255, []])
            elif c == 4:
                d["event_timestamp"] = self.json_time_value()
            elif c == 5:
                d.pop("event_timestamp", None)
                d["timestamp"] = self.json_time_value()
            elif c == 6:
                d["data"] = self.pick(["x", [], None, {"customer_id": 5}, {"customer_id": ""},
                                       {"customer_id": "c" * 256}, {"customer_id": "nobody"},
                                       {"customer_id": "cus_fz_a", "plan": {"key": "pro"}}])
            elif c == 7:
                d[self.rand_unicode(r.randrange(1, 10))] = self.rand_unicode(r.randrange(1, 30))
            elif c == 8:
                d["exp"] = self.now + 3600
            elif c == 9:
                d["nbf"] = 2**40
            elif c == 10:
                d["type"] = "customer.plan_changed"
            else:
                d["event_timestamp"] = "294277-01-01"
        text = json.dumps(d, ensure_ascii=r.random() < 0.5).encode()
        if r.random() < 0.12:
            bad = True
            text = self.pick([
                b"", b"{", b"[]", b"null", b'"x"', b"not json", b"\xff\xfe{}", b'{"type": "a\x00b"}',
                b'{"type": "\\u0000"}', b'{"type": "a"}\x00', b"[" * 30000 + b"]" * 30000,
                b'{"type": "\xc3\x28"}', b'{"type": "\xed\xa0\x80"}', b'{"type": "\xf4\x90\x80\x80"}',
                b'{"type": "x", "n": 1e1000000}', b'{"type": "x", "exp": 1e1000000}',
                b'{"type": "x", "exp": -1e1000000}', b'{"type": "x", "exp": 1e-1000000}',
                bytes(r.getrandbits(8) for _ in range(r.randrange(1, 200))),
            ])
        return text, bad

    def header(self):
        r = self.r
        h = {"alg": "RS256", "kid": "fz-k1", "typ": "JWT"}
        bad = False
        c = r.randrange(30)
        if c < 14:
            pass
        elif c < 18:
            h["kid"] = self.pick(self.kids)
        else:
            bad = True
            c2 = r.randrange(14)
            if c2 == 0:
                h["alg"] = self.pick(["none", "HS256", "RS512", "rs256", "", "ES256", "RS256 ", "PS256"])
            elif c2 == 1:
                h["alg"] = self.pick([1, None, [], {"a": 1}, True])
            elif c2 == 2:
                h.pop("alg")
            elif c2 == 3:
                h.pop("kid")
            elif c2 == 4:
                h["kid"] = self.pick([1, None, "", "k" * 256, "nope", "fz-k1 ", [], "\u00e9" * 255])
            elif c2 == 5:
                h["crit"] = self.pick([["exp"], [], "x", None, {}])
            elif c2 == 6:
                return self.pick([b"", b"[]", b"null", b"{", b"\xff", b'{"alg":"RS256","kid":"fz-k1"}\x00',
                                  b'{"alg":"RS\\u0000256","kid":"fz-k1"}', b"[" * 30000,
                                  b'{"alg":"RS256","kid":"\xc3\x28"}']), True
            elif c2 == 7:
                h["pad"] = "p" * r.randrange(1000, 100000)
            elif c2 == 8:
                h["alg"] = "RS256"
                h["kid"] = self.pick(self.kids)
                h["x5u"] = "http://127.0.0.1:1/x"
            elif c2 == 9:
                h = {"kid": "fz-k1", "alg": "RS256", "alg ": "none"}
            elif c2 == 10:
                text = b'{"alg":"none","alg":"RS256","kid":"fz-k1"}'
                return text, True
            elif c2 == 11:
                text = b'{"alg":"RS256","alg":"none","kid":"fz-k1"}'
                return text, True
            elif c2 == 12:
                h["jku"] = "http://127.0.0.1:1/jwks"
            else:
                h = {self.rand_unicode(3): self.rand_unicode(5)}
        return json.dumps(h, ensure_ascii=r.random() < 0.5).encode(), bad

    def token(self):
        """A compact JWS, or something close to one; (text, bad)."""
        r = self.r
        if len(self.token_pool) < self.TOKEN_POOL or r.random() < 0.02:
            hdr, bad_h = self.header()
            pl, bad_p = self.claims()
            signing_input = (b64url(hdr) + "." + b64url(pl)).encode()
            key = self.k1
            bad = bad_h or bad_p
            if r.random() < 0.08:
                key = self.k2
                bad = True
            sig = self.sign(key, signing_input)
            if len(self.token_pool) < self.TOKEN_POOL:
                self.token_pool.append((signing_input, sig, bad))
        else:
            signing_input, sig, bad = self.pick(self.token_pool)
        tok = signing_input.decode() + "." + b64url(sig)
        if r.random() < 0.35:
            bad = True
            c = r.randrange(22)
            parts = tok.split(".")
            if c == 0:
                tok = parts[0] + "." + parts[1]
            elif c == 1:
                tok = parts[0] + "." + parts[1] + "."
            elif c == 2:
                tok = tok + "." + parts[2]
            elif c == 3:
                tok = "." + parts[1] + "." + parts[2]
            elif c == 4:
                tok = parts[0] + ".." + parts[2]
            elif c == 5:
                tok = tok.replace("-", "+").replace("_", "/")
            elif c == 6:
                tok = parts[0] + "=." + parts[1] + "." + parts[2]
            elif c == 7:
                tok = parts[0] + "." + parts[1] + "." + parts[2][:-1]
            elif c == 8:
                tok = parts[0] + "." + parts[1] + "." + parts[2][:-2]
            elif c == 9:
                last = parts[2][-1]
                alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
                i = alphabet.index(last)
                parts[2] = parts[2][:-1] + alphabet[(i + 1) % 64]
                tok = ".".join(parts)
            elif c == 10:
                tok = " " + tok
            elif c == 11:
                tok = tok + "\n"
            elif c == 12:
                s = bytearray(base64.urlsafe_b64decode(parts[2] + "=" * (-len(parts[2]) % 4)))
                s[r.randrange(len(s))] ^= 1 << r.randrange(8)
                tok = parts[0] + "." + parts[1] + "." + b64url(bytes(s))
            elif c == 13:
                other = b64url(json.dumps({"type": "forged", "event_id": "ev_forged"}).encode())
                tok = parts[0] + "." + other + "." + parts[2]
            elif c == 14:
                tok = b64url(b'{"alg":"none","kid":"fz-k1"}') + "." + parts[1] + "."
            elif c == 15:
                tok = b64url(b'{"alg":"HS256","kid":"fz-k1"}') + "." + parts[1] + "." + b64url(
                    hmac.new(int_bytes(self.k1["n"]), signing_input, hashlib.sha256).digest())
            elif c == 16:
                tok = parts[0] + "." + parts[1] + "." + b64url(b"\x00" + sig)
            elif c == 17:
                tok = parts[0] + "." + parts[1] + "." + b64url(sig[1:])
            elif c == 18:
                tok = "".join(parts)
            elif c == 19:
                tok = tok.upper()
            elif c == 20:
                tok = parts[0] + "." + parts[1] + "." + b64url(bytes(256))
            else:
                tok = self.rand_ascii(r.randrange(1, 300))
        return tok, bad

    TOKEN_POOL = 400

    def sign(self, key, msg):
        """RS256; with the cryptography module when there is one (faster, same bytes)."""
        if self.fast_rsa is not None:
            k = self.fast_rsa.get(id(key))
            if k is None:
                from cryptography.hazmat.primitives.asymmetric import rsa
                d = pow(key["e"], -1, (key["p"] - 1) * (key["q"] - 1))
                k = rsa.RSAPrivateNumbers(key["p"], key["q"], d, key["dp"], key["dq"], key["qinv"],
                                          rsa.RSAPublicNumbers(key["e"], key["n"])).private_key()
                self.fast_rsa[id(key)] = k
            from cryptography.hazmat.primitives import hashes
            from cryptography.hazmat.primitives.asymmetric import padding
            return k.sign(msg, padding.PKCS1v15(), hashes.SHA256())
        return rs256_sign(key, msg)

    def kinde_call(self):
        r = self.r
        tok, bad = self.token()
        # the token's own class: a forced webhook id (the systematic pass
        # replaces it) must not leave its class on a token that is fine
        tcls = "jwt" if bad else None
        cls = tcls
        wid = Val(q("wh_%d" % self.u()))
        if r.random() < 0.1:
            wid = self.bad_text()
            cls = wid.cls
        tv = Val(self.text(tok), tcls)
        if r.random() < 0.04:
            tv = Val(self.pick([self.V_A1M, self.V_A1M1, "''", NULL, q("a.b.c"), q("..")]), "big")
            cls = "big"
        return {"webhook_id": wid, "token": tv}, cls


# --------------------------------------------------------------------------
# per-function argument kinds
# --------------------------------------------------------------------------

# kind of each argument by name; anything missing is fuzzed by its type
KINDS = {
    "earmark_set_limit": {"account": "account", "lim": "lim", "feature": "feature"},
    "earmark_set_account": {"account": "account", "cycle_anchor": "ts_nullable",
                            "provider_customer": "provider_nullable", "provider_agreement": "provider_nullable"},
    "earmark_budget": {"account": "account", "feature": "feature", "at": "ts_nullable"},
    "earmark_reserve": {"account": "account", "amount": "amount", "idempotency_key": "key",
                        "feature": "feature", "lease": "lease"},
    "earmark_charge": {"account": "account", "job_id": "job", "tokens": "amount0", "step": "step"},
    "earmark_heartbeat": {"account": "account", "job_id": "job"},
    "earmark_settle": {"account": "account", "job_id": "job", "used": "used", "outcome": "outcome"},
    # the 0.2.0 forms (no account), which only fail (42883)
    "earmark_charge(0.2.0)": {"job_id": "job", "tokens": "amount0", "step": "step"},
    "earmark_heartbeat(0.2.0)": {"job_id": "job"},
    "earmark_settle(0.2.0)": {"job_id": "job", "used": "used"},
    "earmark_set_escrow": {"account": "account", "slots": "slots"},
    "earmark_sweep": {"max_jobs": "count"},
    "earmark_inbox_receive": {"source": "source", "dedupe_key": "key", "event_type": "event_type",
                              "payload": "payload", "occurred_at": "ts_nullable", "account": "account_nullable"},
    "earmark_inbox_claim": {"max_events": "count", "lease": "lease_req"},
    "earmark_inbox_complete": {"event_id": "event", "result": "free_text"},
    "earmark_inbox_ignore": {"event_id": "event", "reason": "free_text"},
    "earmark_inbox_fail": {"event_id": "event", "error": "free_text"},
    "earmark_inbox_replay": {"event_id": "event", "account": "account"},
    "earmark_inbox_set_handler": {"event_type": "event_type", "handler": "handler"},
    "earmark_set_plan_limit": {"plan": "plan", "lim": "lim", "feature": "feature"},
    "earmark.apply_plan_change": {"e": "event_row"},
    "earmark_inbox_set_secret": {"source": "source", "secret": "secret"},
    "earmark_inbox_drop_secret": {"source": "source", "secret": "secret"},
    "earmark_record_usage": {"account": "account", "units": "units", "idempotency_key": "key",
                             "feature": "feature", "occurred_at": "ts_occurred"},
    "earmark_record_usage_many": {"account": "account", "units": "arr:units", "idempotency_keys": "arr:key",
                                  "features": "arr_nullable:feature", "occurred_at": "arr_nullable:ts_occurred"},
    "earmark_reserve_many": {"account": "account", "amounts": "arr:amount", "idempotency_keys": "arr:key",
                             "features": "arr_nullable:feature", "lease": "lease"},
    "earmark_settle_many": {"account": "account", "job_ids": "arr:job", "used": "arr_nullable:used",
                            "outcomes": "arr_nullable:outcome"},
    "earmark_report": {"max_cycles": "count_nullable"},
    "earmark_refresh_limits": {"account": "account"},
    "earmark_reconcile": {"account": "account_nullable", "feature": "feature_nullable"},
    # the worker's own step: NULL cycle_account (the cycle is gone), error
    # (it went through) and feature (with no cycle) are what it passes
    "earmark.report_cycle": {"account": "account", "cycle_account": "account_nullable",
                             "error": "free_text_nullable", "feature": "feature_nullable"},
    # the worker's store of a limit read (a NULL limit is unlimited)
    "earmark.store_limits": {"account": "account", "features": "arr:feature", "limits": "arr:lim"},
}

# a NULL of these means something (unlimited, now, keep, the setting, remove)
NULLABLE_KINDS = {"lim", "step", "used", "ts_nullable", "lease", "provider_nullable", "account_nullable",
                  "feature_nullable", "count_nullable", "free_text_nullable", "handler"}
# text of 1 to 255 characters (api.md Conventions, inbox.md Functions)
NAME_KINDS = {"account", "feature", "key", "source", "event_type", "provider_nullable", "account_nullable",
              "feature_nullable"}

JOBS = ["running", "capped", "completed", "cancelled", "expired_lease", "f1job", "slot", "huge_run",
        "anch_run"]
# the account each fixture job was reserved for (fixture_sql)
JOB_ACCOUNT = {"running": "fz_a", "capped": "fz_a", "completed": "fz_a", "cancelled": "fz_a",
               "expired_lease": "fz_a", "f1job": "fz_a", "slot": "fz_esc", "huge_run": "fz_huge",
               "anch_run": "fz_anch"}
# the functions that take a job's account first (0.3.0), and the names
# under which their 0.2.0 forms are fuzzed: fn key -> the function's name
ACCOUNT_FIRST = ("earmark_charge", "earmark_heartbeat", "earmark_settle")
V020 = {fn + "(0.2.0)": fn for fn in ACCOUNT_FIRST}
EVENTS = ["received", "processing", "applied", "ignored", "failed", "dead", "noaccount",
          "abandoned", "plan", "handled"]
HANDLERS = [
    "'fuzz.h_ok(earmark.inbox_event)'::regprocedure",
    "'fuzz.h_int(earmark.inbox_event)'::regprocedure",
    "'fuzz.h_set(earmark.inbox_event)'::regprocedure",
    "'fuzz.h_two(earmark.inbox_event,integer)'::regprocedure",
    "'fuzz.h_text(text)'::regprocedure",
    "'fuzz.h_other(earmark.inbox_event)'::regprocedure",
    "'fuzz.h_proc(earmark.inbox_event)'::regprocedure",
    "'earmark.apply_plan_change(earmark.inbox_event)'::regprocedure",
    "'now()'::regprocedure",
    "'earmark_check()'::regprocedure",
    "'pg_sleep(double precision)'::regprocedure",
    "'textin(cstring)'::regprocedure",
    "(0)::oid::regprocedure",
    "(1)::oid::regprocedure",
    "(4294967295)::oid::regprocedure",
    "(16384)::oid::regprocedure",
    "NULL",
]


class Gen:
    def __init__(self, corpus, funcs):
        self.c = corpus
        self.r = corpus.r
        self.funcs = funcs      # fn -> (argnames, argtypes, ndefaults, retset)

    def kind_of(self, fn, name, typ):
        k = KINDS.get(fn, {}).get(name)
        if k:
            return k
        return {"text": "free_text", "bigint": "amount", "integer": "count",
                "timestamp with time zone": "ts_nullable", "interval": "lease", "jsonb": "payload",
                "regprocedure": "handler", "boolean": "bool",
                "double precision": "count"}.get(typ, "free_text")

    def value(self, kind, bad):
        """A value of this kind: a plausible one (bad=False) or a wrong one."""
        c, r = self.c, self.r
        if kind.startswith("arr"):
            return self.array(kind, bad)
        if kind in ("account", "feature", "key", "source", "event_type", "plan", "provider_nullable",
                    "account_nullable", "feature_nullable"):
            base = {"provider_nullable": "provider", "account_nullable": "account",
                    "feature_nullable": "feature"}.get(kind, kind)
            if not bad:
                if kind.endswith("_nullable") and r.random() < 0.3:
                    return Val(NULL)
                return c.name_good(base)
            v = c.bad_text()
            if v.sql == NULL and kind.endswith("_nullable"):
                v.cls = "null-ok"
            return v
        if kind in ("free_text", "free_text_nullable"):
            if not bad:
                return Val(q(c.pick(["applied", "why", "boom", "x"])))
            v = c.bad_text()
            if v.cls in ("empty", "long", "edge", "huge"):
                v.cls += "-text"        # not a name: no length rule
            if v.sql == NULL and kind == "free_text_nullable":
                v.cls = "null-ok"
            return v
        if kind == "outcome":
            if not bad:
                return Val(q(c.pick(["completed", "failed", "cancelled"])))
            if r.random() < 0.5:
                return Val(q(c.pick(["expired", "COMPLETED", " completed", "completed ", "running", "capped",
                                     "complete", "cancel", "completed\x00"[:-1] + "\x01"])), "odd")
            return c.bad_text()
        if kind in ("lim", "amount", "amount0", "units", "used", "step"):
            if not bad:
                if kind in ("lim", "step", "used") and r.random() < 0.2:
                    return Val(NULL)
                return c.bigint(True)
            if r.random() < 0.12:
                return Val(NULL, "null-ok" if kind in ("lim", "step", "used") else "null")
            return c.bigint(False)
        if kind in ("slots", "count", "count_nullable"):
            good = {"slots": [0, 1, 4, 256], "count": [1, 10, 1000], "count_nullable": [1, 100]}[kind]
            if not bad:
                return Val(str(c.pick(good)))
            if r.random() < 0.12:
                return Val(NULL, "null-ok" if kind == "count_nullable" else "null")
            return c.int4(good)
        if kind in ("ts_nullable", "ts_occurred"):
            if not bad:
                if kind == "ts_nullable" and r.random() < 0.5:
                    return Val(NULL)
                return Val(c.pick(["now()", "now() - interval '1 day'", "'2026-11-20 15:29:00+00'::timestamptz"]))
            if r.random() < 0.1:
                return Val(NULL, "null-ok" if kind == "ts_nullable" else "null")
            return c.timestamptz()
        if kind in ("lease", "lease_req"):
            if not bad:
                if kind == "lease" and r.random() < 0.4:
                    return Val(NULL)
                return Val(c.pick(["'2 minutes'::interval", "'1 hour'::interval", "'30 seconds'::interval"]))
            if r.random() < 0.1:
                return Val(NULL, "null-ok" if kind == "lease" else "null")
            return c.interval()
        if kind in ("job", "event"):
            if not bad:
                return Val(REF % (kind + ":" + c.pick(JOBS if kind == "job" else EVENTS)))
            if r.random() < 0.15:
                return Val(NULL, "null")
            v = c.bigint(False)
            v.cls = "unknown_id"
            return v
        if kind == "payload":
            if not bad:
                return Val(q(json.dumps({"type": "fz.type", "event_timestamp": "2026-10-21T02:29:23+11:00"})) + "::jsonb")
            return c.jsonb()
        if kind == "handler":
            h = c.pick(HANDLERS)
            if not bad:
                return Val(c.pick([HANDLERS[0], HANDLERS[7], "NULL"]))
            return Val(h, "handler")
        if kind == "secret":
            good = "whsec_" + b64(c.sec1)
            if not bad:
                return Val(q(c.pick([good, b64(c.sec2a), "whsec_" + b64(bytes(c.r.getrandbits(8) for _ in range(32)))])))
            if r.random() < 0.5:
                return Val(q(c.pick([
                    "whsec_" + b64(bytes(15)), "whsec_" + b64(bytes(16)), "whsec_" + b64(bytes(128)),
                    "whsec_" + b64(bytes(129)), "whsec_", "whsec_!!", b64(bytes(15)), "whsec_" + b64url(bytes(40) + b"\xff\xfe"),
                    "whsec_" + b64(bytes(32)).rstrip("="), "whsec_" + b64(bytes(32))[:-2] + "B=",
                    "whsec_" + b64(bytes(32)) + "\n", "WHSEC_" + b64(bytes(32)), "A" * 1024, "A" * 1025,
                    "whsec_" + "A" * 1018, "whsec_whsec_" + b64(bytes(32)), "=" * 8,
                ])), "webhook")
            v = c.bad_text()
            if v.cls in ("empty", "long", "edge", "huge"):
                v.cls += "-text"        # a secret has its own rules (22023, 1 kB)
            return v
        if kind == "event_row":
            return self.event_row(bad)
        if kind == "bool":
            v = c.pick(["true", "false", "NULL"])
            return Val(v, "null" if bad and v == NULL else None)
        return c.bad_text()

    # the batch functions' arrays (api.md Batches): 1 to 3 elements of the
    # single call's kind; a bad array has its last element bad.  A NULL
    # array is refused unless optional ("arr_nullable:")
    ARRAY_TYPES = {"units": "bigint", "amount": "bigint", "used": "bigint", "job": "bigint", "lim": "bigint",
                   "key": "text", "feature": "text", "outcome": "text", "ts_occurred": "timestamptz"}

    def array(self, kind, bad):
        r = self.r
        nullable = kind.startswith("arr_nullable:")
        elem = kind.split(":", 1)[1]
        if not bad and nullable and r.random() < 0.3:
            return Val(NULL)
        if bad and r.random() < 0.1:
            return Val(NULL, "null-ok" if nullable else "null")
        n = r.randint(1, 3)
        vals = [self.value(elem, bad and i == n - 1) for i in range(n)]
        return Val("ARRAY[%s]::%s[]" % (", ".join(v.sql for v in vals), self.ARRAY_TYPES[elem]),
                   vals[-1].cls)

    def event_row(self, bad):
        c, r = self.c, self.r
        if not bad and r.random() < 0.5:
            return Val("(SELECT e FROM earmark.inbox_event e WHERE e.event_id = %s)" % (REF % ("event:" + c.pick(EVENTS))))
        d = {
            "event_id": c.pick([REF % ("event:" + c.pick(EVENTS)), "0", "-1", str(I64_MAX), "123456789"]),
            "source": c.pick(["fz", "kinde", ""]),
            "dedupe_key": "k",
            "event_type": "customer.plan_changed",
            "payload": c.pick([{"data": {"plan": {"key": "pro"}}}, {"data": {"plan": {"key": None}}},
                               {"data": {"plan": {"key": ""}}}, {"data": {"plan": {"key": "x" * 300}}},
                               {}, [], {"data": {"plan": {"key": 1}}}, {"data": "pro"}]),
            "occurred_at": c.pick(["2026-10-21T02:29:23+11:00", "294276-12-31T00:00:00Z",
                                   "4714-11-24T00:00:00Z BC", "infinity", "-infinity", "1970-01-01T00:00:00Z"]),
            "account": c.pick(["fz_a", "nobody", None, "", "\u00e9" * 300]),
            "status": c.pick(["processing", "received", "applied", "bogus"]),
            "attempts": c.pick([1, 0, -1, I32_MAX]),
        }
        evid = d.pop("event_id")
        js = json.dumps(d, ensure_ascii=False)
        sql = ("jsonb_populate_record(NULL::earmark.inbox_event, %s::jsonb || jsonb_build_object('event_id', %s::bigint))"
               % (q(js), evid))
        self.c.casts.add(("earmark.inbox_event", sql))
        if r.random() < 0.1:
            return Val("NULL::earmark.inbox_event", "null")
        return Val(sql, "jsonb")

    # ---- one call ----------------------------------------------------------------------------
    def call(self, fn, strategy=None, force=None):
        """(cls, pre, sql, refuse) of one call of fn: refuse when an argument
        is of a class in REFUSED (whatever the call's first class is)."""
        c, r = self.c, self.r
        names, types, ndef, retset = self.funcs[fn]
        kinds = [self.kind_of(fn, n, t) for n, t in zip(names, types)]
        pre = None
        cls = None
        args = {}
        if fn in ("earmark_inbox_receive_signed", "earmark_webhook_signature_valid"):
            args, cls = c.signed_call(fn)
        elif fn == "earmark_inbox_receive_kinde":
            args, cls = c.kinde_call()
            x = r.random()
            if x < 0.05:
                pre = "SET LOCAL earmark.jwks_refetch_cooldown = 0"
            elif x < 0.08:
                pre = "SET LOCAL earmark.kinde_domain = ''"
        strategy = strategy or c.pick(["one_bad"] * 6 + ["many_bad"] * 2 + ["all_bad", "good"])
        if not args:
            bad_idx = set()
            if names:
                if strategy == "one_bad":
                    bad_idx = {r.randrange(len(names))}
                elif strategy == "many_bad":
                    bad_idx = {i for i in range(len(names)) if r.random() < 0.5}
                elif strategy == "all_bad":
                    bad_idx = set(range(len(names)))
            for i, (n, k) in enumerate(zip(names, kinds)):
                args[n] = self.value(k, i in bad_idx)
                cls = cls or args[n].cls
        if force:
            i, v = force
            args[names[i]] = v
            cls = v.cls or "null"
        # a good account for a fixture job is mostly the job's own account
        # (else every such call would only find no job of that account)
        if fn in ACCOUNT_FIRST and args["account"].cls is None and r.random() < 0.8:
            m = re.match(r"^@@REF:job:(\w+)@@$", args["job_id"].sql)
            if m:
                args["account"] = Val(q(JOB_ACCOUNT[m.group(1)]))
        # a 0.2.0 form: every argument cast to its own type, so that the call
        # cannot resolve to the account-first form (an untyped NULL first
        # would: PostgreSQL prefers text for an unknown argument)
        if fn in V020:
            for n, t in zip(names, types):
                args[n] = Val("(%s)::%s" % (args[n].sql, t), args[n].cls)
        # settings the gate reads: escrow's fast path runs only without the rate limit
        if pre is None and r.random() < 0.06 and fn in ("earmark_reserve", "earmark_settle",
                                                        "earmark_set_escrow", "earmark_record_usage"):
            pre = c.pick(["SET LOCAL earmark.rate_limit = 0", "SET LOCAL earmark.escrow_slots = 8",
                          "SET LOCAL earmark.rate_limit = 1"])
        # an unprivileged or less privileged caller
        if pre is None and r.random() < 0.03:
            pre = "SET LOCAL ROLE %s" % c.pick(["earmark_fuzz_nobody", "earmark_fuzz_user", "earmark_fuzz_admin"])
            cls = "role"
        # notation: all positional, trailing defaults left out, or named
        vals = [args[n] for n in names]
        style = r.random()
        if style < 0.6 or not names:
            text = ", ".join(v.sql for v in vals)
        elif style < 0.8:
            keep = len(vals)
            while keep > len(vals) - ndef and vals[keep - 1].cls is None and r.random() < 0.7:
                keep -= 1
            text = ", ".join(v.sql for v in vals[:keep])
        else:
            items = []
            for i, (n, v) in enumerate(zip(names, vals)):
                if i >= len(names) - ndef and v.cls is None and r.random() < 0.5:
                    continue
                items.append('"%s" => %s' % (n, v.sql))
            r.shuffle(items)
            text = ", ".join(items)
        callee = V020.get(fn, fn)
        if retset:
            sql = "SELECT * FROM %s(%s)" % (callee, text)
        else:
            sql = "SELECT %s(%s)" % (callee, text)
        refuse = any(v.cls in REFUSED for v in args.values())
        return cls or "valid", pre, sql, refuse


# --------------------------------------------------------------------------
# fixture
# --------------------------------------------------------------------------

def fixture_sql(c):
    jwks = json.dumps(c.jwks, ensure_ascii=False)
    return r"""
-- earmark_fuzz fixture: every state the calls may meet
SET earmark.rate_limit = 0;
SET client_min_messages = warning;
CREATE TABLE fuzz.ref (name text PRIMARY KEY, val text NOT NULL);

SELECT earmark_set_limit('fz_a', 100000);
SELECT earmark_set_limit('fz_a', 500, 'f1');
SELECT earmark_set_account('fz_a', NULL, 'cus_fz_a', 'agr_fz_a');
SELECT earmark_set_account('fz_anch', '2026-01-15 10:00:00+00');
SELECT earmark_set_limit('fz_anch', 1000);
SELECT earmark_set_limit('fz_unl', NULL);
SELECT earmark_set_limit('fz_zero', 0);
SELECT earmark_set_account('fz_nolimit');
SELECT earmark_set_limit('fz_esc', 10000);
SELECT earmark_set_escrow('fz_esc', 4);
SELECT earmark_set_limit('fz_huge', NULL);
SELECT earmark_set_limit('été', 10);

INSERT INTO fuzz.ref SELECT 'job:running', job_id FROM earmark_reserve('fz_a', 1000, 'running', lease => '1 day');
INSERT INTO fuzz.ref SELECT 'job:capped', job_id FROM earmark_reserve('fz_a', 1000, 'capped', lease => '1 day');
SELECT earmark_charge('fz_a', (SELECT val::bigint FROM fuzz.ref WHERE name = 'job:capped'), 5000, 1);
INSERT INTO fuzz.ref SELECT 'job:completed', job_id FROM earmark_reserve('fz_a', 1000, 'completed');
SELECT earmark_charge('fz_a', (SELECT val::bigint FROM fuzz.ref WHERE name = 'job:completed'), 300, 1);
SELECT earmark_settle('fz_a', (SELECT val::bigint FROM fuzz.ref WHERE name = 'job:completed'));
INSERT INTO fuzz.ref SELECT 'job:cancelled', job_id FROM earmark_reserve('fz_a', 1000, 'cancelled');
SELECT earmark_settle('fz_a', (SELECT val::bigint FROM fuzz.ref WHERE name = 'job:cancelled'), 0, 'cancelled');
INSERT INTO fuzz.ref SELECT 'job:expired_lease', job_id FROM earmark_reserve('fz_a', 700, 'expired', lease => '1 microsecond');
INSERT INTO fuzz.ref SELECT 'job:f1job', job_id FROM earmark_reserve('fz_a', 100, 'f1job', 'f1', '1 day');
SELECT earmark_reserve('fz_esc', 100, 'esc-slow', lease => '1 day');
INSERT INTO fuzz.ref SELECT 'job:slot', job_id FROM earmark_reserve('fz_esc', 100, 'esc-slot', lease => '1 day');
-- 2^62 settled and 2^62 held on an unlimited account: a settle of the second at its hold
-- would pass bigint's end
INSERT INTO fuzz.ref SELECT 'job:huge_done', job_id FROM earmark_reserve('fz_huge', 4611686018427387904, 'h1', lease => '1 day');
SELECT earmark_settle('fz_huge', (SELECT val::bigint FROM fuzz.ref WHERE name = 'job:huge_done'), 4611686018427387904);
INSERT INTO fuzz.ref SELECT 'job:huge_run', job_id FROM earmark_reserve('fz_huge', 4611686018427387904, 'h2', lease => '1 day');
INSERT INTO fuzz.ref SELECT 'job:anch_run', job_id FROM earmark_reserve('fz_anch', 10, 'a1', lease => '1 day');

SELECT earmark_record_usage('fz_a', 40, 'click-1');
SELECT earmark_record_usage('fz_a', 5, 'old-1', occurred_at => now() - interval '40 days');
SELECT earmark_record_usage('fz_unl', 1000000000000000, 'u-max');
SELECT earmark_report();
SELECT count(*) FROM earmark_reconcile('fz_a');
SELECT earmark_record_usage('fz_a', 2, 'click-2');
SELECT earmark_record_usage('fz_a', -1, 'fix-1');

-- inbox
SELECT earmark_set_plan_limit('pro', 5000);
SELECT earmark_set_plan_limit('pro', NULL, 'f1');
SELECT earmark_inbox_set_handler('fz.handled', 'fuzz.h_ok(earmark.inbox_event)');
SELECT earmark_inbox_set_secret('fz_src', %(sec1)s);
SELECT earmark_inbox_set_secret('fz_src2', %(sec2a)s);
SELECT earmark_inbox_set_secret('fz_src2', %(sec2b)s);
INSERT INTO earmark.webhook_secret (source, secret) VALUES ('fz_badsecret', 'not base64!');
INSERT INTO fuzz.ref SELECT 'event:' || s, (earmark_inbox_receive('fz', 'e-' || s, 'fz.type',
        jsonb_build_object('type', 'fz.type', 'n', s), now() - interval '1 hour', 'fz_a')).event_id
  FROM unnest(ARRAY['received', 'processing', 'applied', 'ignored', 'failed', 'dead', 'abandoned']) s;
INSERT INTO fuzz.ref SELECT 'event:noaccount', event_id
  FROM earmark_inbox_receive('fz', 'e-noaccount', 'fz.type', '{"type": "fz.type"}');
INSERT INTO fuzz.ref SELECT 'event:plan', event_id
  FROM earmark_inbox_receive('kinde', 'e-plan', 'customer.plan_changed',
       '{"type": "customer.plan_changed", "data": {"plan": {"key": "pro"}}}', now() - interval '2 hours', 'fz_a');
INSERT INTO fuzz.ref SELECT 'event:handled', event_id
  FROM earmark_inbox_receive('fz', 'e-handled', 'fz.handled', '{"type": "fz.handled"}', NULL, 'fz_a');
UPDATE earmark.inbox_event SET status = 'processing', attempts = 1, locked_until = now() + interval '1 day'
 WHERE dedupe_key IN ('e-processing');
UPDATE earmark.inbox_event SET status = 'applied', finished = true, attempts = 1, result = 'done' WHERE dedupe_key = 'e-applied';
UPDATE earmark.inbox_event SET status = 'ignored', finished = true, attempts = 1, result = 'no' WHERE dedupe_key = 'e-ignored';
UPDATE earmark.inbox_event SET status = 'failed', attempts = 2, last_error = 'x',
       next_attempt_at = now() + interval '1 day' WHERE dedupe_key = 'e-failed';
UPDATE earmark.inbox_event SET status = 'dead', finished = true, attempts = 6, last_error = 'x' WHERE dedupe_key = 'e-dead';
UPDATE earmark.inbox_event SET status = 'processing', attempts = 6, locked_until = now() - interval '1 hour'
 WHERE dedupe_key = 'e-abandoned';
UPDATE earmark.inbox_event SET status = 'processing', attempts = 1, locked_until = now() + interval '1 day'
 WHERE dedupe_key IN ('e-plan', 'e-handled');
INSERT INTO earmark.jwks (url, keys, fetched_at)
VALUES (%(url)s, %(jwks)s::jsonb, now());
""" % {"sec1": q("whsec_" + b64(c.sec1)), "sec2a": q("whsec_" + b64(c.sec2a)),
       "sec2b": q(b64(c.sec2b)), "url": q("http://127.0.0.1:1/.well-known/jwks"), "jwks": q(jwks)}


# --------------------------------------------------------------------------
# main
# --------------------------------------------------------------------------

def copy_text(v):
    if v is None:
        return "\\N"
    return (v.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r").replace("\t", "\\t"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--calls", type=int, default=100000)
    ap.add_argument("--functions", required=True)
    ap.add_argument("--docs", required=True)
    ap.add_argument("--errcodes", default="/usr/include/postgresql/15/server/utils/errcodes.h")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    funcs = {}
    arg_types = {}
    for line in open(args.functions, encoding="utf-8"):
        line = line.rstrip("\n")
        if not line:
            continue
        schema, name, anames, atypes, ndef, retset = line.split("|")
        fn = name if schema == "public" or name.startswith("earmark_") else "%s.%s" % (schema, name)
        names = anames.split(",") if anames else []
        if fn in ACCOUNT_FIRST and names[:1] != ["account"]:
            fn += "(0.2.0)"
        types = atypes.split(",") if atypes else []
        funcs[fn] = (names, types, int(ndef), retset == "t")
        arg_types[fn] = types

    corpus = Corpus(args.seed, int(time.time()))
    gen = Gen(corpus, funcs)
    rows = []

    def emit(fn, cls, pre, sql, refuse):
        rows.append((len(rows) + 1, fn, cls, "t" if refuse else "f", pre, sql))

    # 1. systematic: NULL, and each class of bad value, in every argument of every function
    for fn in sorted(funcs):
        names, types, ndef, retset = funcs[fn]
        for i, n in enumerate(names):
            kind = gen.kind_of(fn, n, types[i])
            nullable = kind in NULLABLE_KINDS or kind.startswith("arr_nullable:")
            is_name = kind in NAME_KINDS
            for v in [Val(NULL, "null-ok" if nullable else "null"),
                      Val("''", "empty" if is_name else "empty-text"),
                      Val(q("x" * 256), "long" if is_name else "long-text"),
                      Val(q("\u00e9" * 256), "long" if is_name else "long-text"),
                      Val(q("x" * 255), "edge" if is_name else "edge-text"),
                      Val(corpus.V_A1M1, "huge" if is_name else "huge-text")]:
                if types[i] != "text" and v.sql != NULL:
                    continue
                cls, pre, sql, refuse = gen.call(fn, "good", force=(i, v))
                emit(fn, cls, pre, sql, refuse)
        for _ in range(20):
            cls, pre, sql, refuse = gen.call(fn, "good")
            emit(fn, cls, pre, sql, refuse)
        for role in ("earmark_fuzz_nobody", "earmark_fuzz_user", "earmark_fuzz_admin"):
            cls, pre, sql, refuse = gen.call(fn, "good")
            emit(fn, "role", "SET LOCAL ROLE " + role, sql, False)

    # 2. random: each function about equally often, the intake functions more
    weights = []
    for fn in sorted(funcs):
        w = 1.0
        if fn in ("earmark_inbox_receive_signed", "earmark_webhook_signature_valid",
                  "earmark_inbox_receive_kinde"):
            w = 3.0
        elif fn in ("earmark_check", "earmark.workers_running", "earmark_refresh_jwks"):
            w = 0.1
        elif fn in ("earmark_report", "earmark_reconcile", "earmark_sweep"):
            w = 0.5
        weights.append((fn, w))
    total = sum(w for _, w in weights)
    while len(rows) < args.calls:
        x = corpus.r.random() * total
        for fn, w in weights:
            x -= w
            if x <= 0:
                break
        cls, pre, sql, refuse = gen.call(fn)
        emit(fn, cls, pre, sql, refuse)

    out = args.out
    with open(os.path.join(out, "calls.copy"), "w", encoding="utf-8") as f:
        for row in rows:
            f.write("\t".join(copy_text(None if v is None else str(v)) for v in row) + "\n")
    with open(os.path.join(out, "vals.copy"), "w", encoding="utf-8") as f:
        for k, v in corpus.vals.items():
            f.write(copy_text(k) + "\t" + copy_text(v) + "\n")
    with open(os.path.join(out, "casts.copy"), "w", encoding="utf-8") as f:
        for t, sql in sorted(corpus.casts):
            f.write(copy_text(t) + "\t" + copy_text(sql) + "\n")
    with open(os.path.join(out, "fixture.sql"), "w", encoding="utf-8") as f:
        f.write(fixture_sql(corpus))

    allowed = documented_states(args.docs, list(funcs), arg_types, valid_sqlstates(args.errcodes))
    with open(os.path.join(out, "allowed.copy"), "w", encoding="utf-8") as f:
        for fn in sorted(allowed):
            for code, where in sorted(allowed[fn].items()):
                f.write("%s\t%s\t%s\n" % (copy_text(fn), code, copy_text(where)))
    print("%d calls over %d functions, %d large values" % (len(rows), len(funcs), len(corpus.vals)))


if __name__ == "__main__":
    main()
