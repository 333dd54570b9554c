# earmark: PGXS build
EXTENSION = earmark
MODULE_big = earmark
OBJS = src/earmark.o src/settings.o src/delegation.o src/cooldown.o src/spi.o src/cluster.o src/ratelimit.o src/contention.o src/leasefloor.o src/launcher.o src/account.o src/budget.o src/direct.o src/gate.o src/escrow.o src/entries.o src/ledger.o src/meter.o src/reconcile.o src/limit_cache.o src/provider.o src/inbox.o src/worker.o src/sigverify.o src/http.o src/intake.o src/batch.o
# The current version's install script is built from its one source,
# src/earmark.sql; earlier versions install from 0.1.0's script and the
# upgrade scripts (PostgreSQL follows the update path).
EARMARK_VERSION = $(shell sed -n "s/^default_version = '\(.*\)'/\1/p" earmark.control)
DATA = src/earmark--0.1.0.sql src/earmark--0.1.0--0.2.0.sql src/earmark--0.2.0--0.3.0.sql
DATA_built = earmark--$(EARMARK_VERSION).sql
PGFILEDESC = "earmark - usage limits that hold under concurrency"

PG_CPPFLAGS = -std=gnu11 -Wall -Wextra -Werror -Wno-unused-parameter -Wno-missing-field-initializers -Wno-sign-compare
SHLIB_LINK = -lcrypto -lcurl

# make installcheck: pg_regress (sql/) and the isolation specs
# (test/isolation) against temporary instances of their own, with earmark
# preloaded (test/installcheck.conf); output under EM_CHECK_DIR.  As root it
# runs as the user postgres: the server refuses to run as root.
# scripts/test.sh runs the same files against its own cluster, and the
# other layers besides.
EM_CHECK_DIR ?= /tmp/earmark-installcheck
REGRESS = $(basename $(notdir $(wildcard sql/*.sql)))
REGRESS_OPTS = --inputdir=. --outputdir=$(EM_CHECK_DIR)/regress \
	--temp-instance=$(EM_CHECK_DIR)/regress/instance --temp-config=test/installcheck.conf \
	--load-extension=earmark
ISOLATION = $(basename $(notdir $(wildcard test/isolation/specs/*.spec)))
ISOLATION_OPTS = --inputdir=test/isolation --outputdir=$(EM_CHECK_DIR)/isolation \
	--temp-instance=$(EM_CHECK_DIR)/isolation/instance --temp-config=test/installcheck.conf \
	--load-extension=earmark
ifeq ($(shell id -u),0)
NO_INSTALLCHECK = 1
endif

PG_CONFIG ?= pg_config
PGXS := $(shell $(PG_CONFIG) --pgxs)
include $(PGXS)

# every object depends on the shared headers
$(OBJS): $(wildcard src/*.h)

earmark--$(EARMARK_VERSION).sql: src/earmark.sql
	cp $< $@

ifeq ($(shell id -u),0)
installcheck:
	rm -rf $(EM_CHECK_DIR) && mkdir -p $(EM_CHECK_DIR) && chown postgres $(EM_CHECK_DIR)
	runuser -u postgres -- $(MAKE) -C $(CURDIR) installcheck PG_CONFIG=$(PG_CONFIG) EM_CHECK_DIR=$(EM_CHECK_DIR)
endif
