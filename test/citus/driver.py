#!/usr/bin/env python3
"""test/citus/driver.py: the load driver of earmark's Citus layer (test/citus/earmark.sh).

    driver.py --dsn DSN MODE [options]

Every call is the bare form, SELECT * FROM earmark_x(account, ...), which Citus
runs on the account's node.  The same driver runs against a Citus coordinator
and against a single node, so that their figures compare.  Output: key=value
lines on stdout (read by earmark.sh), nothing else.

Modes:
  race     --account A --sessions 5 --amount 40000 --hold 1.0 --key K
           every session connects, all wait at a barrier, then each runs
           BEGIN; reserve; (hold --hold seconds); COMMIT.  Prints admitted,
           refused, errors and each refusal's reason.
  load     --accounts A,B,... --jobs 120 --amount 1000 --concurrency 50 --key K
           --jobs per account, --concurrency connections pulling jobs from
           one queue (the accounts' jobs interleaved); a job is reserve,
           charge of --amount, settle at --amount, each a statement of its
           own (autocommit).  Prints admitted, refused, errors (in total and
           per account), seconds and jobs_per_s.
  latency  --account A --calls 100 --key K [--what reserve|job]
           one connection, 10 to warm up, then --calls in a row (each
           autocommit) of: a reserve of 1 (lease 1 hour: it stays open), or
           with --what job a job (reserve, charge and settle at 1); prints
           the median and 90th percentile in ms.
  crash    --accounts A,B --concurrency 4 --stop-file F --log F --key K
           until F exists: BEGIN; reserve 100 (lease 1 hour); charge 60;
           COMMIT, then settle in autocommit.  Appends to --log, after each
           acknowledgement (COMMIT returned, or the autocommit call
           returned), "R account job_id amount used" and "S account job_id
           charged"; a call that failed is "E ..." and its outcome unknown
           (the connection is dropped and made again).  Prints acked counts.
"""
import argparse
import os
import queue
import statistics
import sys
import threading
import time

import psycopg2


def connect(dsn):
    c = psycopg2.connect(dsn)
    c.autocommit = True
    return c


def reserve(cur, account, amount, key, lease=None):
    if lease is None:
        cur.execute("SELECT * FROM earmark_reserve(%s, %s, %s)", (account, amount, key))
    else:
        cur.execute("SELECT * FROM earmark_reserve(%s, %s, %s, lease => %s::interval)",
                    (account, amount, key, lease))
    return cur.fetchone()       # job_id, admitted, remaining, reason


def race(a):
    conns = [connect(a.dsn) for _ in range(a.sessions)]
    barrier = threading.Barrier(a.sessions)
    out = [None] * a.sessions

    def session(i):
        c = conns[i]
        cur = c.cursor()
        barrier.wait()
        try:
            cur.execute("BEGIN")
            job, admitted, _, reason = reserve(cur, a.account, a.amount, "%s-%d" % (a.key, i))
            time.sleep(a.hold)
            cur.execute("COMMIT")
            out[i] = ("admitted" if admitted else "refused", reason)
        except psycopg2.Error as e:
            out[i] = ("error", str(e).splitlines()[0])

    threads = [threading.Thread(target=session, args=(i,)) for i in range(a.sessions)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for kind in ("admitted", "refused", "error"):
        print("%s=%d" % (kind if kind != "error" else "errors", sum(1 for o in out if o[0] == kind)))
    for o in out:
        if o[0] != "admitted":
            print("reason=%s" % o[1])


def load(a):
    accounts = a.accounts.split(",")
    jobs = queue.Queue()
    for n in range(a.jobs):
        for acc in accounts:
            jobs.put((acc, n))
    lock = threading.Lock()
    counts = {acc: {"admitted": 0, "refused": 0, "errors": 0} for acc in accounts}
    reasons = {}
    conns = [connect(a.dsn) for _ in range(a.concurrency)]
    barrier = threading.Barrier(a.concurrency + 1)

    def worker(c):
        cur = c.cursor()
        barrier.wait()
        while True:
            try:
                acc, n = jobs.get_nowait()
            except queue.Empty:
                return
            kind = "errors"
            try:
                job, admitted, _, reason = reserve(cur, acc, a.amount, "%s-%s-%d" % (a.key, acc, n))
                if admitted:
                    cur.execute("SELECT * FROM earmark_charge(%s, %s, %s)", (acc, job, a.amount))
                    cur.fetchall()
                    cur.execute("SELECT * FROM earmark_settle(%s, %s, %s)", (acc, job, a.amount))
                    cur.fetchall()
                    kind = "admitted"
                else:
                    kind = "refused"
            except psycopg2.Error as e:
                reason = str(e).splitlines()[0]
            with lock:
                counts[acc][kind] += 1
                if kind != "admitted":
                    reasons[reason] = reasons.get(reason, 0) + 1

    threads = [threading.Thread(target=worker, args=(c,)) for c in conns]
    for t in threads:
        t.start()
    barrier.wait()
    t0 = time.monotonic()
    for t in threads:
        t.join()
    secs = time.monotonic() - t0
    total = sum(counts[acc]["admitted"] + counts[acc]["refused"] + counts[acc]["errors"] for acc in accounts)
    for kind in ("admitted", "refused", "errors"):
        print("%s=%d" % (kind, sum(counts[acc][kind] for acc in accounts)))
    # the accounts whose own counts are these (e.g. 100 admitted, 20 refused)
    shapes = {}
    for acc in accounts:
        s = "%d/%d/%d" % (counts[acc]["admitted"], counts[acc]["refused"], counts[acc]["errors"])
        shapes[s] = shapes.get(s, 0) + 1
    print("per_account=%s" % " ".join("%s:%d" % kv for kv in sorted(shapes.items())))
    for r, n in sorted(reasons.items()):
        print("reason=%d %s" % (n, r))
    print("seconds=%.3f" % secs)
    print("jobs_per_s=%.1f" % (total / secs))


def latency(a):
    c = connect(a.dsn)
    cur = c.cursor()

    def one(key):
        job = reserve(cur, a.account, 1, key, "1 hour")[0]
        if a.what == "job":
            cur.execute("SELECT * FROM earmark_charge(%s, %s, 1)", (a.account, job))
            cur.fetchall()
            cur.execute("SELECT * FROM earmark_settle(%s, %s, 1)", (a.account, job))
            cur.fetchall()

    for i in range(10):        # warm-up: connection caches, plans
        one("%s-warm-%d" % (a.key, i))
    ms = []
    for i in range(a.calls):
        t0 = time.perf_counter()
        one("%s-%d" % (a.key, i))
        ms.append((time.perf_counter() - t0) * 1000.0)
    ms.sort()
    print("median_ms=%.3f" % statistics.median(ms))
    print("p90_ms=%.3f" % ms[int(len(ms) * 0.9) - 1])


def crash(a):
    accounts = a.accounts.split(",")
    log = open(a.log, "a", buffering=1)
    loglock = threading.Lock()
    acked = {"R": 0, "S": 0, "E": 0}

    def note(line):
        with loglock:
            log.write(line + "\n")
            acked[line[0]] += 1

    def worker(w):
        c = None
        n = 0
        while not os.path.exists(a.stop_file):
            acc = accounts[(w + n) % len(accounts)]
            key = "%s-%d-%d" % (a.key, w, n)
            n += 1
            try:
                if c is None:
                    c = connect(a.dsn)
                cur = c.cursor()
                cur.execute("BEGIN")
                job, admitted, _, reason = reserve(cur, acc, 100, key, "1 hour")
                if not admitted:
                    cur.execute("ROLLBACK")
                    note("E %s refused %s" % (acc, reason))
                    continue
                cur.execute("SELECT * FROM earmark_charge(%s, %s, 60)", (acc, job))
                cur.fetchall()
                cur.execute("COMMIT")
                note("R %s %d 100 60" % (acc, job))
                cur.execute("SELECT charged FROM earmark_settle(%s, %s)", (acc, job))
                charged = cur.fetchone()[0]
                note("S %s %d %d" % (acc, job, charged))
            except psycopg2.Error as e:
                note("E %s %s" % (acc, str(e).splitlines()[0] if str(e) else type(e).__name__))
                try:
                    c.close()
                except Exception:
                    pass
                c = None
                time.sleep(0.2)

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(a.concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for k in ("R", "S", "E"):
        print("%s=%d" % ({"R": "reserved", "S": "settled", "E": "errors"}[k], acked[k]))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--dsn", required=True)
    p.add_argument("mode", choices=["race", "load", "latency", "crash"])
    p.add_argument("--account")
    p.add_argument("--accounts")
    p.add_argument("--sessions", type=int, default=5)
    p.add_argument("--amount", type=int, default=1000)
    p.add_argument("--hold", type=float, default=1.0)
    p.add_argument("--jobs", type=int, default=120)
    p.add_argument("--concurrency", type=int, default=50)
    p.add_argument("--calls", type=int, default=100)
    p.add_argument("--what", choices=["reserve", "job"], default="reserve")
    p.add_argument("--key", default="job")
    p.add_argument("--stop-file")
    p.add_argument("--log")
    a = p.parse_args()
    {"race": race, "load": load, "latency": latency, "crash": crash}[a.mode](a)


if __name__ == "__main__":
    sys.exit(main())
