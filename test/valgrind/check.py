#!/usr/bin/env python3
"""test/valgrind/check.py: memcheck errors that are earmark's.

    check.py LOG...

Reads valgrind --log-file logs and prints every error whose stack reaches
earmark's own code (a frame in src/*.c) before it reaches PostgreSQL's
binary: an error inside earmark, or in a libc or OpenSSL or libcurl call
that earmark made.  An error raised inside PostgreSQL (for example its
well-known writes of uninitialised padding), with earmark only further down
the stack (a worker's or an API function's call into the server), is not
earmark's.  Exits 1 when it printed any.
"""
import os
import re
import sys

# a frame in any of earmark's C files: their names read from src/, so that
# a file added later is not left out (direct.c, spi.c, batch.c and nine
# others were, when the names were written here by hand)
SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "src")
NAMES = sorted(os.path.splitext(f)[0] for f in os.listdir(SRC) if f.endswith(".c"))
OURS = re.compile(r"\((" + "|".join(map(re.escape, NAMES)) + r")\.c:\d+\)")
# the server binary, also in a private copy of PostgreSQL (EM_PREFIX): its
# frames end the search (a frame of earmark's further down is a caller)
SERVER = re.compile(r"\(in (/[^()]*)?/usr/lib/postgresql/\d+/bin/postgres\)")
FRAME = re.compile(r"^==\d+==\s+(at|by) ")


def errors(path):
    block = []
    with open(path, errors="replace") as f:
        for line in f:
            body = re.sub(r"^==\d+==\s?", "", line.rstrip("\n"))
            if body.strip() == "":
                if block:
                    yield block
                block = []
            else:
                block.append(line.rstrip("\n"))
    if block:
        yield block


def ours(block):
    # the first stack of the block: the error's own, not "Address ... alloc'd"
    for line in block[1:]:
        if not FRAME.match(line):
            break
        if OURS.search(line):
            return True
        if SERVER.search(line):
            return False
    return False


found = 0
for path in sys.argv[1:]:
    for block in errors(path):
        if FRAME.match(block[0]):
            continue
        if ours(block):
            found += 1
            print("\n".join(block[:40]))
            print()
sys.exit(1 if found else 0)
