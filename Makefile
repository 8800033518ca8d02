# pg outbox: PGXS build of the extension (make && make install) and its
# pg_regress / isolation tests (make installcheck).  The C++ unit tests and
# the test tools (test broker, consumers) are built by CMake: see README.

EXTENSION   = outbox
# The schema: the full script of the current version and the upgrade
# scripts from each earlier one (sql/).
DATA        = $(wildcard sql/outbox--*.sql)
MODULE_big  = outbox

SRCS := $(wildcard src/*.cpp src/queries/*.cpp src/kafka/*.cpp src/json/*.cpp src/common/*.cpp)
OBJS  = $(SRCS:.cpp=.o)

PG_CPPFLAGS  = -I$(CURDIR)/include
PG_CXXFLAGS  = -std=c++17 -fPIC -Wextra -Wno-unused-parameter -Wno-missing-field-initializers \
               -Wno-cast-function-type -Wno-register -fvisibility=hidden
ifdef OUTBOX_WERROR
PG_CXXFLAGS += -Werror
endif
SHLIB_LINK   = -lrdkafka -lstdc++

# pg_regress (test/sql, test/expected): SQL API, errors, privileges,
# mark_processed semantics, upgrades.
REGRESS      = api privileges processed_event parking operations inbox hostile plans upgrade
REGRESS_OPTS = --inputdir=test --temp-instance=tmp_check --temp-config=$(CURDIR)/test/regress.conf
# pg_isolation_regress (test/specs, test/expected): concurrent sessions.
ISOLATION      = mark_processed_race relay_claim
ISOLATION_OPTS = --inputdir=test --temp-instance=tmp_check_iso --temp-config=$(CURDIR)/test/regress.conf

# No JIT bitcode: it needs clang and buys nothing for this module.
override with_llvm = no

PG_CONFIG ?= pg_config
PGXS := $(shell $(PG_CONFIG) --pgxs)
include $(PGXS)

$(OBJS): $(wildcard include/outbox/*.h include/outbox/*/*.h)

# pg_regress writes its results next to the inputs.
EXTRA_CLEAN = test/results test/regression.diffs test/regression.out
