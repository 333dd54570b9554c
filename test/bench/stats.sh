# shellcheck shell=bash
# test/bench/stats.sh: the median, for the benchmark scripts that report
# one over their rounds (gate.sh, ab.sh, profile.sh, batch.sh, inbox.sh).

# median FORMAT: the median of the numbers on standard input (separated by
# spaces or newlines; empty ones skipped), printed with printf's FORMAT; of
# an even count, the mean of the two in the middle; nothing for none.
median() {
    tr ' ' '\n' | awk 'NF' | sort -g |
        awk -v f="$1" '{ v[NR] = $1 }
            END { if (NR) printf f, NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}
