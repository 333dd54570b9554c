#!/usr/bin/env bash
# test/fuzz/run.sh: build the libFuzzer target for src/sigverify.c
# (fuzz_sigverify.c, with pg_shim.c in place of the server) and fuzz each of
# its parsers and verifiers for a bounded time, from a seed corpus written
# here.  Prints TAP: the build, the seeds, and one line per target.
#
#   bash test/fuzz/run.sh
#
# EM_FUZZ_SECONDS   total fuzzing time, split over the targets (default 30)
# EM_FUZZ_TARGETS   the targets to fuzz (default: base64 secret webhook jwt rs256)
# EM_FUZZ_SEED      libFuzzer's -seed (default: random, printed)
# EM_FUZZ_KEEP=1    keep the build and corpus directory
# CC                a clang with libFuzzer (default: clang)
#
# Needs clang (14 or later, with its libclang_rt.fuzzer), the PostgreSQL 15
# server headers and the OpenSSL 3 headers; without clang it prints a
# skipped test.  A finding (crash, sanitizer report, or an answer that
# differs from the reference in fuzz_sigverify.c) is a "not ok" line with
# the sanitizer's report, the input in hex, and the command that replays it.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
CC=${CC:-clang}
SECONDS_TOTAL=${EM_FUZZ_SECONDS:-30}
SEED=${EM_FUZZ_SEED:-$(( $(od -An -N4 -tu4 /dev/urandom | tr -d ' ') % 2147483647 + 1 ))}
TARGETS=(${EM_FUZZ_TARGETS:-base64 secret webhook jwt rs256})
PG_CONFIG=${PG_CONFIG:-/usr/lib/postgresql/15/bin/pg_config}
WORK=$(mktemp -d /tmp/earmark-fuzz-c.XXXXXX)
n=0
failed=0

tap() {   # tap STATUS DESCRIPTION
    n=$((n + 1))
    if [ "$1" = 0 ]; then echo "ok $n - $2"; return 0; fi
    echo "not ok $n - $2"
    failed=$((failed + 1))
    return 1
}
finish() {
    echo "1..$n"
    if [ -z "${EM_FUZZ_KEEP:-}" ]; then rm -rf "$WORK"; else echo "# kept $WORK"; fi
    [ "$failed" -eq 0 ]
    exit $?
}

if ! command -v "$CC" >/dev/null 2>&1; then
    n=1; echo "ok 1 # SKIP $CC is not installed (Debian: clang libclang-rt-14-dev); no libFuzzer run"; finish
fi
printf 'int LLVMFuzzerTestOneInput(const char *d, unsigned long n) { return 0; }\n' >"$WORK/probe.c"
if ! "$CC" -fsanitize=fuzzer "$WORK/probe.c" -o "$WORK/probe" >/dev/null 2>&1; then
    n=1; echo "ok 1 # SKIP $CC cannot link -fsanitize=fuzzer (Debian: libclang-rt-14-dev); no libFuzzer run"; finish
fi
PGINC=$("$PG_CONFIG" --includedir-server 2>/dev/null || echo /usr/include/postgresql/15/server)

# --- build ------------------------------------------------------------------
BIN=$WORK/fuzz_sigverify
CFLAGS=(-g -O1 -fno-omit-frame-pointer -std=gnu11 -Wall -Wno-ignored-attributes
        -Wno-unused-parameter -Wno-missing-field-initializers -Wno-unused-function
        -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all
        -I"$ROOT/src" -I"$ROOT/test/fuzz" -I"$PGINC")
t=$(date +%s)
"$CC" "${CFLAGS[@]}" "$ROOT/test/fuzz/fuzz_sigverify.c" "$ROOT/test/fuzz/pg_shim.c" -lcrypto \
    -o "$BIN" >"$WORK/build.log" 2>&1
tap $? "built fuzz_sigverify with $CC -fsanitize=fuzzer,address,undefined ($(( $(date +%s) - t )) s)" \
    || { sed 's/^/# /' "$WORK/build.log" | head -40; finish; }

# --- seeds ------------------------------------------------------------------
# Each target's seeds are real inputs: base64 and secrets as the intake
# sees them, Standard Webhooks deliveries signed with their secret (now and
# at both ends of the timestamptz range), JWTs signed with a fresh RSA key,
# and that key with a valid signature for rs256.
openssl genrsa -out "$WORK/key.pem" 2048 >/dev/null 2>&1
python3 - "$WORK" <<'PY' >"$WORK/seeds.log" 2>&1
import base64, hashlib, hmac, json, os, struct, subprocess, sys
work = sys.argv[1]
def field(b):
    return struct.pack("<H", len(b)) + b
def put(target, name, data):
    d = os.path.join(work, "corpus", target)
    os.makedirs(d, exist_ok=True)
    open(os.path.join(d, name), "wb").write(data)
b64 = lambda b: base64.b64encode(b).decode()
b64url = lambda b: base64.urlsafe_b64encode(b).rstrip(b"=").decode()

# base64: flag byte (bit 0: url alphabet), then the text
for i, (url, text) in enumerate([(0, "QUJD"), (0, "QQ=="), (0, "QQ"), (1, "_-8"), (0, "+/8="), (1, ""),
                                 (0, b64(bytes(range(256)))), (1, b64url(os.urandom(33)))]):
    put("base64", "s%d" % i, bytes([url]) + text.encode())
# secrets
# (unused bits set in the last character; a bad character after good ones)
for i, s in enumerate(["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
                       "whsec_", "whsec_" + b64(os.urandom(64)), "whsec_QQ",
                       "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaS", "whsec_AAAAAAAAAAAAAAAAAAAAAB==",
                       "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLa!w"]):
    put("secret", "s%d" % i, s.encode())

# Standard Webhooks (see fuzz_webhook in fuzz_sigverify.c for the layout)
key = base64.b64decode("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
US = 1000000
EPOCH = 946684800
MIN_TS = -211813488000000000
END_TS = 9223371331200000000
def webhook(name, now_us, ts, flags=1, tol=300, body=b'{"type":"t"}', extra_sigs=b"", keys=(key,)):
    # flags, now (8), tolerance (4), id NUL ts NUL signature NUL body NUL, keys (equal parts)
    msg = b"msg_1." + ts + b"." + body
    sig = b"v1," + base64.b64encode(hmac.new(keys[0], msg, hashlib.sha256).digest())
    if flags & 1:
        raw = (now_us - MIN_TS) % 2**64
    else:
        raw = (now_us // US - (1700000000 - EPOCH)) % 2**32
    flags |= (len(keys) - 1) << 1
    data = bytes([flags]) + struct.pack("<Q", raw) + struct.pack("<I", tol - 1)
    data += b"msg_1\0" + ts + b"\0" + extra_sigs + sig + b"\0" + body + b"\0" + b"".join(keys)
    put("webhook", name, data)
now = (1700000000 - EPOCH) * US
webhook("now", now, b"1700000000", flags=0)
webhook("now_at", now, b"1700000000")
webhook("rotated", now, b"1700000000", extra_sigs=b"v1a,abc v1," + base64.b64encode(bytes(32)) + b" ",
        keys=(key, os.urandom(len(key))))
webhook("stale", now, b"1699999000")
# the ends of both ranges: "at" (any finite timestamptz) and webhook-timestamp (1 to 12 digits)
for at_name, at in (("min", MIN_TS), ("end", END_TS - 1), ("now", now)):
    for ts_name, ts in (("0", b"0"), ("now", b"1700000000"), ("max", b"999999999999")):
        webhook("edge_%s_%s" % (at_name, ts_name), at, ts)

# JWT: three base64url parts, signed with the fresh key
def sign(data):
    p = subprocess.run(["openssl", "dgst", "-sha256", "-sign", os.path.join(work, "key.pem"), "-binary"],
                       input=data, capture_output=True, check=True)
    return p.stdout
hdr = b64url(json.dumps({"alg": "RS256", "kid": "k1", "typ": "JWT"}).encode())
pl = b64url(json.dumps({"type": "customer.plan_changed", "event_id": "ev_1",
                        "data": {"customer_id": "c1"}}).encode())
sig = sign((hdr + "." + pl).encode())
tok = hdr + "." + pl + "." + b64url(sig)
for i, t in enumerate([tok, hdr + "." + pl + ".", "a.b.c", "..", tok + "=", hdr + "." + pl]):
    put("jwt", "s%d" % i, t.encode())

# RS256: n, e, msg, sig of the fresh key
text = subprocess.run(["openssl", "rsa", "-in", os.path.join(work, "key.pem"), "-noout", "-modulus"],
                      capture_output=True, check=True, text=True).stdout
n = bytes.fromhex(text.strip().split("=", 1)[1])
e = (65537).to_bytes(3, "big")
m = (hdr + "." + pl).encode()
put("rs256", "valid", field(n) + field(e) + field(m) + field(sig))
put("rs256", "tampered", field(n) + field(e) + field(m + b"x") + field(sig))
put("rs256", "lead0", field(b"\x00\x00" + n) + field(b"\x00" + e) + field(m) + field(sig))
put("rs256", "small", field(n[:64]) + field(e) + field(m) + field(sig[:64]))
PY
tap $? "wrote the seed corpus ($(find "$WORK/corpus" -type f 2>/dev/null | wc -l) inputs)" \
    || { sed 's/^/# /' "$WORK/seeds.log"; finish; }

# --- fuzz -------------------------------------------------------------------
echo "# libFuzzer seed $SEED (replay: EM_FUZZ_SEED=$SEED bash test/fuzz/run.sh)"
# the time of each target, by weight: the webhook verifier has the most logic
declare -A WEIGHT=([base64]=2 [secret]=1 [webhook]=4 [jwt]=2 [rs256]=3)
wsum=0
for target in "${TARGETS[@]}"; do wsum=$((wsum + ${WEIGHT[$target]:-1})); done
for target in "${TARGETS[@]}"; do
    per=$(( SECONDS_TOTAL * ${WEIGHT[$target]:-1} / wsum ))
    [ "$per" -lt 2 ] && per=2
    mkdir -p "$WORK/corpus/$target" "$WORK/out/$target" "$WORK/artifacts/$target"
    log=$WORK/$target.log
    # fork mode: a finding is saved and fuzzing goes on, so one bug does not hide the next
    ( cd "$WORK/artifacts/$target" &&
      EM_FUZZ_TARGET=$target timeout $((per + 60)) "$BIN" -seed="$SEED" -fork=1 -ignore_crashes=1 \
          -ignore_timeouts=1 -ignore_ooms=1 -max_total_time="$per" -max_len=16384 -timeout=10 \
          -rss_limit_mb=2048 -artifact_prefix="$WORK/artifacts/$target/" \
          "$WORK/out/$target" "$WORK/corpus/$target" >"$log" 2>&1 )
    rc=$?
    stats=$(grep -E '^#[0-9]+: cov:' "$log" | tail -1)
    runs=$(echo "$stats" | sed -n 's/^#\([0-9]*\):.*/\1/p')
    cov=$(echo "$stats" | grep -oE 'cov: [0-9]+')
    artifacts=$(ls "$WORK/artifacts/$target"/crash-* "$WORK/artifacts/$target"/timeout-* \
                   "$WORK/artifacts/$target"/leak-* "$WORK/artifacts/$target"/oom-* 2>/dev/null)
    if [ "$rc" -eq 0 ] && [ -z "$artifacts" ]; then
        tap 0 "fuzz_sigverify $target: fuzzed for ${per} s, ${runs:-?} inputs, ${cov:-cov ?}: no crash, no sanitizer report, every answer as the reference"
        continue
    fi
    # replay each saved input for its report; one line per distinct finding
    : >"$WORK/$target.findings"
    : >"$WORK/$target.inputs"
    for a in $artifacts; do
        EM_FUZZ_TARGET=$target "$BIN" "$a" >"$a.txt" 2>&1
        key=$(grep -m1 -E 'FINDING|runtime error|ERROR: AddressSanitizer|ERROR: LeakSanitizer|pg_shim:' "$a.txt" \
              | sed -E 's/0x[0-9a-f]+//g; s/[0-9]{6,}/N/g')
        grep -qxF "$key" "$WORK/$target.findings" 2>/dev/null && continue
        echo "$key" >>"$WORK/$target.findings"
        echo "$a" >>"$WORK/$target.inputs"
    done
    tap 1 "fuzz_sigverify $target: $(wc -l <"$WORK/$target.findings") distinct finding(s) in ${runs:-?} inputs (exit $rc)"
    [ -z "$artifacts" ] && tail -20 "$log" | sed 's/^/#   /'
    while read -r a; do
        echo "# --- $(basename "$a") ($(stat -c %s "$a") bytes)"
        grep -E "FINDING|runtime error|ERROR: |SUMMARY|pg_shim|^  [a-z-]+ \(|#[0-9]+ 0x.* in " "$a.txt" | head -25 | sed 's/^/#   /'
        od -An -tx1 -v "$a" | head -16 | sed 's/^/#     /'
        echo "#   replay: EM_FUZZ_TARGET=$target $BIN $a   (run with EM_FUZZ_KEEP=1 to keep it)"
    done <"$WORK/$target.inputs"
done
finish
