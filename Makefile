# SPDX-License-Identifier: MIT
# The front door: every target is a thin wrapper over CMake.
BUILD      ?= build
ASAN_BUILD ?= build-asan
RELEASE_BUILD ?= build-release
WERROR_BUILD ?= build-release-werror
FUZZ_BUILD ?= build-fuzz
JOBS       ?= $(shell nproc)
CMAKE_ARGS ?=

DEPS = jq liburing-dev liblmdb-dev libcriterion-dev libxxhash-dev liblz4-dev \
       pkg-config cmake build-essential python3 python3-dev libmicrohttpd-dev \
       libsystemd-dev prometheus gnuplot-nox librados-dev ceph-mon ceph-osd ceph-mgr \
       ceph-common nftables iproute2
BENCH_DEPS = fio redis-server librocksdb-dev libhiredis-dev python3-lmdb python3-redis
FUZZ_DEPS = clang libclang-rt-14-dev

.PHONY: all deps bench-deps fuzz-deps build asan fuzz-build release-check test sanitize demo bench soak fuzz fuzz-corpus install clean format

all: build

deps:
	@sh tools/deps.sh $(DEPS)

bench-deps:
	@sh tools/deps.sh $(BENCH_DEPS)

fuzz-deps:
	@sh tools/deps.sh $(FUZZ_DEPS)

$(BUILD)/CMakeCache.txt:
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSTASH_TESTS=ON -DSTASH_WERROR=ON $(CMAKE_ARGS)

build: $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j $(JOBS)

$(ASAN_BUILD)/CMakeCache.txt:
	cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=Debug -DSTASH_SANITIZE=ON -DSTASH_TESTS=ON \
	      -DSTASH_WERROR=ON $(CMAKE_ARGS)

asan: $(ASAN_BUILD)/CMakeCache.txt
	cmake --build $(ASAN_BUILD) -j $(JOBS)

# The fuzz targets: clang with libFuzzer, ASan and UBSan; nothing else built.
$(FUZZ_BUILD)/CMakeCache.txt:
	cmake -S . -B $(FUZZ_BUILD) -DCMAKE_C_COMPILER=clang -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	      -DSTASH_FUZZ=ON -DSTASH_TESTS=OFF -DSTASH_WERROR=ON $(CMAKE_ARGS)

fuzz-build: fuzz-deps $(FUZZ_BUILD)/CMakeCache.txt
	cmake --build $(FUZZ_BUILD) -j $(JOBS)

test: deps build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

# The Release build with warnings as errors: its optimizer finds warnings the
# other builds do not (make install builds Release without -Werror).
release-check: deps
	cmake -S . -B $(WERROR_BUILD) -DCMAKE_BUILD_TYPE=Release -DSTASH_WERROR=ON $(CMAKE_ARGS)
	cmake --build $(WERROR_BUILD) -j $(JOBS)

# The sanitizer passes: the Release build's warnings, every test again under
# ASan and UBSan (those that only drive daemons and namespaces left out), and
# each fuzz target for 30 s.
sanitize: deps release-check asan fuzz-build
	cd $(ASAN_BUILD) && ctest --output-on-failure -j $(JOBS) -LE nosan
	cd $(FUZZ_BUILD) && ctest --output-on-failure -j $(JOBS)

demo: deps build
	$(BUILD)/tools/stash demo

bench: deps build
	$(BUILD)/tools/stash bench all

# The crash campaigns for MINUTES minutes each, one host then a job across
# hosts in namespaces of their own (SEED=N replays a sequence of events).
MINUTES ?= 60
soak: deps build
	$(BUILD)/tests/crash/stash-crash --minutes $(MINUTES) $(if $(SEED),--seed $(SEED))
	$(BUILD)/tests/crash/stash-nemesis --minutes $(MINUTES) $(if $(SEED),--seed $(SEED))

# The fuzz targets' seed corpus, written again from real checkpoints.
fuzz-corpus: fuzz-build
	$(FUZZ_BUILD)/tests/fuzz/stash-fuzz-seed tests/fuzz/corpus

# Each fuzz target for MINUTES minutes, the two at once.
fuzz: fuzz-build
	cd $(FUZZ_BUILD) && STASH_FUZZ_SECONDS=$$(($(MINUTES) * 60)) \
	    ctest --output-on-failure -j $(JOBS) --timeout $$(($(MINUTES) * 60 + 600))

# What is installed is built without the tests and without fault injection.
$(RELEASE_BUILD)/CMakeCache.txt:
	cmake -S . -B $(RELEASE_BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_ARGS)

install: deps $(RELEASE_BUILD)/CMakeCache.txt
	cmake --build $(RELEASE_BUILD) -j $(JOBS)
	cmake --install $(RELEASE_BUILD)

format:
	clang-format -i include/*.h shm/*.[ch] ioengine/*.[ch] backends/*/*.[ch] tools/*.[ch] tests/*.[ch]

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(FUZZ_BUILD) $(RELEASE_BUILD) $(WERROR_BUILD)
