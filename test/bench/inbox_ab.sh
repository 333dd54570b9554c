#!/usr/bin/env bash
# test/bench/inbox_ab.sh: the inbox benchmark (inbox.sh) for earmark builds
# side by side, for measuring a change (A/B) rather than the targets.
#
#   bash test/bench/inbox_ab.sh NAME=CHECKOUT:PREFIX [NAME=CHECKOUT:PREFIX ...]
#
# Each CHECKOUT is a work tree of earmark (for example one made by
# `git worktree add --detach /tmp/old main`), each with its own private
# PostgreSQL copy PREFIX (EM_PREFIX; made on first use), into which its
# inbox.sh builds and installs it.  Then INBOX_AB_ROUNDS rounds (3): in
# each, one round of every checkout's inbox.sh (EM_BENCH_ROUNDS=1; the
# checkouts in the given order in odd rounds, reversed in even ones), so
# that the machine's slow moments fall on all alike.  Prints, per build,
# the median over the rounds of each earmark / plain ratio, each round's
# ratio, and the median events/s.  inbox.sh's other settings
# (EM_BENCH_BACKLOGS, EM_BENCH_CLIENTS, EM_BENCH_PORT, ...) pass through;
# every run's own output is kept in INBOX_AB_OUT (a new temporary directory).

set -euo pipefail
ROUNDS=${INBOX_AB_ROUNDS:-3}
OUT=${INBOX_AB_OUT:-$(mktemp -d /tmp/earmark-inbox-ab.XXXXXX)}
mkdir -p "$OUT"
[ $# -ge 1 ] || { echo "usage: $0 NAME=CHECKOUT:PREFIX ..." >&2; exit 2; }
builds=("$@")

for r in $(seq 1 "$ROUNDS"); do
    order=("${builds[@]}")
    if [ $(( r % 2 )) -eq 0 ]; then
        order=()
        for (( i = ${#builds[@]} - 1; i >= 0; i-- )); do order+=("${builds[$i]}"); done
    fi
    for b in "${order[@]}"; do
        name=${b%%=*}
        rest=${b#*=}
        checkout=${rest%%:*}
        prefix=${rest#*:}
        echo "[inbox_ab] round $r: $name" >&2
        (cd "$checkout" && EM_PREFIX=$prefix EM_BENCH_ROUNDS=1 bash test/bench/inbox.sh \
            >"$OUT/$name-$r.txt" 2>"$OUT/$name-$r.err")
    done
done

python3 - "$OUT" "${builds[@]%%=*}" <<'PY'
import collections, glob, re, statistics, sys
out = sys.argv[1]
for name in sys.argv[2:]:
    rows = collections.defaultdict(list)
    for f in sorted(glob.glob(f"{out}/{name}-*.txt")):
        for line in open(f):
            m = re.match(r"^\| (\d+) \| (receive|claim \+ complete) \| ([\d,]+) \| (\d+) \| (\d+) \| ([\d.]+) \|", line)
            if m:
                rows[(int(m[1]), m[2], int(m[3].replace(",", "")))].append(
                    (float(m[6]), int(m[4]), int(m[5])))
    print(f"{name}:")
    for (c, phase, waiting), r in sorted(rows.items()):
        print("  %d client(s), %s, %s waiting: earmark / plain %.2f (rounds %s); events/s plain %d, earmark %d"
              % (c, phase, f"{waiting:,}", statistics.median(x[0] for x in r),
                 " ".join("%.2f" % x[0] for x in r),
                 statistics.median(x[1] for x in r), statistics.median(x[2] for x in r)))
print(f"(each run's output: {out})")
PY
