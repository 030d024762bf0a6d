# The front door: every target is a thin wrapper over CMake.
BUILD      ?= build
ASAN_BUILD ?= build-asan
JOBS       ?= $(shell nproc)
CMAKE_ARGS ?=

DEPS = liburing-dev liblmdb-dev libcriterion-dev libxxhash-dev liblz4-dev \
       pkg-config cmake build-essential python3
BENCH_DEPS = fio redis-server librocksdb-dev libhiredis-dev

.PHONY: all deps bench-deps build asan test test-asan demo bench install clean format

all: build

deps:
	@sh tools/deps.sh $(DEPS)

bench-deps:
	@sh tools/deps.sh $(BENCH_DEPS)

$(BUILD)/CMakeCache.txt:
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSTASH_WERROR=ON $(CMAKE_ARGS)

build: $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j $(JOBS)

$(ASAN_BUILD)/CMakeCache.txt:
	cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=Debug -DSTASH_SANITIZE=ON -DSTASH_WERROR=ON $(CMAKE_ARGS)

asan: $(ASAN_BUILD)/CMakeCache.txt
	cmake --build $(ASAN_BUILD) -j $(JOBS)

test: deps build asan
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)
	cd $(ASAN_BUILD) && ctest --output-on-failure -j $(JOBS) -LE nosan

demo: deps build
	$(BUILD)/tools/stash demo

bench: deps build
	$(BUILD)/tools/stash bench all

install: build
	cmake --install $(BUILD)

format:
	clang-format -i include/*.h shm/*.[ch] ioengine/*.[ch] backends/*.[ch] tools/*.[ch] tests/*.[ch]

clean:
	rm -rf $(BUILD) $(ASAN_BUILD)
