# The two README commands. Everything else is CMake and ctest underneath.
BUILD ?= build
JOBS ?= $(shell nproc 2>/dev/null || echo 2)

.PHONY: all build demo test clean

all: build

$(BUILD)/CMakeCache.txt:
	@command -v cmake >/dev/null || { echo "make: cmake not found; installing it (apt-get)"; apt-get update -qq && apt-get install -y -qq cmake; }
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS)

build: $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j $(JOBS)

demo: build
	@scripts/demo.sh $(BUILD)

test: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS) $(CTEST_FLAGS)

clean:
	rm -rf $(BUILD)
