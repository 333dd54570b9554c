#!/usr/bin/env python3
"""test/bench/profile.py: where a job's CPU goes, from `perf script` output.

    perf script -i DATA -F comm,ip,sym | python3 profile.py JOBS HZ
    python3 profile.py --funcs

JOBS is the number of jobs run while perf recorded, HZ perf's sampling
frequency (samples a second of CPU).  Prints "name|ms" lines: the CPU
milliseconds a job of the server's processes (comm postgres) in each phase
of a call (the first phase whose function is on a sample's stack wins), and
inclusive milliseconds a job of selected functions.  profile.sh turns them
into tables.  --funcs prints the selected functions' names, one a line, in
the order profile.sh lists them.
"""
import collections
import re
import sys

# phase: the functions whose presence on the stack puts a sample in it,
# checked in this order
PHASES = [
    ("the call (earmark's C or the reference's PL/pgSQL)",
     {"em_call_pinned", "plpgsql_call_handler"}),
    ("the executor outside a call (all of the design floor's statements)",
     {"standard_ExecutorStart", "standard_ExecutorRun", "standard_ExecutorFinish",
      "standard_ExecutorEnd"}),
    ("commit", {"CommitTransactionCommand", "finish_xact_command"}),
    ("reading the next message", {"pq_getbyte", "pq_getmessage", "secure_read",
                                  "ProcessClientReadInterrupt"}),
    ("parse, bind and the statement around the call",
     {"exec_bind_message", "exec_parse_message", "PortalStart", "PortalRun",
      "exec_execute_message", "exec_simple_query"}),
    ("autovacuum", {"AutoVacWorkerMain"}),
    ("earmark's worker", {"earmark_worker_main", "earmark_launcher_main"}),
    ("WAL writer, checkpointer, background writer",
     {"WalWriterMain", "CheckpointerMain", "BackgroundWriterMain"}),
]

# functions reported inclusively (a sample counts once per function)
FUNCS = [
    "reserve_body", "charge_body", "settle_body",
    "em_budget_lock", "read_key_job_direct", "read_account_limit_direct",
    "read_limit_now", "em_budget_admit", "em_direct_update", "em_direct_get",
    "em_exec", "SPI_execute_plan_with_paramlist",
    "standard_ExecutorStart", "ExecInsertIndexTuples", "btinsert", "_bt_first",
    "heap_insert", "heap_update", "heap_lock_tuple", "heap_page_prune_opt",
    "XLogInsert", "asm_exc_page_fault",
]


def samples(stream):
    """(comm, [symbols, leaf first]) for each sample"""
    comm, stack = None, []
    for line in stream:
        line = line.rstrip("\n")
        if not line.strip():
            if comm is not None:
                yield comm, stack
            comm, stack = None, []
            continue
        if not line[0].isspace():
            if comm is not None:
                yield comm, stack
            comm, stack = line.split()[0], []
            continue
        parts = line.strip().split(None, 1)
        sym = parts[1] if len(parts) > 1 else "?"
        sym = re.sub(r"\+0x[0-9a-f]+$", "", sym).split(" (")[0]
        # a compiler's clones of a static function (.isra.0, .constprop.0)
        stack.append(re.sub(r"(\.(isra|constprop|part|cold)\.?[0-9]*)+$", "", sym))
    if comm is not None:
        yield comm, stack


def main():
    jobs, hz = float(sys.argv[1]), float(sys.argv[2])
    per_job = 1000.0 / hz / jobs
    phase = collections.Counter()
    func = collections.Counter()
    total = collections.Counter()
    for comm, stack in samples(sys.stdin):
        total[comm] += 1
        if comm != "postgres":
            continue
        on = set(stack)
        name = "other (kernel scheduling, page faults, ...)"
        for p, syms in PHASES:
            if on & syms:
                name = p
                break
        phase[name] += 1
        for f in FUNCS:
            if f in on:
                func[f] += 1
    print("all|%.3f" % (sum(total.values()) * per_job))
    print("idle|%.3f" % (total.get("swapper", 0) * per_job))
    print("postgres|%.3f" % (total.get("postgres", 0) * per_job))
    print("pgbench|%.3f" % (total.get("pgbench", 0) * per_job))
    for p, _ in PHASES:
        print("phase:%s|%.3f" % (p, phase.get(p, 0) * per_job))
    print("phase:other (kernel scheduling, page faults, ...)|%.3f"
          % (phase.get("other (kernel scheduling, page faults, ...)", 0) * per_job))
    for f in FUNCS:
        print("func:%s|%.3f" % (f, func.get(f, 0) * per_job))


if __name__ == "__main__":
    if sys.argv[1:] == ["--funcs"]:
        print("\n".join(FUNCS))
    else:
        main()
