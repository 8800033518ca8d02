# pg outbox: PGXS build of the extension (make && make install) and its
# pg_regress / isolation tests (make installcheck).  The C++ unit tests and
# the test tools (test broker, consumers) are built by CMake: see test/README.md.
# Builds in the source tree, or out of it with VPATH (as Debian's
# pg_buildext does: make -C build-15 -f ../Makefile VPATH=..).

EXTENSION   = outbox
MODULE_big  = outbox

SRC_ROOT := $(if $(VPATH),$(VPATH),.)
SRC_ABS  := $(abspath $(SRC_ROOT))

# The schema, beside outbox.control: the full script of the current version
# and the upgrade scripts from each earlier one.
DATA = $(patsubst $(SRC_ROOT)/%,%,$(wildcard $(SRC_ROOT)/outbox--*.sql))

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
# OUTBOX_SANITIZERS=address,undefined: the module built for test/sanitize.sh (a
# server that loads it needs the sanitizer's runtime preloaded).
ifdef OUTBOX_SANITIZERS
PG_CXXFLAGS += -fsanitize=$(OUTBOX_SANITIZERS) -fno-omit-frame-pointer -fno-sanitize-recover=all
SHLIB_LINK  += -fsanitize=$(OUTBOX_SANITIZERS)
endif

# pg_regress (sql/, expected/): SQL API, errors, privileges, mark_processed
# semantics, hostile roles, plans, upgrades.  Every sql/*.sql runs: a new
# test file cannot stay out of the run.  Each test creates and drops what it
# uses, so their (alphabetical) order does not matter.
REGRESS      = $(sort $(patsubst $(SRC_ROOT)/sql/%.sql,%,$(wildcard $(SRC_ROOT)/sql/*.sql)))
REGRESS_OPTS = --inputdir=$(SRC_ROOT) --temp-instance=tmp_check --temp-config=$(SRC_ABS)/test/regress.conf
# pg_isolation_regress (specs/, expected/): concurrent sessions; every
# specs/*.spec runs.
ISOLATION      = $(sort $(patsubst $(SRC_ROOT)/specs/%.spec,%,$(wildcard $(SRC_ROOT)/specs/*.spec)))
ISOLATION_OPTS = --inputdir=$(SRC_ROOT) --temp-instance=tmp_check_iso --temp-config=$(SRC_ABS)/test/regress.conf

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

# A server version the code does not support (include/outbox/pg_compat.h)
# stops the build before anything compiles, with that header's one #error
# line, instead of a page of errors from every file.
.PHONY: pg_version_check
pg_version_check:
	@out=$$($(CXX) -E -x c++ $(CPPFLAGS) -include outbox/pg_compat.h /dev/null -o /dev/null 2>&1) || \
	  { echo "$$out" | grep -m1 'error' >&2; exit 1; }
$(OBJS): | pg_version_check

# The flags every source of the module compiles with.  CMake compiles the
# pure sources again for the unit tests (liboutbox_core) and asks here, so
# the objects the unit tests test are built as the objects the server loads
# (same optimisation, -fwrapv, -fno-strict-aliasing, assertions, warnings).
.PHONY: print-cxxflags
print-cxxflags:
	@echo $(CPPFLAGS) $(CXXFLAGS)
