# The two README commands. Everything else is CMake and ctest underneath.
# make test = test-plain (the build and its whole ctest suite), test-asan (the CPU suite built
# with AddressSanitizer and UndefinedBehaviorSanitizer) and fuzz (libFuzzer targets, FUZZ_TIME
# seconds each); it runs all three and fails if any failed. Each runs alone as well.
BUILD ?= build
ASAN_BUILD ?= build-asan
FUZZ_BUILD ?= build-fuzz
FUZZ_TIME ?= 60
JOBS ?= $(shell nproc 2>/dev/null || echo 2)

# Sanitizer runtime options for the suite (fuzz/run.sh sets the same): stop at the first
# error with a stack trace; LeakSanitizer on.
SAN_ENV = ASAN_OPTIONS=halt_on_error=1:detect_leaks=1:print_stacktrace=1 \
          UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
# Sanitized builds are CPU-only; RelWithDebInfo keeps line numbers in reports.
SAN_CMAKE = -DSG_WITH_CUDA=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSG_SANITIZE=address,undefined

.PHONY: all build demo install test test-plain test-asan fuzz fuzz-corpus clean

all: build

# Tools the targets need, installed from Debian packages where missing (CI: a fresh machine).
define apt_install
{ echo "make: $(1) missing; installing $(2) (apt-get)"; apt-get update -qq && apt-get install -y -qq $(2); }
endef
HAVE_CMAKE = command -v cmake >/dev/null || $(call apt_install,cmake,cmake)
HAVE_PKGCONFIG = command -v pkg-config >/dev/null || $(call apt_install,pkg-config,pkgconf)
PREFIX ?= /usr/local
FUZZ_PROBE = printf 'int LLVMFuzzerTestOneInput(const char *d, unsigned long n) { return 0; }\n' \
             | clang -fsanitize=fuzzer,address,undefined -x c - -o /dev/null 2>/dev/null
HAVE_FUZZ = $(FUZZ_PROBE) || { $(call apt_install,clang with libFuzzer,clang libclang-rt-dev) && $(FUZZ_PROBE); }

$(BUILD)/CMakeCache.txt:
	@$(HAVE_CMAKE)
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS)

build: $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j $(JOBS)

demo: build
	@scripts/demo.sh $(BUILD)

# All three parts, each timed; fails at the end if any failed.
test:
	@failed=; summary=; \
	for part in test-plain test-asan fuzz; do \
	    t0=$$(date +%s); \
	    if $(MAKE) --no-print-directory $$part; then r=passed; else r=FAILED; failed="$$failed $$part"; fi; \
	    summary="$$summary$$(printf '\nmake test: %-10s %s in %d s' $$part $$r $$(( $$(date +%s) - t0 )))"; \
	done; \
	echo "$$summary"; \
	if [ -n "$$failed" ]; then echo "make test: FAILED:$$failed"; exit 1; fi

# The header, libstepgraph.so and .a, the command, the CMake package and stepgraph.pc.
install: build
	cmake --install $(BUILD) --prefix $(PREFIX)

test-plain: build
	@$(HAVE_PKGCONFIG)
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS) $(CTEST_FLAGS)

test-asan:
	@$(HAVE_CMAKE)
	cmake -S . -B $(ASAN_BUILD) $(SAN_CMAKE)
	cmake --build $(ASAN_BUILD) -j $(JOBS)
	cd $(ASAN_BUILD) && $(SAN_ENV) ctest -L cpu --output-on-failure -j $(JOBS) $(CTEST_FLAGS)

# libFuzzer needs clang; the library is built with coverage so that it reaches the parsers.
fuzz:
	@$(HAVE_CMAKE)
	@$(HAVE_FUZZ)
	cmake -S . -B $(FUZZ_BUILD) $(SAN_CMAKE) -DCMAKE_C_COMPILER=clang -DSG_FUZZ=ON
	cmake --build $(FUZZ_BUILD) -j $(JOBS) --target fuzz_all
	FUZZ_TIME=$(FUZZ_TIME) fuzz/run.sh $(FUZZ_BUILD)

# Rewrites the checked-in seed corpus (fuzz/corpus/) with the library's own saver.
fuzz-corpus: build
	rm -rf fuzz/corpus && mkdir fuzz/corpus
	$(BUILD)/fuzz/fuzz_gen_corpus fuzz/corpus

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(FUZZ_BUILD)
