#!/usr/bin/env python3
"""test/hunt/hunt.py: a randomized concurrency hunt with its own model of the books.

    HUNT_SEED=N HUNT_SECONDS=60 HUNT_CLIENTS=16 HUNT_ACCOUNTS=4 python3 test/hunt/hunt.py --results FILE

README.  Many connections (HUNT_CLIENTS, default 16) hammer a few hot
accounts (HUNT_ACCOUNTS, 2 to 4) with random transactions of earmark_reserve,
earmark_charge, earmark_heartbeat, earmark_settle, earmark_record_usage
(corrections included), earmark_set_limit (up, down, NULL), earmark_set_escrow,
earmark_set_account (anchor changes, refused with EM002 while an account is in
use), earmark_sweep and earmark_budget: short leases, several calls per
transaction, deliberate ROLLBACKs, savepoints, REPEATABLE READ transactions
retried on 40001/40P01, a stretch with earmark.rate_limit on, and a killer
that terminates the clients' backends at random (the client reconnects and
learns the fate of its transaction from a marker row it inserts just before
COMMIT, or, for a lone call in autocommit, from the job's or the usage's
idempotency key).  Every call is logged with what it returned and with client
timestamps: when it was sent and when its transaction's COMMIT was
acknowledged.  The model below reads only that log (and, to compare, the
database) and checks, at quiet points (every client parked between
transactions) and at the end (every hold expired and swept):

  * every admission against the limit that could have been in force (sound,
    see below);
  * the books of every account, feature and cycle: held = the open holds,
    used = the ledger = what the model saw committed; each job settled at
    most once, never charged past its hold, expired only after its lease;
    recorded usage once per key; earmark_check() has no row the model cannot
    explain (over_limit after a limit was lowered);
  * heartbeats and charges: a job that was certainly live is not found dead,
    a job that was certainly settled is not found live;
  * an anchor change never commits while a hold was certainly open or usage
    certainly committed.

Soundness of the admission check.  For an admitted job A, sent at s_A and
committed (acknowledged) at a_A, the gate's check ran at some instant in
[s_A, a_A] and saw everything that committed before s_A.  A job B whose
admission was acknowledged before s_A counts its whole hold if its end is
certainly after a_A, and otherwise at least what it was finally charged
(used + held never grows after an admission).  B's end is bounded below by
the send time of every settle of B that may have committed, and by the
earliest instant its lease can have passed: each write of the lease (the
reserve, a charge, a heartbeat) sets its call's clock plus the lease, the
last writer wins (a call that waited for the job row can write after a
later one), so a write is certainly replaced only by one sent after it was
acknowledged, and the lease can pass at the lowest value that may still be
in force after it.  Positive recorded usage counts when its commit was
acknowledged before s_A, negative corrections whenever they may have
committed before a_A.  Calls of A's own transaction made before A count too.
This sum is a lower bound of what the check saw, in any order the server may
have taken; it is compared with the LARGEST limit any set_limit could have
put in force during [s_A, a_A] (every change that may have committed before
a_A and is not certainly overwritten before s_A).  All holds and usage of an
account and feature count together whatever their cycle: an anchor may only
change while the account has no usage and no hold, so in a correct run at
most one cycle is non-empty.  So a report is never a false alarm of
concurrency: A was admitted while the books, in every serial order
consistent with what the clients saw, had no room for it.  (Under REPEATABLE
READ the check's snapshot may be older than s_A; the model still expects
what committed before s_A to count: a reserve that admits against a limit or
usage it cannot see, instead of failing with 40001, is a defect, defects 3
and 9 below.)

Each admission found over its limit is tagged with what the database says
about it: holds in two cycles of one account (defect 2: escrow's fast path
races an anchor change), a REPEATABLE READ snapshot that fits where the
newer numbers do not (defects 3 and 9), or an admission from an escrow slot
(defect 8: released room handed out again while the budget is over its
limit).

The seed drives every random choice (amounts, keys, op mix, sleeps, kills);
the interleaving comes from the scheduler, so a replay of a seed is the same
kind of run, not the same run.  Results go to --results as lines
"0|description" (pass) or "1|description" (fail) for test/integration/hunt.sh.

Knobs (environment): HUNT_SEED, HUNT_SECONDS (60), HUNT_CLIENTS (16),
HUNT_ACCOUNTS (4), HUNT_QUIET (20: seconds between quiet checks), HUNT_KILL
(1.5: mean seconds between kills, 0 for none), HUNT_ESCROW (1; 0: no escrow
anywhere), HUNT_RR (0.2: share of REPEATABLE READ transactions), HUNT_RATE
(1; 0: the rate limit always off), HUNT_BIAS (1; 0: no phases, a flat mix).
HUNT_CLIENTS=1 HUNT_ESCROW=0 is the serial control: it must report clean.
"""
import argparse
import bisect
import collections
import heapq
import os
import random
import sys
import threading
import time
import traceback

import psycopg2

# --------------------------------------------------------------------------
# settings
# --------------------------------------------------------------------------


def env_num(name, default, kind=float):
    v = os.environ.get(name, '')
    return kind(v) if v.strip() else default


SEED = env_num('HUNT_SEED', random.SystemRandom().randrange(1, 2**31 - 1), int)
SECONDS = env_num('HUNT_SECONDS', 60.0)
CLIENTS = env_num('HUNT_CLIENTS', 16, int)
ACCOUNTS = max(2, min(4, env_num('HUNT_ACCOUNTS', 4, int)))
QUIET = env_num('HUNT_QUIET', 20.0)
KILL = env_num('HUNT_KILL', 1.5)
ESCROW = env_num('HUNT_ESCROW', 1, int)
RR_SHARE = env_num('HUNT_RR', 0.2)
RATE = env_num('HUNT_RATE', 1, int)
BIAS = env_num('HUNT_BIAS', 1, int)
DB = os.environ.get('HUNT_DB', 'postgres')

LIMIT = 1000            # every account's base limit (feature default)
LIMIT_F2 = 400          # the escrow account's second feature
MARGIN = 0.003          # seconds: client and server read the same clock; rounding
CALL_TIMEOUT_MS = 20000
EXPECTED = {            # SQLSTATEs a call may raise without it being a finding
    '*': {'40001', '40P01'},
    'set_account': {'EM002'},
    'record_usage': {'22023'},   # a correction larger than the cycle's usage
}
T0 = time.time()
# the run's name: its accounts' prefix and its marker rows' (test/integration/hunt.sh sets it)
RUN = os.environ.get('HUNT_RUN') or 'hunt%dx%d' % (SEED % 1000000, os.getpid())


def now():
    return time.time()


def rel(t):
    return '%.3f' % (t - T0) if t is not None else '-'


def say(*a):
    print('#', *a, flush=True)


# --------------------------------------------------------------------------
# the log: every transaction and every call, with client timestamps
# --------------------------------------------------------------------------

class Call:
    __slots__ = ('tx', 'fn', 'acct', 'feat', 'args', 'sent', 'ret', 'res', 'err', 'sp', 'msg')

    def __init__(self, tx, fn, acct, feat, args, sp):
        self.tx, self.fn, self.acct, self.feat, self.args, self.sp = tx, fn, acct, feat, args, sp
        self.sent = self.ret = self.res = self.err = self.msg = None

    def ok(self):
        """the call's effect is in the database: its transaction committed and it did not fail"""
        return self.err is None and self.tx.fate == 'committed'

    def maybe(self):
        """the call's effect may be in the database"""
        return self.err is None and self.res is not None and self.tx.fate in ('committed', 'unknown')

    def __str__(self):
        r = self.err if self.err else self.res
        return '%s(%s) sent %s ret %s -> %s [tx %d %s %s%s ack %s, client %d]' % (
            self.fn, ', '.join(repr(a) for a in self.args), rel(self.sent), rel(self.ret), r,
            self.tx.id, self.tx.iso, self.tx.fate, ' auto' if self.tx.auto else '',
            rel(self.tx.ack), self.tx.client)


class Tx:
    __slots__ = ('id', 'client', 'iso', 'rate', 'auto', 'calls', 't0', 'ack', 'fate', 'marker', 'why', 'plan', 'holds')
    _n = 0
    _lock = threading.Lock()

    def __init__(self, client, iso, rate, auto, plan):
        with Tx._lock:
            Tx._n += 1
            self.id = Tx._n
        self.client, self.iso, self.rate, self.auto, self.plan = client, iso, rate, auto, plan
        self.calls = []
        self.t0 = self.ack = None
        self.fate = 'pending'
        self.marker = '%s-%d' % (RUN, self.id)
        self.why = None
        self.holds = {}


class Finding:
    def __init__(self, check, text, detail=()):
        self.check, self.text, self.detail = check, text, list(detail)


# --------------------------------------------------------------------------
# the live view the clients plan with (not the model: only a guide)
# --------------------------------------------------------------------------

class LiveJob:
    __slots__ = ('job_id', 'acct', 'feat', 'amount', 'lease', 'lease_end', 'settle_after', 'claimed', 'used', 'step')

    def __init__(self, job_id, acct, feat, amount, lease, lease_end, settle_after):
        self.job_id, self.acct, self.feat, self.amount, self.lease = job_id, acct, feat, amount, lease
        self.lease_end, self.settle_after = lease_end, settle_after
        self.claimed = False
        self.used = 0
        self.step = 0


class Account:
    def __init__(self, name, kind, anchors):
        self.name, self.kind = name, kind
        self.feats = ['default', 'f2'] if kind == 'escrow' else ['default']
        self.base = {'default': LIMIT, 'f2': LIMIT_F2}
        self.limit = dict(self.base)
        self.used = {f: 0 for f in self.feats}     # estimate: charged + recorded
        self.jobs = {}                               # job_id -> LiveJob
        self.inflight = 0
        self.anchors = anchors
        self.anchor_i = 0
        self.retired = False
        self.phase = 'mix'
        self.phase_until = 0.0
        self.anchor_busy = False
        self.usage_keys = []                         # (key, units, feat) committed
        self.reserve_keys = []                       # (key, amount, feat) admitted


class Live:
    def __init__(self):
        self.lock = threading.Lock()
        self.accounts = []
        self.retired = []
        self.key_n = 0
        self.rate_until = 0.0

    def key(self, tag):
        with self.lock:
            self.key_n += 1
            return '%s-%d-%d' % (tag, SEED, self.key_n)

    def held(self, a, feat='default'):
        return sum(j.amount for j in a.jobs.values() if j.feat == feat)


# --------------------------------------------------------------------------
# a client: one connection, one thread
# --------------------------------------------------------------------------

class Killed(Exception):
    pass


class Client(threading.Thread):
    def __init__(self, idx, hunt):
        super().__init__(name='client-%d' % idx, daemon=True)
        self.idx, self.hunt = idx, hunt
        self.rng = random.Random(SEED * 1009 + idx)
        self.log = []
        self.conn = None
        self.pid = None
        self.busy = False
        self.phase = None      # 'call', 'commit', 'auto', None
        self.connect()

    def connect(self):
        for attempt in range(200):
            try:
                # the thousands of expected 40001s stay out of the server log
                self.conn = psycopg2.connect(dbname=DB, options='-c earmark.rate_limit=0 '
                                             '-c deadlock_timeout=50ms -c statement_timeout=%d '
                                             '-c client_min_messages=error -c log_min_messages=fatal '
                                             '-c log_min_error_statement=panic' % CALL_TIMEOUT_MS)
                self.conn.autocommit = True
                self.cur = self.conn.cursor()
                self.pid = self.conn.get_backend_pid()
                return
            except psycopg2.OperationalError:
                time.sleep(0.05)
        raise RuntimeError('cannot connect')

    # ---- one call ------------------------------------------------------
    def call(self, tx, fn, acct, feat, sql, args, sp=False):
        c = Call(tx, fn, acct, feat, args, sp)
        tx.calls.append(c)
        if sp:
            self.cur.execute('SAVEPOINT hunt_sp')
        self.phase = 'auto' if tx.auto else 'call'
        c.sent = now()
        try:
            self.cur.execute(sql, args)
            c.res = self.cur.fetchone()
            c.ret = now()
        except psycopg2.Error as e:
            c.ret = now()
            if self.lost(e):
                c.err = 'CONN'
                raise Killed()
            c.err = e.pgcode or '?????'
            c.msg = (e.pgerror or str(e)).strip().splitlines()[0][:200] if (e.pgerror or str(e)) else ''
            if sp and c.err in EXPECTED.get(fn, ()):
                self.cur.execute('ROLLBACK TO SAVEPOINT hunt_sp')
                return None
            raise
        finally:
            self.phase = None
        if sp:
            self.cur.execute('RELEASE SAVEPOINT hunt_sp')
        return c.res

    def lost(self, e):
        return self.conn.closed != 0 or e.pgcode in ('57P01', '57P02', '57P03') or \
            (isinstance(e, (psycopg2.OperationalError, psycopg2.InterfaceError)) and e.pgcode is None)

    # ---- one transaction, retried on 40001 / 40P01 -----------------------
    def run_tx(self, body, iso='rc', rate=None, rollback=False, auto=False, tries=3, plan=''):
        tx = None
        for attempt in range(tries):
            tx = Tx(self.idx, iso, rate, auto, plan)
            self.log.append(tx)
            self.busy = True
            try:
                if auto:
                    tx.t0 = now()
                    body(self, tx)
                    tx.ack = now()
                    tx.fate = 'committed'
                    return tx
                self.cur.execute('BEGIN ISOLATION LEVEL REPEATABLE READ' if iso == 'rr' else 'BEGIN')
                if rate is not None:
                    self.cur.execute('SET LOCAL earmark.rate_limit = %s' % int(rate))
                tx.t0 = now()
                body(self, tx)
                if rollback:
                    self.cur.execute('ROLLBACK')
                    tx.fate, tx.ack, tx.why = 'rolledback', now(), 'ROLLBACK'
                    return tx
                self.cur.execute('INSERT INTO hunt.tx_marker VALUES (%s)', (tx.marker,))
                self.phase = 'commit'
                self.cur.execute('COMMIT')
                self.phase = None
                tx.ack = now()
                tx.fate = 'committed'
                return tx
            except (Killed, psycopg2.Error) as e:
                killed = isinstance(e, Killed) or self.lost(e)
                if killed:
                    tx.fate = 'unknown' if (self.phase == 'commit' or auto) else 'rolledback'
                    tx.why = 'killed in %s' % (self.phase or 'call')
                    self.phase = None
                    self.recover(tx)
                    return tx
                self.phase = None
                code = e.pgcode or '?????'
                try:
                    if not auto:
                        self.cur.execute('ROLLBACK')
                except psycopg2.Error:
                    self.recover(None)
                tx.fate, tx.ack, tx.why = 'rolledback', now(), code
                if code in EXPECTED['*']:
                    time.sleep(self.rng.uniform(0, 0.01 * (attempt + 1)))
                    continue
                last = tx.calls[-1] if tx.calls else None
                if last is None or code not in EXPECTED.get(last.fn, ()):
                    self.hunt.unexpected(tx, code, (e.pgerror or str(e)).strip())
                return tx
            finally:
                self.busy = False
        return tx

    # ---- after a kill: reconnect, wait for the old backend, learn the fate --
    def recover(self, tx):
        """reconnect (again, if the killer hits the new connection too) and learn the fate"""
        old = self.pid
        for attempt in range(50):
            try:
                self.resolve(tx, old)
                return
            except psycopg2.Error:
                time.sleep(0.01)
        raise RuntimeError('cannot recover from a kill')

    def resolve(self, tx, old):
        try:
            self.conn.close()
        except Exception:
            pass
        self.connect()
        deadline = now() + 30
        while now() < deadline:
            self.cur.execute('SELECT count(*) FROM pg_stat_activity WHERE pid = %s', (old,))
            if self.cur.fetchone()[0] == 0:
                break
            time.sleep(0.005)
        if tx is None:
            return
        if tx.fate == 'unknown':
            if tx.auto:
                c = tx.calls[0]
                row = None
                if c.fn == 'reserve':
                    self.cur.execute('SELECT job_id, amount FROM earmark.job WHERE account = %s AND idempotency_key = %s',
                                     (c.acct, c.args[2]))
                    row = self.cur.fetchone()
                    if row:
                        c.res, c.err = (row[0], True, None, 'resolved'), None
                elif c.fn == 'record_usage':
                    self.cur.execute('SELECT units FROM earmark.ledger WHERE account = %s AND entry_key = %s',
                                     (c.acct, c.args[2]))
                    row = self.cur.fetchone()
                    if row:
                        c.res, c.err = (True,), None
                committed = row is not None
            else:
                self.cur.execute('SELECT 1 FROM hunt.tx_marker WHERE marker = %s', (tx.marker,))
                committed = self.cur.fetchone() is not None
            tx.fate = 'committed' if committed else 'rolledback'
        tx.ack = now()

    def run(self):
        try:
            while not self.hunt.stop.is_set():
                self.hunt.park(self)
                if self.hunt.stop.is_set():
                    break
                self.hunt.planner.step(self)
        except Exception:
            self.hunt.crash(traceback.format_exc())


# --------------------------------------------------------------------------
# the calls
# --------------------------------------------------------------------------

SQL = {
    'reserve': 'SELECT job_id, admitted, remaining, reason FROM earmark_reserve(%s, %s, %s, %s, %s::interval)',
    'charge': 'SELECT charged, capped, room, status FROM earmark_charge(%s, %s, %s, %s)',
    'heartbeat': 'SELECT extract(epoch FROM earmark_heartbeat(%s, %s))::float8',
    'settle': 'SELECT charged, released, status FROM earmark_settle(%s, %s, %s, %s)',
    'record_usage': 'SELECT earmark_record_usage(%s, %s, %s, %s)',
    'set_limit': 'SELECT earmark_set_limit(%s, %s, %s)',
    'set_escrow': 'SELECT earmark_set_escrow(%s, %s)',
    'set_account': 'SELECT earmark_set_account(%s, %s::timestamptz)',
    'sweep': 'SELECT earmark_sweep(%s)',
    'budget': 'SELECT lim, used, held, remaining FROM earmark_budget(%s, %s)',
}


def c_reserve(cl, tx, acct, feat, amount, key, lease):
    return cl.call(tx, 'reserve', acct, feat, SQL['reserve'], (acct, amount, key, feat, '%d milliseconds' % int(lease * 1000)))


def c_charge(cl, tx, j, tokens, step):
    return cl.call(tx, 'charge', j.acct, j.feat, SQL['charge'], (j.acct, j.job_id, tokens, step))


def c_heartbeat(cl, tx, j):
    return cl.call(tx, 'heartbeat', j.acct, j.feat, SQL['heartbeat'], (j.acct, j.job_id))


def c_settle(cl, tx, j, used, outcome):
    return cl.call(tx, 'settle', j.acct, j.feat, SQL['settle'], (j.acct, j.job_id, used, outcome))


def c_usage(cl, tx, acct, feat, units, key, sp=False):
    return cl.call(tx, 'record_usage', acct, feat, SQL['record_usage'], (acct, units, key, feat), sp=sp)


def c_set_limit(cl, tx, acct, feat, lim):
    return cl.call(tx, 'set_limit', acct, feat, SQL['set_limit'], (acct, lim, feat))


def c_set_escrow(cl, tx, acct, n):
    return cl.call(tx, 'set_escrow', acct, None, SQL['set_escrow'], (acct, n))


def c_set_account(cl, tx, acct, anchor, sp=False):
    return cl.call(tx, 'set_account', acct, None, SQL['set_account'], (acct, anchor), sp=sp)


def c_sweep(cl, tx, n):
    return cl.call(tx, 'sweep', None, None, SQL['sweep'], (n,))


def c_budget(cl, tx, acct, feat):
    return cl.call(tx, 'budget', acct, feat, SQL['budget'], (acct, feat))


# --------------------------------------------------------------------------
# the planner: a random mix, with phases that favour the known races
# --------------------------------------------------------------------------

class Planner:
    """Picks each client's next transaction.  Kinds of account:

    escrow  escrow slots, two features, everything (usage, corrections,
            limit changes, charges);
    zero    escrow with 1 or 2 slots and never any use (settles at 0), so
            that its anchor may change: phases fill, drain, anchor (an
            anchor change held open in its transaction while other clients
            go on reserving), fill.  An account whose anchor can no longer
            change (a job taken from one slot was settled into another,
            which leaves a slot's held below zero for good) is retired for
            a fresh one;
    plain   no escrow, everything;
    usage   escrow, heavy recorded usage and corrections.

    The other accounts go through squeeze phases (with HUNT_BIAS=1): the
    limit lowered to just below what is used and held, or a burst of
    usage, then settles that release room, then reserves."""

    def __init__(self, hunt):
        self.hunt = hunt
        self.live = hunt.live

    # ---- helpers ----------------------------------------------------------
    def lease(self, rng, a):
        if a.kind == 'zero':
            return rng.choice([1.5, 2.5, 4.0])
        return rng.choice([0.3, 0.6, 1.0, 2.0, 4.0])

    def iso(self, rng):
        return 'rr' if rng.random() < RR_SHARE else 'rc'

    def rate(self, rng):
        if RATE and now() < self.live.rate_until:
            return rng.choice([60, 600, 100000])
        return None

    def feat(self, rng, a):
        return 'f2' if len(a.feats) > 1 and rng.random() < 0.2 else 'default'

    def amount(self, rng, a, feat):
        lim = a.base[feat]
        if a.kind == 'zero' and a.phase in ('fill', 'mix'):
            return rng.randint(lim // 10, lim // 3)
        r = rng.random()
        if r < 0.6:
            return rng.randint(1, lim // 40)
        if r < 0.92:
            return rng.randint(lim // 40, lim // 8)
        return rng.randint(lim // 8, lim * 2 // 5)

    def hold(self, rng, a):
        if rng.random() < (0.07 if a.kind != 'zero' else 0.02):
            return 1e9              # abandoned: its lease will pass
        return rng.uniform(0.0, 1.2) if a.kind != 'zero' else rng.uniform(0.2, 1.5)

    def maybe_sleep(self, rng, p=0.15, top=0.02):
        if rng.random() < p:
            time.sleep(rng.uniform(0, top))

    def pick_account(self, rng):
        with self.live.lock:
            accts = [a for a in self.live.accounts if not a.retired]
        w = [2.0 if a.kind == 'zero' and a.phase in ('drain', 'anchor') else 1.0 for a in accts]
        return rng.choices(accts, w)[0]

    def purge(self):
        """jobs whose lease passed long ago: the sweeper has them"""
        t = now()
        with self.live.lock:
            for a in self.live.accounts + self.live.retired:
                for j in list(a.jobs.values()):
                    if j.lease_end < t - 0.5 and not j.claimed:
                        del a.jobs[j.job_id]
                        a.used[j.feat] += j.used

    def claim(self, rng, a=None, due=True, settle=True):
        """a live job to settle (claimed) or to charge or heartbeat"""
        with self.live.lock:
            pool = []
            for acc in ([a] if a else self.live.accounts + self.live.retired):
                if acc is None:
                    continue
                drain = acc.phase in ('drain', 'anchor') or acc.retired
                for j in acc.jobs.values():
                    if settle and j.claimed and rng.random() > 0.03:
                        continue        # now and then two settles race
                    if due and j.settle_after > now() and not drain:
                        continue
                    pool.append(j)
            if not pool:
                return None
            j = rng.choice(pool)
            if settle:
                j.claimed = True
            return j

    def unclaim(self, jobs):
        with self.live.lock:
            for j in jobs:
                j.claimed = False

    # ---- phases -------------------------------------------------------------
    def phase(self, rng, a):
        t = now()
        with self.live.lock:
            if not BIAS:
                a.phase = 'mix'
                return a.phase
            if a.kind == 'zero':
                if a.phase == 'mix':
                    a.phase, a.phase_until = 'fill', t + rng.uniform(0.5, 2.5)
                elif a.phase == 'fill' and t > a.phase_until:
                    a.phase, a.phase_until = 'drain', t + rng.uniform(1.0, 3.0)
                elif a.phase == 'drain' and ((not a.jobs and a.inflight == 0) or t > a.phase_until):
                    a.phase, a.phase_until = 'anchor', t + 5.0
                elif a.phase == 'anchor' and t > a.phase_until and not a.anchor_busy:
                    a.phase, a.phase_until = 'fill', t + rng.uniform(0.5, 2.5)
            elif t > a.phase_until:
                if a.phase == 'mix' and rng.random() < 0.6:
                    a.phase, a.phase_until = 'squeeze', t + rng.uniform(0.5, 2.0)
                else:
                    a.phase, a.phase_until = 'mix', t + rng.uniform(1.0, 4.0)
            return a.phase

    # ---- one step of a client ----------------------------------------------
    def step(self, cl):
        rng = cl.rng
        if RATE and rng.random() < 0.0008:
            self.live.rate_until = now() + rng.uniform(1, 3)
        if rng.random() < 0.05:
            self.purge()
        a = self.pick_account(rng)
        ph = self.phase(rng, a)
        if a.kind == 'zero' and BIAS:
            return self.step_zero(cl, a, ph)
        ops = {'reserve': 30, 'settle': 22, 'charge': 10, 'heartbeat': 4, 'usage': 6, 'limit': 3,
               'escrow': 1, 'anchor': 1, 'sweep': 1, 'budget': 2, 'rr_reserve': 5, 'multi': 6}
        if a.kind == 'usage':
            ops['usage'] = 14
        if a.kind == 'zero':
            ops.update(usage=0, anchor=3)
        if ph == 'squeeze':
            ops.update(reserve=25, settle=30, limit=8, usage=6, multi=3)
        if rng.random() < 0.5:
            feat = self.feat(rng, a)
            with self.live.lock:
                high = a.used[feat] > a.base[feat] * 0.5
                unlimited = a.limit[feat] is None
            if high and a.kind != 'zero':
                ops = {'usage': 1}      # a correction brings the usage down again
            elif unlimited and rng.random() < 0.3:
                ops = {'limit': 1}
        op = rng.choices(list(ops), list(ops.values()))[0]
        getattr(self, 'op_' + op)(cl, a, ph)

    def step_zero(self, cl, a, ph):
        rng = cl.rng
        if ph == 'anchor':
            with self.live.lock:
                mine = not a.anchor_busy and not a.retired
                if mine:
                    a.anchor_busy = True
            if mine:
                return self.op_anchor_zero(cl, a)
            if rng.random() < 0.6:
                return self.op_reserve(cl, a, ph, rate=None)
            return self.op_settle(cl, a, ph)
        if ph == 'drain':
            r = rng.random()
            if r < 0.03:
                return self.op_reserve(cl, a, ph)
            if r < 0.1:
                return self.op_heartbeat(cl, a, ph)
            return self.op_settle(cl, a, ph)
        ops = {'reserve': 40, 'settle': 25, 'charge': 5, 'heartbeat': 5, 'limit': 2, 'escrow': 1,
               'anchor': 2, 'sweep': 1, 'budget': 2, 'rr_reserve': 3}
        op = rng.choices(list(ops), list(ops.values()))[0]
        if op in ('reserve', 'rr_reserve') and RATE:
            # mostly the slow path (the rate limit on, far above the rate):
            # holds in the budget row settle back into it, so the account
            # stays empty enough for its anchor to move; the fast path's
            # reserves come in the anchor phase
            return getattr(self, 'op_' + op)(cl, a, ph, rate=1000000)
        getattr(self, 'op_' + op)(cl, a, ph)

    # ---- after a transaction: the live view --------------------------------
    def after(self, tx, accts=()):
        t = now()
        with self.live.lock:
            for a in accts:
                a.inflight -= 1
            if tx.fate != 'committed':
                return
            for c in tx.calls:
                if c.err is not None or c.res is None:
                    continue
                a = self.hunt.account(c.acct) if c.acct else None
                if c.fn == 'reserve' and c.res[1] and c.res[3] in (None, 'resolved'):
                    lease = int(c.args[4].split()[0]) / 1000.0
                    hold = tx.holds.get(c.args[2], 0.3)
                    a.jobs[c.res[0]] = LiveJob(c.res[0], c.acct, c.feat, c.args[1], lease, c.sent + lease,
                                               t + hold)
                    a.reserve_keys.append((c.args[2], c.args[1], c.feat))
                    del a.reserve_keys[:-200]
                elif c.fn == 'settle':
                    j = self.hunt.live_job(c.args[1])
                    if j:
                        acc = self.hunt.account(j.acct)
                        acc.jobs.pop(j.job_id, None)
                        acc.used[j.feat] += c.res[0]
                elif c.fn == 'charge':
                    j = self.hunt.live_job(c.args[1])
                    if j:
                        j.used += c.res[0]
                        if c.res[3] in ('running', 'capped'):
                            j.lease_end = c.sent + j.lease
                elif c.fn == 'heartbeat':
                    j = self.hunt.live_job(c.args[1])
                    if j and c.res[0] is not None:
                        j.lease_end = c.res[0]
                elif c.fn == 'record_usage' and c.res[0]:
                    a.used[c.feat] += c.args[1]
                    a.usage_keys.append((c.args[2], c.args[1], c.feat))
                elif c.fn == 'set_limit':
                    a.limit[c.feat] = c.args[1]
                elif c.fn == 'set_account':
                    a.anchor_i = a.anchors.index(c.args[1]) if c.args[1] in a.anchors else a.anchor_i

    def start(self, accts):
        with self.live.lock:
            for a in accts:
                a.inflight += 1

    # ---- the transactions ---------------------------------------------------
    def op_reserve(self, cl, a, ph, extra=True, rate=False):
        rng = cl.rng
        feat = self.feat(rng, a)
        amount = self.amount(rng, a, feat)
        key = self.live.key('r')
        repeat = False
        with self.live.lock:
            if a.reserve_keys and rng.random() < 0.03:
                key, amount, feat = rng.choice(a.reserve_keys)      # a repeat: already admitted
                repeat = True
        lease = self.lease(rng, a)
        auto = rng.random() < 0.3 and not repeat    # a killed lone repeat could not be told from the first
        charge = extra and not auto and a.kind != 'zero' and rng.random() < 0.3
        settle = extra and not auto and rng.random() < 0.08
        tokens = rng.randint(0, amount) if a.kind != 'zero' else 0

        def body(cl, tx):
            tx.holds[key] = self.hold(rng, a)
            r = c_reserve(cl, tx, a.name, feat, amount, key, lease)
            if r[1] and (charge or settle):
                j = LiveJob(r[0], a.name, feat, amount, lease, 0, 0)
                self.maybe_sleep(rng)
                if charge:
                    c_charge(cl, tx, j, tokens, 1)
                if settle:
                    c_settle(cl, tx, j, None if a.kind != 'zero' else 0, rng.choice(['completed', 'failed', 'cancelled']))

        self.start([a])
        if rate is not False:
            auto = False        # the rate limit is set in the transaction
        tx = cl.run_tx(body, iso=self.iso(rng) if not auto else 'rc',
                       rate=None if auto else (self.rate(rng) if rate is False else rate),
                       rollback=not auto and rng.random() < 0.06, auto=auto, plan='reserve')
        self.after(tx, [a])

    def settle_args(self, rng, a, j, ph):
        if a.kind == 'zero':
            return (0 if rng.random() < 0.7 else None), rng.choice(['completed', 'failed', 'cancelled'])
        if ph == 'squeeze' and rng.random() < 0.6:
            used = 0
        elif rng.random() < 0.5:
            used = None
        else:
            used = rng.randint(0, j.amount * 6 // 5)
        return used, rng.choice(['completed', 'completed', 'failed', 'cancelled'])

    def op_settle(self, cl, a, ph):
        rng = cl.rng
        jobs = []
        for i in range(1 if rng.random() < 0.8 else 2):
            j = self.claim(rng, a if (a.kind == 'zero' or rng.random() < 0.7) else None)
            if j:
                jobs.append(j)
        if not jobs:
            return self.op_heartbeat(cl, a, ph) if rng.random() < 0.3 else None
        args = [self.settle_args(rng, self.hunt.account(j.acct), j, ph) for j in jobs]

        def body(cl, tx):
            for j, (used, outcome) in zip(jobs, args):
                c_settle(cl, tx, j, used, outcome)
                self.maybe_sleep(rng)

        tx = cl.run_tx(body, iso=self.iso(rng), rate=self.rate(rng), rollback=rng.random() < 0.05, plan='settle')
        self.after(tx)
        if tx.fate != 'committed':
            self.unclaim(jobs)
        else:
            with self.live.lock:
                for j in jobs:      # already ended (charged 0, released 0): gone
                    self.hunt.account(j.acct).jobs.pop(j.job_id, None)

    def op_charge(self, cl, a, ph):
        rng = cl.rng
        j = self.claim(rng, a, due=False, settle=False)
        if not j:
            return
        zero = a.kind == 'zero'
        steps = []
        for i in range(rng.choice([1, 1, 2, 3])):
            tokens = 0 if zero else rng.randint(0, max(1, j.amount // 3))
            r = rng.random()
            if r < 0.5:
                j.step += 1
                step = j.step
            elif r < 0.6:
                step = max(0, j.step - rng.randint(0, 1))
            else:
                step = None
            steps.append((tokens, step))

        def body(cl, tx):
            for tokens, step in steps:
                c_charge(cl, tx, j, tokens, step)
                self.maybe_sleep(rng)

        tx = cl.run_tx(body, iso=self.iso(rng), rollback=rng.random() < 0.05, plan='charge')
        self.after(tx)

    def op_heartbeat(self, cl, a, ph):
        rng = cl.rng
        j = self.claim(rng, a, due=False, settle=False)
        if not j:
            return

        def body(cl, tx):
            c_heartbeat(cl, tx, j)

        tx = cl.run_tx(body, iso=self.iso(rng), plan='heartbeat')
        self.after(tx)

    def op_usage(self, cl, a, ph):
        rng = cl.rng
        feat = self.feat(rng, a)
        key = self.live.key('u')
        lim = a.base[feat]
        with self.live.lock:
            used = a.used[feat]
            old = rng.choice(a.usage_keys) if a.usage_keys and rng.random() < 0.05 else None
        sp = False
        if old:
            key, units, feat = old
        elif ph == 'squeeze' and rng.random() < 0.3:
            units = rng.randint(lim * 3 // 10, lim)
        elif used > lim * 0.4 or (used > 0 and rng.random() < 0.15):
            if rng.random() < 0.1:
                units = -(used + rng.randint(1, 100))       # too large: 22023
            elif used > lim * 0.4:
                units = -max(1, used - rng.randint(0, lim // 4))
            else:
                units = -rng.randint(1, max(1, int(used * 0.8)))
            sp = rng.random() < 0.5
        else:
            units = rng.randint(1, lim // 25)
        # a lone call in autocommit learns its fate from its key's ledger row
        # after a kill: not for a repeat, whose key's row is the first call's
        auto = not sp and not old and rng.random() < 0.3

        def body(cl, tx):
            c_usage(cl, tx, a.name, feat, units, key, sp=sp)

        tx = cl.run_tx(body, iso='rc' if auto else self.iso(rng), auto=auto,
                       rollback=not auto and rng.random() < 0.05, plan='usage')
        self.after(tx)

    def op_limit(self, cl, a, ph):
        rng = cl.rng
        feat = self.feat(rng, a)
        base = a.base[feat]
        with self.live.lock:
            est = a.used[feat] + self.live.held(a, feat)
        r = rng.random()
        if a.limit[feat] is None and r < 0.7:
            lim = base              # unlimited only for a moment
        elif ph == 'squeeze' or r < 0.15:
            lim = max(0, min(est, base * 6 // 5) - rng.randint(0, base // 10))
        elif r < 0.5:
            lim = base
        elif r < 0.88:
            lim = rng.randint(base // 2, base * 3 // 2)
        else:
            lim = None

        def body(cl, tx):
            c_set_limit(cl, tx, a.name, feat, lim)

        tx = cl.run_tx(body, rollback=rng.random() < 0.05, plan='limit')
        self.after(tx)

    def op_escrow(self, cl, a, ph):
        rng = cl.rng
        if not ESCROW or a.kind == 'plain':
            n = 0
        elif a.kind == 'zero':
            n = 1       # one slot: a job taken from it settles back into it
        else:
            n = rng.choice([0, 2, 4, 4, 8])

        def body(cl, tx):
            c_set_escrow(cl, tx, a.name, n)

        tx = cl.run_tx(body, plan='escrow')
        self.after(tx)

    def op_anchor(self, cl, a, ph):
        rng = cl.rng
        anchor = rng.choice(a.anchors)
        sp = rng.random() < 0.5

        def body(cl, tx):
            c_set_account(cl, tx, a.name, anchor, sp=sp)
            self.maybe_sleep(rng, 0.5, 0.05)

        tx = cl.run_tx(body, plan='anchor')
        self.after(tx)

    def op_anchor_zero(self, cl, a):
        """the anchor change of an account that just became empty, held open"""
        rng = cl.rng
        with self.live.lock:
            anchor = a.anchors[(a.anchor_i + 1) % len(a.anchors)]
            empty_before = not a.jobs and a.inflight == 0
        hold = rng.uniform(0.02, 0.4)

        def body(cl, tx):
            c_set_account(cl, tx, a.name, anchor)
            time.sleep(hold)

        tx = cl.run_tx(body, plan='anchor-zero')
        self.after(tx)
        with self.live.lock:
            empty_after = not a.jobs and a.inflight == 0
            a.anchor_busy = False
            a.phase, a.phase_until = 'fill', now() + rng.uniform(0.5, 2.5)
        if tx.why == 'EM002' and empty_before and empty_after:
            self.hunt.rotate(cl, a)

    def op_sweep(self, cl, a, ph):
        rng = cl.rng
        n = rng.choice([1, 10, 1000])
        tx = cl.run_tx(lambda cl, tx: c_sweep(cl, tx, n), plan='sweep')
        self.after(tx)

    def op_budget(self, cl, a, ph):
        rng = cl.rng
        feat = self.feat(rng, a)
        tx = cl.run_tx(lambda cl, tx: c_budget(cl, tx, a.name, feat), iso=self.iso(rng), plan='budget')
        self.after(tx)

    def op_rr_reserve(self, cl, a, ph, rate=None):
        """REPEATABLE READ: a snapshot first, a pause, then the reserve"""
        rng = cl.rng
        feat = self.feat(rng, a)
        amount = self.amount(rng, a, feat)
        key = self.live.key('rr')
        lease = self.lease(rng, a)
        pause = rng.uniform(0, 0.06)

        def body(cl, tx):
            tx.holds[key] = self.hold(rng, a)
            c_budget(cl, tx, a.name, feat)
            time.sleep(pause)
            c_reserve(cl, tx, a.name, feat, amount, key, lease)

        self.start([a])
        tx = cl.run_tx(body, iso='rr' if RR_SHARE > 0 else 'rc', rate=rate, plan='rr-reserve')
        self.after(tx, [a])

    def op_multi(self, cl, a, ph):
        rng = cl.rng
        kind = rng.choice(['two', 'settle+reserve', 'short', 'usage+reserve', 'limit+reserve'])
        if a.kind == 'zero' and kind in ('usage+reserve', 'short'):
            kind = 'two'
        with self.live.lock:
            others = [b for b in self.live.accounts if not b.retired]
        b = rng.choice(others)
        if b.kind == 'zero':
            b = a
        feat = self.feat(rng, a)
        amt1, amt2 = self.amount(rng, a, feat), self.amount(rng, b, 'default')
        k1, k2 = self.live.key('m'), self.live.key('m')
        lease1, lease2 = self.lease(rng, a), self.lease(rng, b)
        j = self.claim(rng, a) if kind == 'settle+reserve' else None
        sargs = self.settle_args(rng, a, j, ph) if j else None
        units = rng.randint(1, 30)
        ukey = self.live.key('u')
        with self.live.lock:
            est = a.used[feat] + self.live.held(a, feat)
        lim = max(0, est + rng.randint(-a.base[feat] // 10, a.base[feat] // 2))

        def body(cl, tx):
            tx.holds[k1] = self.hold(rng, a)
            tx.holds[k2] = self.hold(rng, b)
            if kind == 'two':
                c_reserve(cl, tx, a.name, feat, amt1, k1, lease1)
                self.maybe_sleep(rng)
                c_reserve(cl, tx, b.name, 'default', amt2, k2, lease2)
            elif kind == 'settle+reserve':
                if j:
                    c_settle(cl, tx, j, *sargs)
                self.maybe_sleep(rng)
                c_reserve(cl, tx, a.name, feat, amt1, k1, lease1)
            elif kind == 'short':
                r = c_reserve(cl, tx, a.name, feat, amt1, k1, lease1)
                if r[1]:
                    jj = LiveJob(r[0], a.name, feat, amt1, lease1, 0, 0)
                    c_charge(cl, tx, jj, rng.randint(0, amt1), None)
                    self.maybe_sleep(rng)
                    c_settle(cl, tx, jj, None, 'completed')
            elif kind == 'usage+reserve':
                c_usage(cl, tx, a.name, feat, units, ukey)
                c_reserve(cl, tx, a.name, feat, amt1, k1, lease1)
            else:
                c_set_limit(cl, tx, a.name, feat, lim)
                self.maybe_sleep(rng)
                c_reserve(cl, tx, a.name, feat, amt1, k1, lease1)

        accts = [a, b] if kind == 'two' else [a]
        self.start(accts)
        tx = cl.run_tx(body, iso=self.iso(rng), rate=self.rate(rng), rollback=rng.random() < 0.06, plan='multi-' + kind)
        self.after(tx, accts)
        if j and tx.fate != 'committed':
            self.unclaim([j])
        elif j:
            with self.live.lock:
                a.jobs.pop(j.job_id, None)


# --------------------------------------------------------------------------
# the model: reads the log only
# --------------------------------------------------------------------------

INF = float('inf')


def renewed(c):
    """a charge or heartbeat that surely renewed the lease (if it took effect):
    a heartbeat that returned the new end; a charge that charged something,
    or that ran without a step and found the job running (docs/api.md,
    earmark_charge rule 6; rules 4 and 5 do not renew)"""
    if c.fn == 'heartbeat':
        return c.res[0] is not None
    charged, capped, room, status = c.res
    return status in ('running', 'capped') and (charged > 0 or (c.args[3] is None and status == 'running'))


def maybe_renewed(c):
    if c.fn == 'heartbeat':
        return c.res[0] is not None
    return c.res[3] in ('running', 'capped')


class MJob:
    """a job the model saw admitted: its reserve committed as a new admission"""

    def __init__(self, c):
        self.res = c
        self.tx = c.tx
        self.id = c.res[0]
        self.acct, self.feat, self.amount, self.key = c.acct, c.feat, c.args[1], c.args[2]
        self.lease = int(c.args[4].split()[0]) / 1000.0
        self.s, self.a = c.sent, c.tx.ack
        self.charges, self.hbs, self.settles = [], [], []

    def finish(self):
        self.settlers = [c for c in self.settles if c.ok() and c.res[0] + c.res[1] > 0]
        self.charged_sum = sum(c.res[0] for c in self.charges if c.ok())
        self.charged_max = sum(c.res[0] for c in self.charges if c.maybe())
        self.charged = self.settlers[0].res[0] if self.settlers else self.charged_sum
        self.lease_lb = self.earliest_expiry() - MARGIN
        ends = [c.sent for c in self.settles if c.maybe()]
        self.end_lb = min(ends + [self.lease_lb])

    def lease_ops(self, skip=None):
        """the writes of lease_until: (sent, ack or INF, lowest value).  The
        reserve, then every charge or heartbeat that may have renewed.  Each
        writes its call's clock plus the lease; the last writer wins, and a
        call that waited for the job row may write after a later one, so a
        renewal is overwritten for sure only by one sent after it was
        acknowledged.  A renewal that is not certain never overwrites."""
        ops = [(self.s, self.a, self.s + self.lease)]
        for c in self.charges + self.hbs:
            if c is skip or not c.maybe() or not maybe_renewed(c):
                continue
            v = c.res[0] if c.fn == 'heartbeat' else c.sent + self.lease
            ops.append((c.sent, c.tx.ack if (c.ok() and renewed(c)) else INF, v))
        return ops

    def earliest_expiry(self):
        """the earliest instant the job's lease can have passed: some write
        whose value may still be in force after that value"""
        ops = self.lease_ops()
        best = INF
        for s, a, v in ops:
            over = min([a2 for s2, a2, v2 in ops if a2 < INF and s2 >= a] + [INF])
            if v < over:
                best = min(best, v)
        return best

    def lease_in_force(self, t1, t2, skip=None):
        """the lowest lease_until that may be in force at some instant of [t1, t2]"""
        cands = LimitOps(self.lease_ops(skip)).candidates(t1, t2)
        return min(o[2] for o in cands) if cands else INF

    def renewals(self, certain, before=None, tx=None):
        """the charges and heartbeats that renewed the lease.  certain: committed
        (before `before`, or earlier in transaction tx) and surely a renewal;
        otherwise: any that may have renewed, sent before `before`"""
        out = []
        for c in self.charges + self.hbs:
            if certain:
                if not c.ok() or not renewed(c):
                    continue
                if before is not None and not ((c.tx.ack < before and c.tx is not tx) or (c.tx is tx and c.ret <= before)):
                    continue
            else:
                # a call of transaction tx counts whatever its fate: tx saw it
                if not (c.maybe() or (c.tx is tx and c.err is None and c.res is not None)) or not maybe_renewed(c):
                    continue
                if before is not None and c.sent >= before:
                    continue
            out.append(c)
        return out

    def __str__(self):
        st = self.settlers[0] if self.settlers else None
        return 'job %d %s/%s amount %d lease %.1fs: reserve sent %s acked %s; end certainly not before %s; %s' % (
            self.id, self.acct, self.feat, self.amount, self.lease, rel(self.s), rel(self.a), rel(self.end_lb),
            ('settled by %s' % st) if st else 'no settle: expiry, charged %d' % self.charged_sum)


class LimitOps:
    """the limit changes of one account and feature: which could be in force in a window"""

    def __init__(self, ops):
        # ops: (s, a, value); a = INF when the commit is unknown
        self.known = sorted((o for o in ops if o[1] < INF), key=lambda o: o[1])
        self.unknown = [o for o in ops if o[1] == INF]
        self.by_a = [o[1] for o in self.known]
        self.prefmax_s = []
        m = -INF
        for o in self.known:
            m = max(m, o[0])
            self.prefmax_s.append(m)
        self.by_s = sorted(self.known, key=lambda o: o[0])
        self.s_keys = [o[0] for o in self.by_s]
        self.maxdur = max([o[1] - o[0] for o in self.known] + [0])

    def candidates(self, s, a):
        i = bisect.bisect_right(self.by_a, s)
        m = self.prefmax_s[i - 1] if i else -INF
        out = []
        lo = bisect.bisect_left(self.s_keys, m - self.maxdur - 1)
        hi = bisect.bisect_left(self.s_keys, a)
        for o in self.by_s[lo:hi]:
            if o[1] > m:
                out.append(o)
        out += [o for o in self.unknown if o[0] < a]
        return out

    def largest(self, s, a):
        """the largest limit that could be in force in [s, a]; None: unlimited"""
        cands = self.candidates(s, a)
        if not cands or any(o[2] is None for o in cands):
            return None, cands
        return max(o[2] for o in cands), cands


class Model:
    def __init__(self, txs, hunt):
        self.hunt = hunt
        self.findings = []
        self.txs = txs
        calls = [c for tx in txs for c in tx.calls]
        self.calls = calls
        self.jobs = {}
        self.by_key = {}
        for c in calls:
            if c.fn == 'reserve' and c.ok() and c.res[1] and c.res[3] in (None, 'resolved'):
                if c.res[0] in self.jobs:
                    self.find('jobs', 'two admissions returned job %d' % c.res[0], [c, self.jobs[c.res[0]].res])
                    continue
                j = MJob(c)
                if (j.acct, j.key) in self.by_key:
                    self.find('jobs', 'key %s of %s admitted twice: jobs %d and %d' % (
                        j.key, j.acct, self.by_key[(j.acct, j.key)].id, j.id), [c, self.by_key[(j.acct, j.key)].res])
                self.jobs[j.id] = j
                self.by_key[(j.acct, j.key)] = j
        for c in calls:
            if c.fn == 'reserve' and c.err is None and c.res is not None and c.res[3] == 'already admitted' \
                    and c.tx.fate != 'rolledback':
                j = self.by_key.get((c.acct, c.args[2]))
                if j is not None and j.id != c.res[0]:
                    self.find('jobs', 'a repeat of key %s returned job %s, the key admitted job %d' % (c.args[2], c.res[0], j.id), [c])
            if c.fn in ('charge', 'heartbeat', 'settle') and c.err is None and c.res is not None:
                # every call that returned, committed or not (what it saw
                # counts for the checks of its own transaction's calls)
                j = self.jobs.get(c.args[1])
                if j is None:
                    if c.tx.fate == 'committed' and c.res is not None:
                        same = [x for x in c.tx.calls if x.fn == 'reserve' and x.res and x.res[0] == c.args[1]]
                        if not same:
                            self.find('jobs', '%s of job %s that the model never saw admitted' % (c.fn, c.args[1]), [c])
                    continue
                {'charge': j.charges, 'heartbeat': j.hbs, 'settle': j.settles}[c.fn].append(c)
        for j in self.jobs.values():
            j.finish()
        self.shortened = []
        self.explained = collections.Counter()
        self.groups = collections.defaultdict(list)
        for j in self.jobs.values():
            self.groups[(j.acct, j.feat)].append(j)
        self.usage = collections.defaultdict(list)
        self.limits = collections.defaultdict(list)
        self.anchors = collections.defaultdict(list)
        for c in calls:
            if c.err is not None or c.tx.fate == 'rolledback' or c.res is None:
                continue
            a = c.tx.ack if c.tx.fate == 'committed' else INF
            if c.fn == 'record_usage' and c.res[0] and c.tx.fate == 'committed':
                self.usage[(c.acct, c.feat)].append(c)
            elif c.fn == 'set_limit':
                self.limits[(c.acct, c.feat)].append((c.sent, a, c.args[1]))
            elif c.fn == 'set_account':
                self.anchors[c.acct].append((c.sent, a, c.args[1], c))

    def find(self, check, text, detail=()):
        self.findings.append(Finding(check, text, detail))

    # ---- every admission against the largest limit that could be in force ----
    def check_admissions_between(self, since, upto):
        n = 0
        for key, jobs in self.groups.items():
            lim_ops = LimitOps(self.limits.get(key, []))
            done = sorted((j for j in jobs), key=lambda j: j.a)
            acks = [j.a for j in done]
            pref = [0]
            for j in done:
                pref.append(pref[-1] + j.charged)
            pos = sorted((c for c in self.usage.get(key, []) if c.args[1] > 0), key=lambda c: c.tx.ack)
            pos_acks = [c.tx.ack for c in pos]
            pos_pref = [0]
            for c in pos:
                pos_pref.append(pos_pref[-1] + c.args[1])
            neg = sorted((c for c in self.usage.get(key, []) if c.args[1] < 0), key=lambda c: c.sent)
            neg_sent = [c.sent for c in neg]
            neg_pref = [0]
            for c in neg:
                neg_pref.append(neg_pref[-1] + c.args[1])
            heap = []           # (end_lb, job_id, job) of jobs acked before the current s
            k = 0
            for A in sorted(jobs, key=lambda j: j.s):
                if not (since <= A.a < upto):
                    continue
                while k < len(done) and done[k].a < A.s:
                    heapq.heappush(heap, (done[k].end_lb, done[k].id, done[k]))
                    k += 1
                while heap and heap[0][0] <= A.s:
                    heapq.heappop(heap)
                lim, cands = lim_ops.largest(A.s, A.a)
                if lim is None:
                    continue
                n += 1
                i = bisect.bisect_left(acks, A.s)
                total = pref[i] + A.amount
                open_b = [b for (e, _, b) in heap if e > A.a]
                total += sum(b.amount - b.charged for b in open_b)
                mine = [b for b in jobs if b.tx is A.tx and b is not A and b.res.ret <= A.s]
                for b in mine:
                    total += b.amount if b.end_lb > A.a else b.charged
                up = pos_pref[bisect.bisect_left(pos_acks, A.s)]
                up += sum(c.args[1] for c in self.usage.get(key, []) if c.tx is A.tx and c.args[1] > 0 and c.ret <= A.s)
                down = neg_pref[bisect.bisect_left(neg_sent, A.a)]
                total += up + down
                if total > lim:
                    self.admission_finding(A, key, lim, cands, total, up, down, i, done, open_b, mine)
        return n

    def bound(self, A, key, vis):
        """the admission check's lower bound for A, seeing only what committed
        before vis (the same rules as check_admissions, spelled out)"""
        total = A.amount
        for b in self.groups[key]:
            if b is A:
                continue
            if (b.a < vis and b.tx is not A.tx) or (b.tx is A.tx and b.res.ret <= A.s):
                total += b.amount if b.end_lb > A.a else b.charged
        for c in self.usage.get(key, []):
            if c.args[1] > 0 and ((c.tx.ack < vis and c.tx is not A.tx) or (c.tx is A.tx and c.ret <= A.s)):
                total += c.args[1]
            elif c.args[1] < 0 and c.sent < A.a:
                total += c.args[1]
        lim, _ = LimitOps(self.limits.get(key, [])).largest(vis, A.a)
        return total, lim

    def admission_finding(self, A, key, lim, cands, total, up, down, i, done, open_b, mine):
        tags = []
        db = self.hunt.db_jobs.get(A.id) if self.hunt.db_jobs else None
        budgets = set()
        for b in open_b + mine + [A]:
            d = self.hunt.db_jobs.get(b.id) if self.hunt.db_jobs else None
            if d:
                budgets.add(d['cycle'])
        if len(budgets) > 1:
            tags.append('holds in %d cycles of one account (an anchor changed under them)' % len(budgets))
        if A.tx.iso == 'rr' and A.tx.calls[0] is not A.res:
            snap = A.tx.calls[0].sent
            t2, lim2 = self.bound(A, key, snap)
            late = [c.args[1] for c in self.usage.get(key, []) if c.args[1] > 0 and snap <= c.tx.ack < A.s]
            if lim2 is None or t2 <= lim2:
                tags.append('REPEATABLE READ: as of its snapshot (taken %s) it fits: %d <= %s; committed in between: '
                            'usage %s, limit %s' % (rel(snap), t2, lim2, late, lim2 if lim2 != lim else 'unchanged'))
        if db and db.get('slot') is not None:
            tags.append('admitted from escrow slot %s' % db['slot'])
        before = total - A.amount
        if before > lim:
            tags.append('over the limit before it: %d > %d' % (before, lim))
        text = 'job %d (%s/%s, %d) admitted with %d certainly used or held before it: %d > the largest possible limit %d%s' % (
            A.id, key[0], key[1], A.amount, total - A.amount, total, lim, ('; ' + '; '.join(tags)) if tags else '')
        detail = ['the admission: %s' % A.res]
        detail += ['limits possibly in force: %s' % ', '.join('%s (sent %s, acked %s)' % (o[2], rel(o[0]), rel(o[1])) for o in cands)]
        hist = sorted(o for o in self.limits.get(key, []) if o[0] < A.a)[-6:]
        detail += ['limit changes before it: %s' % ', '.join('%s (sent %s, acked %s)' % (o[2], rel(o[0]), rel(o[1])) for o in hist)]
        detail += ['settled or expired before it (charged): %d' % sum(j.charged for j in done[:i])]
        detail += ['open across its commit: %s' % b for b in sorted(open_b, key=lambda b: b.a)[:12]]
        detail += ['of its own transaction: %s' % b for b in mine]
        detail += ['recorded usage committed before it: %+d, corrections that may have: %+d' % (up, down)]
        first = min([b.s for b in open_b + mine] + [A.s])
        ops = self.anchors.get(key[0], [])
        for s, a, anchor, c in ops:
            if c.ok() and c.tx.client >= 0 and s < A.a and a > first and self.anchor_changed(ops, c):
                detail.append('anchor change in between: %s' % c)
        if self.hunt.db_jobs:
            for b in [A] + sorted(open_b, key=lambda b: b.a)[:12]:
                d = self.hunt.db_jobs.get(b.id)
                if d:
                    detail.append('database: job %d budget %s cycle %s slot %s status %s' % (
                        b.id, d['budget'], d['cycle'], d['slot'], d['status']))
        fi = Finding('admission', text, detail)
        fi.kind = ('(2) anchor change under an escrow hold' if len(budgets) > 1 else
                   '(3)/(9) REPEATABLE READ snapshot' if any(t.startswith('REPEATABLE') for t in tags) else
                   '(8) escrow slot admission over the limit' if db and db.get('slot') is not None else
                   'other')
        self.findings.append(fi)

    # ---- heartbeats and charges against what the model knows of the lease ----
    def check_leases(self):
        for j in self.jobs.values():
            for h in j.hbs + j.charges:
                if h.res is None:
                    continue
                dead = (h.fn == 'heartbeat' and h.res[0] is None) or (h.fn == 'charge' and h.res[3] not in ('running', 'capped'))
                same = h.tx is j.tx
                seen = (j.a < h.sent and not same) or (same and j.res.ret <= h.sent)
                if dead and seen:
                    ends = [c for c in j.settles if (c.maybe() or (c.tx is h.tx and c.err is None)) and c.sent < h.ret]
                    lb = j.lease_in_force(h.sent, h.ret, skip=h)
                    if not ends and lb - MARGIN > h.ret:
                        self.find('lease', '%s found job %d dead although its lease lasts until at least %s and nothing settled it' % (
                            h.fn, j.id, rel(lb)), [h, j])
                if not dead:
                    st = [c for c in j.settlers if (c.tx.ack < h.sent and c.tx is not h.tx) or (c.tx is h.tx and c.ret <= h.sent)]
                    ub = j.res.ret + j.lease
                    for c in j.renewals(False, before=h.ret, tx=h.tx):
                        if c is not h:
                            ub = max(ub, c.res[0] if c.fn == 'heartbeat' else c.ret + j.lease)
                    if st:
                        self.find('lease', '%s found job %d live after it was settled' % (h.fn, j.id), [h, st[0]])
                    elif h.sent > ub + MARGIN and (h.fn == 'heartbeat' or h.res[0] > 0):
                        self.find('lease', '%s renewed job %d after its lease had certainly passed (at most %s)' % (
                            h.fn, j.id, rel(ub)), [h, j])

    # ---- settles: once, within the hold ----
    def check_settles(self):
        for j in self.jobs.values():
            if len(j.settlers) > 1:
                self.find('jobs', 'job %d settled %d times' % (j.id, len(j.settlers)), j.settlers)
            if j.charged_sum > j.amount:
                self.find('jobs', 'job %d charged %d past its hold %d' % (j.id, j.charged_sum, j.amount), j.charges)
            for c in j.settles:
                if not c.maybe():
                    continue
                ch, rl, st = c.res
                if ch < 0 or rl < 0 or ch > j.amount or (ch + rl not in (0, j.amount)):
                    self.find('jobs', 'settle of job %d returned charged %d released %d for a hold of %d' % (j.id, ch, rl, j.amount), [c])
                if ch + rl == 0:
                    continue
                used, outcome = c.args[2], c.args[3]
                if st == outcome:
                    want = min(used, j.amount) if used is not None else None
                    if want is not None and ch != want:
                        self.find('jobs', 'settle of job %d with used %s charged %d' % (j.id, used, ch), [c])
                    if want is None and not (j.charged_sum_before(c) <= ch <= j.charged_max):
                        self.find('jobs', 'settle of job %d at its recorded use charged %d; the charges add up to %d..%d' % (
                            j.id, ch, j.charged_sum_before(c), j.charged_max), [c] + j.charges)
                elif st == 'expired':
                    if not (j.charged_sum_before(c) <= ch <= j.charged_max):
                        self.find('jobs', 'late settle of job %d charged %d; the charges add up to %d..%d' % (
                            j.id, ch, j.charged_sum_before(c), j.charged_max), [c] + j.charges)
                    if c.ret < j.lease_lb:
                        self.find('lease', 'settle of job %d found it expired before its lease could pass (%s)' % (j.id, rel(j.lease_lb)), [c, j])
                else:
                    self.find('jobs', 'settle of job %d as %s returned status %s' % (j.id, outcome, st), [c])

    def anchor_changed(self, ops, c):
        """set_account call c certainly changed the anchor: no other anchor
        that could be in force when it ran is the one it set"""
        others = LimitOps([(o[0], o[1], o[2]) for o in ops if o[3] is not c])
        return not any(o[2] == c.args[1] for o in others.candidates(c.sent, c.ret))

    # ---- anchor changes only while the account is certainly not in use ----
    def check_anchors(self):
        for acct, ops in self.anchors.items():
            jobs = [j for j in self.jobs.values() if j.acct == acct]
            for s, a, anchor, c in ops:
                if not c.ok() or c.tx.client < 0 or not self.anchor_changed(ops, c):
                    continue
                held = [j for j in jobs if ((j.a < c.sent and j.tx is not c.tx) or (j.tx is c.tx and j.res.ret <= c.sent))
                        and j.end_lb > c.ret]
                used = [j for j in jobs if j.charged > 0 and any(
                    (x.tx.ack < c.sent and x.tx is not c.tx) for x in j.settlers)]
                usage = [u for (ac, f), us in self.usage.items() if ac == acct for u in us if u.tx.ack < c.sent]
                if held or used or usage:
                    self.find('anchor', 'the anchor of %s changed to %s while %s' % (
                        acct, anchor, '; '.join(x for x in (
                            ('%d holds were certainly open' % len(held)) if held else '',
                            ('%d jobs had certainly charged' % len(used)) if used else '',
                            ('%d usages were certainly recorded' % len(usage)) if usage else '') if x)),
                        [c] + held[:5] + used[:3] + usage[:3])


def _charged_sum_before(self, c):
    """what the charges certainly recorded before a settle c read the job"""
    return sum(x.res[0] for x in self.charges if x.ok() and ((x.tx.ack < c.sent and x.tx is not c.tx) or
                                                            (x.tx is c.tx and x.ret <= c.sent)))


MJob.charged_sum_before = _charged_sum_before


# --------------------------------------------------------------------------
# the books: the database against the model, with every client parked
# --------------------------------------------------------------------------

def read_db(cur, names):
    """one REPEATABLE READ snapshot of everything the checks compare"""
    cur.execute('BEGIN ISOLATION LEVEL REPEATABLE READ')
    cur.execute("""
        SELECT j.job_id, j.budget_id, j.account, j.feature, j.idempotency_key, j.amount, j.used, j.status, j.slot,
               extract(epoch FROM j.lease_until)::float8, extract(epoch FROM j.settled_at)::float8,
               j.charged, j.released, extract(epoch FROM b.cycle_start)::float8
          FROM earmark.job j JOIN earmark.budget b USING (account, budget_id) WHERE j.account = ANY(%s)""", (names,))
    jobs = {}
    for r in cur.fetchall():
        jobs[r[0]] = dict(budget=r[1], account=r[2], feature=r[3], key=r[4], amount=r[5], used=r[6], status=r[7],
                          slot=r[8], lease_until=r[9], settled_at=r[10], charged=r[11], released=r[12], cycle=r[13])
    cur.execute("""
        SELECT b.budget_id, b.account, b.feature, extract(epoch FROM b.cycle_start)::float8, b.used, b.held,
               coalesce((SELECT sum(s.used) FROM earmark.budget_slot s WHERE s.account = b.account AND s.budget_id = b.budget_id), 0)::bigint,
               coalesce((SELECT sum(s.held) FROM earmark.budget_slot s WHERE s.account = b.account AND s.budget_id = b.budget_id), 0)::bigint,
               coalesce((SELECT sum(u.units) FROM earmark.usage_shard u WHERE u.account = b.account AND u.budget_id = b.budget_id), 0)::bigint
          FROM earmark.budget b WHERE b.account = ANY(%s)""", (names,))
    budgets = {r[0]: dict(account=r[1], feature=r[2], cycle=r[3], used=r[4] + r[6] + r[8], held=r[5] + r[7])
               for r in cur.fetchall()}
    cur.execute("""
        SELECT l.budget_id, l.units, l.job_id, l.entry_key, b.account, b.feature
          FROM earmark.ledger l JOIN earmark.budget b USING (account, budget_id) WHERE b.account = ANY(%s)""", (names,))
    ledger = cur.fetchall()
    cur.execute("""
        SELECT a.n, f.f, extract(epoch FROM eb.cycle_start)::float8, eb.lim, eb.used, eb.held
          FROM unnest(%s::text[]) a(n) CROSS JOIN (VALUES ('default'), ('f2')) f(f)
          CROSS JOIN LATERAL earmark_budget(a.n, f.f) eb""", (names,))
    current = cur.fetchall()
    cur.execute("""SELECT account, feature, lim FROM earmark.account_limit WHERE account = ANY(%s)""", (names,))
    limits = {(r[0], r[1]): r[2] for r in cur.fetchall()}
    cur.execute("""SELECT invariant, account, feature, extract(epoch FROM cycle_start)::float8, detail
                     FROM earmark_check()""")
    check = cur.fetchall()
    cur.execute('COMMIT')
    return jobs, budgets, ledger, current, limits, check


def check_books(model, db, final):
    jobs, budgets, ledger, current, limits, check = db
    names = set(model.hunt.names())
    f = model.find
    # jobs: the database's and the model's are the same jobs
    for jid, d in jobs.items():
        m = model.jobs.get(jid)
        if m is None:
            calls = [c for c in model.calls if c.fn == 'reserve' and c.acct == d['account'] and c.args[2] == d['key']]
            f('books', 'job %d (%s key %s, %s) is in the database but no committed call admitted it' % (
                jid, d['account'], d['key'], d['status']), calls)
            continue
        if (m.acct, m.feat, m.amount, m.key) != (d['account'], d['feature'], d['amount'], d['key']):
            f('books', 'job %d differs: model %s, database %s' % (jid, (m.acct, m.feat, m.amount, m.key), d), [m.res])
    for jid, m in model.jobs.items():
        if jid not in jobs:
            f('books', 'job %d was admitted by a committed call but is not in the database' % jid, [m.res])
    # each job's end
    for jid, m in model.jobs.items():
        d = jobs.get(jid)
        if d is None:
            continue
        low = m.lease_in_force(now(), now()) - MARGIN
        naive = max([m.s + m.lease] + [c.res[0] if c.fn == 'heartbeat' else c.sent + m.lease
                                       for c in m.charges + m.hbs if c.ok() and renewed(c)])
        if final and d['lease_until'] < naive - MARGIN:
            model.shortened.append((m, d['lease_until'], naive))
        if d['lease_until'] < low:
            f('lease', 'job %d: lease_until %s is before any lease its calls may have written last (%s)' % (
                jid, rel(d['lease_until']), rel(low)), [m] + m.charges + m.hbs)
        if m.settlers:
            s = m.settlers[0]
            if (d['status'], d['charged'], d['released']) != (s.res[2], s.res[0], s.res[1]):
                f('books', 'job %d: settled %s, the database has %s charged %s released %s' % (
                    jid, s.res, d['status'], d['charged'], d['released']), [s])
        elif d['status'] in ('completed', 'failed', 'cancelled'):
            f('books', 'job %d is %s in the database, but no committed settle ended it' % (jid, d['status']), [m] + m.settles)
        elif d['status'] == 'expired':
            if not (m.charged_sum <= d['charged'] <= m.charged_max):
                f('books', 'job %d expired charged %s; its committed charges add up to %d' % (jid, d['charged'], m.charged_sum),
                  [m] + m.charges)
            if d['settled_at'] is not None and d['settled_at'] < m.lease_lb:
                f('lease', 'job %d expired at %s, before its lease could pass (%s)' % (jid, rel(d['settled_at']), rel(m.lease_lb)),
                  [m] + m.charges + m.hbs)
        elif final:
            f('books', 'job %d is still %s at the end, after every lease passed and the sweep' % (jid, d['status']), [m])
        if d['status'] in ('running', 'capped') and not (m.charged_sum <= d['used'] <= m.charged_max):
            f('books', 'open job %d recorded %d; its committed charges add up to %d' % (jid, d['used'], m.charged_sum), m.charges)
    # the ledger: one row per charged job, one per recorded usage
    seen_jobs = collections.Counter()
    seen_keys = collections.Counter()
    per_budget = collections.Counter()
    per_af = collections.Counter()
    usage = {}
    for key, us in model.usage.items():
        for c in us:
            usage[(c.acct, c.args[2])] = c
    for budget_id, units, job_id, entry_key, acct, feat in ledger:
        per_budget[budget_id] += units
        per_af[(acct, feat)] += units
        if job_id is not None:
            seen_jobs[job_id] += 1
            d = jobs.get(job_id)
            if d is None or d['charged'] != units or d['budget'] != budget_id:
                f('books', 'ledger row of job %s (%d units, budget %d) does not match the job %s' % (job_id, units, budget_id, d), [])
        else:
            seen_keys[(acct, entry_key)] += 1
            c = usage.get((acct, entry_key))
            if c is None:
                f('books', 'ledger row %s/%s (%d units) was recorded by no committed call' % (acct, entry_key, units), [])
            elif c.args[1] != units or c.feat != feat:
                f('books', 'ledger row %s/%s has %d units of %s; the call recorded %d of %s' % (
                    acct, entry_key, units, feat, c.args[1], c.feat), [c])
    for jid, d in jobs.items():
        want = 1 if d['status'] not in ('running', 'capped') and (d['charged'] or 0) > 0 else 0
        if seen_jobs[jid] != want:
            f('books', 'job %d (%s, charged %s) has %d ledger rows' % (jid, d['status'], d['charged'], seen_jobs[jid]), [])
    for k, c in usage.items():
        if seen_keys[k] != 1:
            f('books', 'usage %s/%s recorded by a committed call has %d ledger rows' % (k[0], k[1], seen_keys[k]), [c])
    # every budget: held = its open holds, used = its ledger, the ledger never below 0
    open_per_budget = collections.Counter()
    for jid, d in jobs.items():
        if d['status'] in ('running', 'capped'):
            open_per_budget[d['budget']] += d['amount']
    for bid, b in budgets.items():
        if b['held'] != open_per_budget[bid]:
            f('books', 'budget %d (%s/%s, cycle %s): held %d, the open holds add up to %d' % (
                bid, b['account'], b['feature'], b['cycle'], b['held'], open_per_budget[bid]), [])
        if b['used'] != per_budget[bid]:
            f('books', 'budget %d (%s/%s): used %d, its ledger adds up to %d' % (
                bid, b['account'], b['feature'], b['used'], per_budget[bid]), [])
        if per_budget[bid] < 0:
            f('books', 'budget %d (%s/%s): the ledger adds up to %d, below zero' % (bid, b['account'], b['feature'], per_budget[bid]), [])
    # the model's own sum of what it saw committed, per account and feature
    mine = collections.Counter()
    mine_jobs = collections.Counter()
    for m in model.jobs.values():
        d = jobs.get(m.id)
        if d is None or d['status'] in ('running', 'capped'):
            continue
        mine_jobs[(m.acct, m.feat)] += m.settlers[0].res[0] if m.settlers else m.charged_sum
    mine.update(mine_jobs)
    for key, us in model.usage.items():
        mine[key] += sum(c.args[1] for c in us)
    for key in set(mine) | set(per_af):
        if mine[key] != per_af[key]:
            led_jobs = sum(r[1] for r in ledger if r[2] is not None and (r[4], r[5]) == key)
            us = model.usage.get(key, [])
            keys = collections.Counter(c.args[2] for c in us)
            detail = ['the model: jobs %d, recorded usage %d in %d calls; the ledger: jobs %d, recorded %d' % (
                mine_jobs[key], sum(c.args[1] for c in us), len(us), led_jobs, per_af[key] - led_jobs)]
            detail += ['usage key %s returned true in %d committed calls: %s' % (k, n, '; '.join(str(c) for c in us if c.args[2] == k))
                       for k, n in keys.items() if n > 1]
            for m in model.jobs.values():
                d = jobs.get(m.id)
                if (m.acct, m.feat) == key and d and d['status'] not in ('running', 'capped') and \
                        (m.settlers[0].res[0] if m.settlers else m.charged_sum) != d['charged']:
                    detail.append('job %d: the model has charged %s, the database %s' % (
                        m.id, m.settlers[0].res[0] if m.settlers else m.charged_sum, d['charged']))
            f('books', '%s/%s: the ledger adds up to %d, the model saw %d committed' % (key[0], key[1], per_af[key], mine[key]), detail)
    # earmark_budget of the current cycle
    by_cycle = {(b['account'], b['feature'], b['cycle']): (bid, b) for bid, b in budgets.items()}
    for acct, feat, cyc, lim, used, held in current:
        hit = by_cycle.get((acct, feat, cyc))
        bid, b = hit if hit else (None, {'used': 0, 'held': 0})
        want_held = open_per_budget[bid] if bid else 0
        want_used = per_budget[bid] if bid else 0
        if (used, held) != (want_used, want_held):
            f('books', 'earmark_budget(%s, %s): used %s held %s; the ledger has %d and the open holds %d' % (
                acct, feat, used, held, want_used, want_held), [])
        if lim != limits.get((acct, feat)):
            f('books', 'earmark_budget(%s, %s) shows limit %s, the limit row has %s' % (acct, feat, lim, limits.get((acct, feat))), [])
    # earmark_check(): rows the model explains
    for inv, acct, feat, cyc, detail in check:
        if acct not in names:
            continue
        if inv == 'over_limit':
            ops = model.limits.get((acct, feat), [])
            now_lim = limits.get((acct, feat))
            if now_lim is not None and any(o[2] is None or o[2] > now_lim for o in ops):
                model.explained['a limit lowered under what was admitted'] += 1
                continue
            hit = by_cycle.get((acct, feat, cyc))
            if hit and now_lim is not None and hit[1]['used'] + hit[1]['held'] <= now_lim:
                # earmark_check counts the jobs' usage only; corrections
                # (negative recorded usage) took units off it, which the
                # gate counts and earmark_check does not
                model.explained['corrections below the jobs\' usage (used + held within the limit)'] += 1
                continue
        if inv == 'overspent':
            # earmark_check compares clock times: a reserve that read the
            # old limit while a lower one was being written (before its
            # commit) is reported too (docs: earmark_check, overspent).
            # The model checks each such admission exactly, against every
            # limit that could have been in force: with none of its own
            # findings on this account and feature, and a limit lowered
            # during the run, the row is that race.
            ops = model.limits.get((acct, feat), [])
            now_lim = limits.get((acct, feat))
            lowered = now_lim is not None and any(o[2] is None or o[2] > now_lim for o in ops)
            unsound = any(fi.check == 'admission' and ('(%s/%s,' % (acct, feat)) in fi.text
                          for fi in model.findings)
            if lowered and not unsound:
                model.explained['a hold admitted while a lower limit was being written'] += 1
                continue
        f('check', 'earmark_check(): %s %s/%s cycle %s: %s' % (inv, acct, feat, cyc, detail), [])


# --------------------------------------------------------------------------
# the hunt
# --------------------------------------------------------------------------

def safe_anchors(rng, n, horizon):
    """anchors (day 1-28, UTC) whose cycle around now ends after the run"""
    import datetime
    utc = datetime.timezone.utc
    t = datetime.datetime.now(utc)
    out = []
    for d in range(1, 29):
        for h in (1, 7, 13, 19):
            start = t.replace(day=d, hour=h, minute=0, second=0, microsecond=0) if d <= 28 else None
            if start > t:
                y, m = (t.year, t.month - 1) if t.month > 1 else (t.year - 1, 12)
                start = start.replace(year=y, month=m)
            y, m = (start.year, start.month + 1) if start.month < 12 else (start.year + 1, 1)
            end = start.replace(year=y, month=m)
            if (end - t).total_seconds() > horizon and (t - start).total_seconds() > 600:
                out.append('2026-02-%02d %02d:00:00+00' % (d, h))
    rng.shuffle(out)
    return out[:n]


class Hunt:
    def __init__(self, results):
        self.results_path = results
        self.rng = random.Random(SEED)
        self.live = Live()
        self.planner = Planner(self)
        self.stop = threading.Event()
        self.cond = threading.Condition()
        self.paused = False
        self.parked = 0
        self.by_name = {}
        self.unexpected_errors = []
        self.crashes = []
        self.kills = 0
        self.db_jobs = {}
        self.findings = {}
        self.quiet_n = 0
        self.checked = 0
        self.prefix = RUN
        self.zero_n = 0
        self.rotations = 0
        self.setup_client = Client(-1, self)
        self.setup_client.rng = random.Random(SEED - 1)

    # ---- accounts ------------------------------------------------------------
    def names(self):
        return list(self.by_name)

    def account(self, name):
        return self.by_name.get(name)

    def live_job(self, job_id):
        for a in self.live.accounts + self.live.retired:
            j = a.jobs.get(job_id)
            if j:
                return j
        return None

    def new_account(self, cl, kind, name):
        anchors = safe_anchors(cl.rng, 3, SECONDS + 3600)
        a = Account(name, kind, anchors)
        slots = 0 if not ESCROW else {'escrow': 4, 'usage': 4, 'plain': 0, 'zero': 1}[kind]

        def body(cl, tx):
            for feat in a.feats:
                c_set_limit(cl, tx, name, feat, a.base[feat])
            c_set_escrow(cl, tx, name, slots)
            c_set_account(cl, tx, name, anchors[0])

        tx = cl.run_tx(body, plan='setup')
        if tx.fate != 'committed':
            return None
        with self.live.lock:
            self.by_name[name] = a
            self.live.accounts.append(a)
        return a

    def rotate(self, cl, old):
        """the zero account's anchor can no longer change: a fresh one"""
        with self.live.lock:
            self.zero_n += 1
            name = '%s_z%d' % (self.prefix, self.zero_n)
        new = self.new_account(cl, 'zero', name)
        if new is None:
            return
        with self.live.lock:
            old.retired = True
            self.live.accounts.remove(old)
            self.live.retired.append(old)
            self.rotations += 1

    def setup(self):
        cur = self.setup_client.cur
        cur.execute('CREATE EXTENSION IF NOT EXISTS earmark')
        cur.execute('CREATE SCHEMA IF NOT EXISTS hunt')
        cur.execute('CREATE TABLE IF NOT EXISTS hunt.tx_marker (marker text PRIMARY KEY)')
        kinds = ['escrow', 'zero', 'plain', 'usage'][:ACCOUNTS]
        for i, kind in enumerate(kinds):
            name = '%s_%s' % (self.prefix, kind[0]) if kind != 'zero' else '%s_z0' % self.prefix
            if self.new_account(self.setup_client, kind, name) is None:
                raise RuntimeError('setup of %s failed' % name)

    # ---- clients park at quiet points -----------------------------------------
    def park(self, cl):
        with self.cond:
            if not self.paused:
                return
            self.parked += 1
            self.cond.notify_all()
            while self.paused and not self.stop.is_set():
                self.cond.wait(0.5)
            self.parked -= 1

    def unexpected(self, tx, code, msg):
        with self.live.lock:
            self.unexpected_errors.append((tx, code, msg))

    def crash(self, tb):
        with self.live.lock:
            self.crashes.append(tb)
        say('driver crash:', tb)

    # ---- the killer --------------------------------------------------------------
    def killer(self):
        rng = random.Random(SEED + 7)
        conn = psycopg2.connect(dbname=DB)
        conn.autocommit = True
        cur = conn.cursor()
        while not self.stop.is_set():
            time.sleep(rng.expovariate(1.0 / KILL))
            with self.cond:
                paused = self.paused
            if paused or self.stop.is_set():
                continue
            busy = [c for c in self.clients if c.busy]
            if not busy:
                continue
            victim = rng.choice(busy)
            cur.execute('SELECT pg_terminate_backend(%s)', (victim.pid,))
            self.kills += 1
        conn.close()

    # ---- a quiet point ---------------------------------------------------------
    def all_txs(self):
        txs = list(self.setup_client.log)
        for c in self.clients:
            txs += c.log
        txs.sort(key=lambda t: t.id)
        return txs

    def quiet(self, final, since):
        upto = now()
        txs = [t for t in self.all_txs() if t.fate != 'pending']
        model = Model(txs, self)
        db = read_db(self.checker.cursor(), self.names())
        self.db_jobs = db[0]
        check_books(model, db, final)
        n = model.check_admissions_between(since, upto)
        self.checked += n
        if final:
            model.check_settles()
            model.check_leases()
            model.check_anchors()
        new = 0
        for fi in model.findings:
            k = (fi.check, fi.text)
            if k not in self.findings:
                self.findings[k] = fi
                new += 1
        say('%s at %ss: %d transactions, %d jobs, %d admissions checked, %d new findings' % (
            'the end' if final else 'quiet point %d' % self.quiet_n, rel(upto), len(txs), len(model.jobs), n, new))
        return model, upto

    def pause_all(self):
        with self.cond:
            self.paused = True
            deadline = now() + 60
            while self.parked < len([c for c in self.clients if c.is_alive()]) and now() < deadline:
                self.cond.wait(0.1)

    def resume(self):
        with self.cond:
            self.paused = False
            self.cond.notify_all()

    # ---- the run -------------------------------------------------------------------
    def run(self):
        self.checker = psycopg2.connect(dbname=DB, options='-c earmark.rate_limit=0')
        self.checker.autocommit = True
        self.setup()
        say('accounts: %s' % ', '.join('%s (%s)' % (a.name, a.kind) for a in self.live.accounts))
        self.clients = [Client(i, self) for i in range(CLIENTS)]
        for c in self.clients:
            c.start()
        kt = None
        if KILL > 0:
            kt = threading.Thread(target=self.killer, daemon=True)
            kt.start()
        end = now() + SECONDS
        since = 0.0
        next_quiet = now() + QUIET
        while now() < end:
            time.sleep(min(0.2, max(0, end - now())))
            if self.crashes:
                break
            if now() >= next_quiet and end - now() > QUIET / 3:
                self.pause_all()
                self.quiet_n += 1
                _, since = self.quiet(False, since)
                self.resume()
                next_quiet = now() + QUIET
        self.stop.set()
        self.resume()
        for c in self.clients:
            c.join(60)
        if kt:
            kt.join(10)
        # the end: every lease passes, the sweep settles every hold
        cur = self.checker.cursor()
        deadline = now() + 60
        while now() < deadline:
            cur.execute('SELECT earmark_sweep(10000)')
            cur.execute("SELECT count(*) FROM earmark.job WHERE account = ANY(%s) AND status IN ('running', 'capped')",
                        (self.names(),))
            if cur.fetchone()[0] == 0:
                break
            time.sleep(0.2)
        model, _ = self.quiet(True, since)
        return model

    # ---- the report ------------------------------------------------------------------
    def report(self, model):
        txs = self.all_txs()
        fates = collections.Counter(t.fate for t in txs)
        killed = sum(1 for t in txs if t.why and t.why.startswith('killed'))
        calls = collections.Counter(c.fn for t in txs for c in t.calls)
        why = collections.Counter(t.why for t in txs if t.why)
        admitted = sum(1 for c in model.calls if c.fn == 'reserve' and c.ok() and c.res[1])
        refused = collections.Counter('no room' if (c.res[3] or '').startswith('the job needs') else c.res[3]
                                      for c in model.calls if c.fn == 'reserve' and c.ok() and not c.res[1])
        say('%d transactions: %s; retried or failed: %s' % (len(txs), dict(fates), dict(why)))
        say('calls: %s' % dict(calls))
        az = [t for t in txs if t.plan == 'anchor-zero']
        moved = sum(1 for t in az if t.fate == 'committed' and model.anchor_changed(model.anchors.get(t.calls[0].acct, []), t.calls[0]))
        say('anchor changes of empty accounts: %d tried, %d moved the anchor, %d refused (EM002)' % (
            len(az), moved, sum(1 for t in az if t.why == 'EM002')))
        say('reserves: %d admitted, refused: %s; %d kills, %d transactions killed; zero accounts retired: %d' % (
            admitted, dict(refused), self.kills, killed, self.rotations))
        by_check = collections.defaultdict(list)
        for fi in self.findings.values():
            by_check[fi.check].append(fi)
        for check, fis in sorted(by_check.items()):
            say('FINDINGS %s: %d' % (check, len(fis)))
            shown = collections.Counter()
            pick = []
            for fi in fis:
                k = getattr(fi, 'kind', '')
                if shown[k] < 2:
                    shown[k] += 1
                    pick.append(fi)
            for fi in pick[:6]:
                say('  ' + fi.text)
                for d in fi.detail[:24]:
                    say('      ' + str(d))
        for why, n in model.explained.items():
            say('earmark_check() over_limit rows explained at the end: %d by %s' % (n, why))
        if model.shortened:
            m, lu, naive = model.shortened[0]
            say('note (not a failure): %d jobs end with a lease shorter than their latest committed renewal set: a charge '
                'or heartbeat that waited for the job row wrote its own older clock over it.  E.g. job %d: lease_until %s, '
                'renewed to %s by a committed call' % (len(model.shortened), m.id, rel(lu), rel(naive)))
        kinds = collections.Counter(getattr(fi, 'kind', '') for fi in by_check.get('admission', []))
        say('overspends by kind: %s' % (', '.join('%s x%d' % kv for kv in sorted(kinds.items())) or 'none'))
        unexpected = collections.Counter((code, msg.splitlines()[0][:120] if msg else '') for tx, code, msg in self.unexpected_errors)
        for (code, msg), n in unexpected.items():
            ex = [tx for tx, c, m in self.unexpected_errors if c == code][0]
            say('unexpected %s x%d: %s' % (code, n, msg))
            for c in ex.calls:
                say('      ' + str(c))
        unresolved = fates.get('unknown', 0) + fates.get('pending', 0)
        results = [
            (not self.crashes and len(txs) > 0,
             'the driver ran %d transactions (%d calls) on %d clients for %.0f s, %d backends killed' % (
                 len(txs), sum(calls.values()), CLIENTS, SECONDS, self.kills)),
            (unresolved == 0, 'the fate of every transaction is known (%d killed, %d unresolved)' % (killed, unresolved)),
            (not self.unexpected_errors, 'no call raised an unexpected SQLSTATE (%d did)' % len(self.unexpected_errors)),
            (not by_check.get('admission'), 'every admission is sound against the largest limit that could be in force '
             '(%d admissions checked, %d over)' % (self.checked, len(by_check.get('admission', [])))),
            (not by_check.get('books'), 'the books agree with the model at %d quiet points and at the end (%d findings)' % (
                self.quiet_n, len(by_check.get('books', [])))),
            (not by_check.get('jobs'), 'each job settled at most once, never charged past its hold (%d findings)' % len(by_check.get('jobs', []))),
            (not by_check.get('lease'), 'leases: nothing expired early, no live job found dead, no dead job renewed (%d findings)' % len(by_check.get('lease', []))),
            (not by_check.get('check'), 'earmark_check() has no row the model cannot explain (%d)' % len(by_check.get('check', []))),
            (not by_check.get('anchor'), 'no anchor changed while a hold was certainly open or usage certainly recorded (%d)' % len(by_check.get('anchor', []))),
        ]
        with open(self.results_path, 'w') as out:
            for good, text in results:
                out.write('%d|%s\n' % (0 if good else 1, text))
        return all(g for g, _ in results)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--results', required=True)
    args = ap.parse_args()
    say('hunt seed %d: %d clients, %.0f s, %d accounts, kill every %.1f s, escrow %d, RR %.2f, rate %d, bias %d' % (
        SEED, CLIENTS, SECONDS, ACCOUNTS, KILL, ESCROW, RR_SHARE, RATE, BIAS))
    hunt = Hunt(args.results)
    model = hunt.run()
    ok = hunt.report(model)
    say('hunt took %.0f s' % (now() - T0))
    return 0 if ok else 1


if __name__ == '__main__':
    sys.exit(main())
