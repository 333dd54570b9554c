#!/usr/bin/env python3
"""A randomized hunt for overspends through the batch calls.

test/hunt/hunt.py models the books of single calls; this one drives what it
does not: earmark_reserve_many and earmark_settle_many (repeated keys, mixed
features, repeated job ids), mixed with single reserves, charges past the
hold, heartbeats and settles, under READ COMMITTED, REPEATABLE READ and
SERIALIZABLE, inside savepoints that are rolled back or released, in
transactions that roll back or go through PREPARE TRANSACTION (when the
server allows it), with leases from 50 ms, sweeps, an admin raising limits
and changing escrow slots (by hand on one account, automatic on another,
none on the third).

Limits only go up and nothing records usage, so a strict rule holds in
every snapshot: for every budget of the run's accounts,

    sum(amount of its open holds) + sum(charged of its settled jobs) <= limit

A checker reads it in one REPEATABLE READ snapshot every 0.3 s while the
clients run, and again at the end and after the last leases passed and a
sweep; earmark_check() must then have no row for the run's accounts.

Environment: PGHOST, PGPORT, PGUSER, PGDATABASE (libpq's); BATCH_HUNT_SEED,
BATCH_HUNT_SECONDS (30), BATCH_HUNT_CLIENTS (6), BATCH_HUNT_RUN (the
accounts' prefix).  Results go to --results as lines "0|text" (held) or
"1|text" (failed), one per rule.

  BATCH_HUNT_SEED=N python3 test/hunt/batch_hunt.py --results FILE
"""
import argparse
import os
import random
import sys
import threading
import time

import psycopg2

SECONDS = float(os.environ.get('BATCH_HUNT_SECONDS', '30'))
CLIENTS = int(os.environ.get('BATCH_HUNT_CLIENTS', '6'))
SEED = int(os.environ.get('BATCH_HUNT_SEED', str(int(time.time()))))
RUN = os.environ.get('BATCH_HUNT_RUN', 'bh%d' % (SEED % 100000))
LIMIT = 100000
ACCOUNTS = ['%s_plain' % RUN, '%s_esc' % RUN, '%s_auto' % RUN]
FEATURES = ['default', 'f2']
# what concurrent calls may answer; anything else is counted, and an
# internal error or a lost connection fails the run
EXPECTED = {'40001', '40P01', 'EM001', '55P03', '55000'}

stop = threading.Event()
lock = threading.Lock()
over = []           # findings of the strict rule, live or at the end
stats = {'tx': 0, 'live_checks': 0, 'crashes': 0, 'codes': {}}


def conn():
    c = psycopg2.connect('')
    c.autocommit = True
    c.cursor().execute('SET earmark.rate_limit = 0')
    return c


def count_code(code, message):
    with lock:
        stats['codes'][code] = stats['codes'].get(code, 0) + 1
        if code not in EXPECTED:
            stats.setdefault('first_' + str(code), message)


def recover(c, cur, e):
    """After a call's error: count it, and roll back (or connect again)."""
    count_code(e.pgcode, str(e).splitlines()[0])
    if c.closed:
        c = conn()
        return c, c.cursor()
    cur.execute('ROLLBACK')
    return c, cur


def setup():
    cur = conn().cursor()
    for a in ACCOUNTS:
        for f in FEATURES:
            cur.execute('SELECT earmark_set_limit(%s, %s, %s)', (a, LIMIT, f))
    cur.execute('SELECT earmark_set_escrow(%s, 8)', (ACCOUNTS[1],))
    cur.execute('SHOW max_prepared_transactions')
    return int(cur.fetchone()[0]) >= CLIENTS


def strict_rule(cur, where):
    cur.execute("""
        SELECT j.account, j.feature, j.budget_id,
               sum(CASE WHEN j.status IN ('running', 'capped') THEN j.amount
                        ELSE coalesce(j.charged, 0) END),
               l.lim
          FROM earmark.job j JOIN earmark.account_limit l USING (account, feature)
         WHERE j.account LIKE %s
         GROUP BY 1, 2, 3, 5""", (RUN + '\\_%',))
    for acc, feat, bid, total, lim in cur.fetchall():
        if lim is not None and total > lim:
            over.append('%s: %s/%s budget %s holds and charged %s, limit %s' % (where, acc, feat, bid, total, lim))


def checker():
    c = conn()
    cur = c.cursor()
    while not stop.is_set():
        try:
            cur.execute('BEGIN ISOLATION LEVEL REPEATABLE READ')
            strict_rule(cur, 'live')
            cur.execute('COMMIT')
            with lock:
                stats['live_checks'] += 1
        except psycopg2.Error as e:
            count_code(e.pgcode, str(e).splitlines()[0])
            cur.execute('ROLLBACK')
        time.sleep(0.3)


def admin():
    rnd = random.Random(SEED * 7)
    c = conn()
    cur = c.cursor()
    while not stop.is_set():
        acc, feat = rnd.choice(ACCOUNTS), rnd.choice(FEATURES)
        try:
            r = rnd.random()
            if r < 0.5:
                cur.execute('SELECT earmark_set_limit(%s, lim + %s, %s) FROM earmark.account_limit '
                            'WHERE account = %s AND feature = %s',
                            (acc, rnd.choice([0, 0, 1, rnd.randint(1, 2000)]), feat, acc, feat))
            elif r < 0.7:
                cur.execute('SELECT earmark_set_escrow(%s, %s)', (acc, rnd.choice([0, 1, 2, 4, 8, 16])))
            elif r < 0.8:
                # a raise that rolls back must admit nothing for good
                cur.execute('BEGIN')
                cur.execute('SELECT earmark_set_limit(%s, lim + 100000, %s) FROM earmark.account_limit '
                            'WHERE account = %s AND feature = %s', (acc, feat, acc, feat))
                cur.execute('SELECT earmark_reserve(%s, 1, %s, %s)', (acc, 'adm%d' % rnd.randint(0, 10**9), feat))
                cur.execute('ROLLBACK')
            else:
                cur.execute('SELECT earmark_sweep()')
        except psycopg2.Error as e:
            c, cur = recover(c, cur, e)
        time.sleep(rnd.random() * 0.3)


class Client:
    def __init__(self, i, prepared):
        self.i = i
        self.rnd = random.Random(SEED * 100 + i)
        self.prepared = prepared
        self.jobs = []          # (account, job_id, amount) of committed admissions
        self.keyn = 0

    def key(self, spread):
        self.keyn += 1
        return 'k%d_%d' % (self.i, self.rnd.randint(max(0, self.keyn - spread), self.keyn))

    def reserve(self, cur, acc, feat):
        amt = self.rnd.randint(1, LIMIT // 4)
        lease = self.rnd.choice(['50 ms', '200 ms', '1 s', '5 s'])
        cur.execute('SELECT job_id, admitted FROM earmark_reserve(%s, %s, %s, %s, %s::interval)',
                    (acc, amt, self.key(20), feat, lease))
        job_id, admitted = cur.fetchone()
        return [(acc, job_id, amt)] if admitted else []

    def reserve_many(self, cur, acc):
        rnd = self.rnd
        n = rnd.randint(2, 6)
        keys = [self.key(10) for _ in range(n)]
        amts = [rnd.randint(1, LIMIT // 5) for _ in range(n)]
        first = {}
        for j, k in enumerate(keys):
            # a repeated key with its first amount is a repeat, with another EM001
            if k in first and rnd.random() < 0.8:
                amts[j] = first[k]
            first.setdefault(k, amts[j])
        feats = [rnd.choice(FEATURES) for _ in range(n)] if rnd.random() < 0.5 else None
        cur.execute('SELECT job_id, admitted, ord FROM earmark_reserve_many(%s, %s::bigint[], %s::text[], '
                    '%s::text[], %s::interval)',
                    (acc, amts, keys, feats, rnd.choice(['50 ms', '300 ms', '2 s'])))
        return [(acc, job_id, amts[o - 1]) for job_id, admitted, o in cur.fetchall() if admitted]

    def other_call(self, cur, acc, feat, op):
        rnd = self.rnd
        a, job_id, amt = rnd.choice(self.jobs)
        if op < 0.60:
            used = rnd.randint(0, amt * 2) if rnd.random() < 0.05 else rnd.randint(0, max(1, amt // 50))
            cur.execute('SELECT * FROM earmark_charge(%s, %s, %s, %s)',
                        (a, job_id, used, rnd.choice([None, rnd.randint(0, 5)])))
        elif op < 0.65:
            cur.execute('SELECT earmark_heartbeat(%s, %s)', (a, job_id))
        elif op < 0.78:
            used = rnd.choice([None, rnd.randint(0, max(1, amt // 30)),
                               rnd.randint(0, amt * 2) if rnd.random() < 0.05 else 0])
            cur.execute('SELECT * FROM earmark_settle(%s, %s, %s, %s)',
                        (a, job_id, used, rnd.choice(['completed', 'failed', 'cancelled'])))
        else:
            mine = [j for j in self.jobs if j[0] == acc] or [(a, job_id, amt)]
            pick = [rnd.choice(mine) for _ in range(rnd.randint(1, 5))]
            cur.execute('SELECT * FROM earmark_settle_many(%s, %s::bigint[], %s::bigint[])',
                        (pick[0][0], [p[1] for p in pick],
                         [rnd.choice([None, rnd.randint(0, max(1, p[2] // 30))]) for p in pick]))

    def statement(self, cur, acc, feat):
        rnd = self.rnd
        op = rnd.random()
        if op < 0.30:
            return self.reserve(cur, acc, feat)
        if op < 0.45:
            return self.reserve_many(cur, acc)
        if op < 0.90 and self.jobs:
            self.other_call(cur, acc, feat, op)
        elif op < 0.95:
            cur.execute('SELECT earmark_sweep()')
        else:
            cur.execute('SELECT * FROM earmark_budget(%s, %s)', (acc, feat))
        return []

    def end(self, cur, admitted):
        r = self.rnd.random()
        if self.prepared and r < 0.08:
            gid = '%s_%d_%d' % (RUN, self.i, self.keyn)
            cur.execute("PREPARE TRANSACTION '%s'" % gid)
            time.sleep(self.rnd.random() * 0.2)
            if self.rnd.random() < 0.8:
                cur.execute("COMMIT PREPARED '%s'" % gid)
                self.jobs.extend(admitted)
            else:
                cur.execute("ROLLBACK PREPARED '%s'" % gid)
        elif r < 0.85:
            cur.execute('COMMIT')
            self.jobs.extend(admitted)
        else:
            cur.execute('ROLLBACK')

    def transaction(self, cur):
        rnd = self.rnd
        acc, feat = rnd.choice(ACCOUNTS), rnd.choice(FEATURES)
        cur.execute('BEGIN ISOLATION LEVEL ' + rnd.choice(['READ COMMITTED'] * 6 + ['REPEATABLE READ', 'SERIALIZABLE']))
        admitted = []
        for _ in range(rnd.randint(1, 4)):
            savepoint = rnd.random() < 0.15
            if savepoint:
                cur.execute('SAVEPOINT s')
            got = self.statement(cur, acc, feat)
            if savepoint and rnd.random() < 0.6:
                cur.execute('ROLLBACK TO SAVEPOINT s')
            else:
                if savepoint:
                    cur.execute('RELEASE SAVEPOINT s')
                admitted.extend(got)
            if rnd.random() < 0.1:
                time.sleep(rnd.random() * 0.05)
        self.end(cur, admitted)

    def run(self):
        try:
            c = conn()
            cur = c.cursor()
            while not stop.is_set():
                try:
                    self.transaction(cur)
                    with lock:
                        stats['tx'] += 1
                except psycopg2.Error as e:
                    c, cur = recover(c, cur, e)
                self.jobs = self.jobs[-100:]
        except Exception as e:          # the client itself failed
            with lock:
                stats['crashes'] += 1
                stats.setdefault('crash', repr(e))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--results', required=True)
    args = ap.parse_args()
    prepared = setup()
    threads = [threading.Thread(target=Client(i, prepared).run) for i in range(CLIENTS)]
    threads += [threading.Thread(target=admin), threading.Thread(target=checker)]
    for t in threads:
        t.start()
    time.sleep(SECONDS)
    stop.set()
    for t in threads:
        t.join()
    cur = conn().cursor()
    live = len(over)
    strict_rule(cur, 'end')
    time.sleep(5.5)                     # the longest lease passes
    cur.execute('SELECT earmark_sweep()')
    strict_rule(cur, 'after the sweep')
    cur.execute('SELECT account, invariant FROM earmark_check() WHERE account LIKE %s', (RUN + '\\_%',))
    check_rows = cur.fetchall()
    bad_codes = {k: v for k, v in stats['codes'].items() if k is None or k[:2] in ('XX', '53', '58', '08')}
    print('# seed %d, run %s, prepared transactions %s: %r' % (SEED, RUN, 'on' if prepared else 'off', stats))
    for line in over[:20] + ['earmark_check: %r' % (r,) for r in check_rows[:20]]:
        print('# ' + line)
    results = [
        (stats['tx'] > 0 and stats['crashes'] == 0,
         'the clients ran %d transactions on %d clients for %.0f s, none of them failed itself (%d did)' % (
             stats['tx'], CLIENTS, SECONDS, stats['crashes'])),
        (not bad_codes, 'no call failed with an internal error or lost its connection (%r)' % bad_codes),
        (stats['live_checks'] > 0 and live == 0,
         'in %d snapshots while they ran, no budget held and charged more than its limit (%d findings)' % (
             stats['live_checks'], live)),
        (len(over) == live, 'at the end and after the last leases were swept, none did (%d findings)' % (len(over) - live)),
        (not check_rows, 'earmark_check() has no row for the run\'s accounts (%d)' % len(check_rows)),
    ]
    with open(args.results, 'w') as out:
        for good, text in results:
            out.write('%d|%s\n' % (0 if good else 1, text))
    return 0 if all(g for g, _ in results) else 1


if __name__ == '__main__':
    sys.exit(main())
