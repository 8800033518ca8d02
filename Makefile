# pg outbox: PGXS build of the extension (make && make install) and its
# pg_regress / isolation tests (make installcheck).  The C++ unit tests and
# the test tools (test broker, consumers) are built by CMake: see README.
# Builds in the source tree, or out of it with VPATH (as Debian's
# pg_buildext does: make -C build-15 -f ../Makefile VPATH=..).

EXTENSION   = outbox
MODULE_big  = outbox

SRC_ROOT := $(if $(VPATH),$(VPATH),.)
SRC_ABS  := $(abspath $(SRC_ROOT))

# The schema: the full script of the current version and the upgrade
# scripts from each earlier one (sql/).
DATA = $(patsubst $(SRC_ROOT)/%,%,$(wildcard $(SRC_ROOT)/sql/outbox--*.sql))

SRCS := $(patsubst $(SRC_ROOT)/%,%,$(wildcard $(addprefix $(SRC_ROOT)/,src/*.cpp src/queries/*.cpp \
          src/kafka/*.cpp src/json/*.cpp src/common/*.cpp)))
OBJS  = $(SRCS:.cpp=.o)

PG_CPPFLAGS  = -I$(SRC_ABS)/include
PG_CXXFLAGS  = -std=c++17 -fPIC -Wextra -Wno-unused-parameter -Wno-missing-field-initializers \
               -Wno-cast-function-type -Wno-register -fvisibility=hidden
ifdef OUTBOX_WERROR
PG_CXXFLAGS += -Werror
endif
SHLIB_LINK   = -lrdkafka -lstdc++

# pg_regress (test/sql, test/expected): SQL API, errors, privileges,
# mark_processed semantics, hostile roles, plans, upgrades.
REGRESS      = api privileges processed_event parking operations inbox hostile plans upgrade
REGRESS_OPTS = --inputdir=$(SRC_ROOT)/test --temp-instance=tmp_check --temp-config=$(SRC_ABS)/test/regress.conf
# pg_isolation_regress (test/specs, test/expected): concurrent sessions.
ISOLATION      = mark_processed_race relay_claim write_heal_lock subscribe_race
ISOLATION_OPTS = --inputdir=$(SRC_ROOT)/test --temp-instance=tmp_check_iso --temp-config=$(SRC_ABS)/test/regress.conf

# No JIT bitcode: it needs clang and buys nothing for this module.
override with_llvm = no

PG_CONFIG ?= pg_config
PGXS := $(shell $(PG_CONFIG) --pgxs)
include $(PGXS)

# Object directories of an out-of-tree build (made when the Makefile is
# read: as targets, VPATH would find the source tree's directories).
ifdef VPATH
$(shell mkdir -p $(sort $(dir $(OBJS))))
endif

$(OBJS): $(wildcard $(SRC_ROOT)/include/outbox/*.h $(SRC_ROOT)/include/outbox/*/*.h)
