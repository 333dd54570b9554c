#!/usr/bin/env bash
# test/integration/docs.sh: the docs hold together.  For README.md and every
# docs/*.md: every relative markdown link names a file that exists and, when
# it has a #fragment, a heading of that file (GitHub's anchors: lower case,
# punctuation dropped, spaces to hyphens, a repeated heading gets -1, -2).
# Links inside code blocks and code spans are skipped.  Needs no server.
source "$(dirname "$0")/tap.sh"
ROOT=$(cd "$(dirname "$0")/../.." && pwd)

while IFS='|' read -r status file detail; do
    if [ "$status" = D ]; then diag "$file"; else ok "$status" "$file: $detail"; fi
done < <(cd "$ROOT" && python3 - README.md docs/*.md <<'PY'
import os, re, sys

def lines_outside_code(path):
    fenced = False
    for no, line in enumerate(open(path, encoding="utf-8"), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if not fenced:
            yield no, line.rstrip("\n")

def anchors(path):
    out, seen = set(), {}
    for _, line in lines_outside_code(path):
        m = re.match(r"^#{1,6} +(.*?)\s*#*\s*$", line)
        if m:
            a = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
            n = seen.get(a, 0)
            seen[a] = n + 1
            out.add(a if n == 0 else "%s-%d" % (a, n))
    return out

for f in sys.argv[1:]:
    bad, n = [], 0
    for no, line in lines_outside_code(f):
        for m in re.finditer(r"\]\(([^)\s]+)\)", re.sub(r"`[^`]*`", "", line)):
            target = m.group(1)
            if re.match(r"^[a-z]+:", target):
                continue
            n += 1
            path, _, frag = target.partition("#")
            tp = os.path.normpath(os.path.join(os.path.dirname(f), path)) if path else f
            if not os.path.exists(tp):
                bad.append("%d: %s (no such file)" % (no, target))
            elif frag and tp.endswith(".md") and frag not in anchors(tp):
                bad.append("%d: %s (no such heading)" % (no, target))
    for b in bad:
        print("D|%s:%s" % (f, b))
    print("%d|%s|%d relative links resolve" % (1 if bad else 0, f, n))
PY
)

done_testing
