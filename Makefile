# SPDX-License-Identifier: MIT
# The front door: every target is a thin wrapper over CMake.
BUILD      ?= build
ASAN_BUILD ?= build-asan
RELEASE_BUILD ?= build-release
WERROR_BUILD ?= build-release-werror
FUZZ_BUILD ?= build-fuzz
DEB_BUILD  ?= build-deb
JOBS       ?= $(shell nproc)
CMAKE_ARGS ?=

# Debian's packages, by what needs them. The library and the command at
# run time (the Python module's interpreter with them):
RUNTIME_DEPS = liburing2 liblmdb0 libxxhash0 liblz4-1 libmicrohttpd12 libsystemd0 librados2 \
               libcurl4 python3
# To build them (make install):
BUILD_DEPS = build-essential cmake pkg-config liburing-dev liblmdb-dev libxxhash-dev liblz4-dev \
             libmicrohttpd-dev libsystemd-dev librados-dev libcurl4-openssl-dev python3-dev
# To build and run the tests (make test): Criterion, the daemons and tools
# the tests drive (a Ceph cluster and its S3 gateway, Prometheus, nftables and ip for the
# hosts in namespaces, gnuplot for the plots, jq, man for the pages, the
# ABI checker, and what builds the Python wheel into a venv).
TEST_DEPS = libcriterion-dev jq prometheus gnuplot-nox ceph-mon ceph-osd ceph-mgr ceph-common \
            radosgw curl \
            nftables iproute2 man-db abi-dumper abi-compliance-checker xz-utils python3-venv \
            python3-pip python3-setuptools python3-wheel
BENCH_DEPS = fio redis-server librocksdb-dev libhiredis-dev python3-lmdb python3-redis awscli
FUZZ_DEPS = clang libclang-rt-14-dev
# To build the Debian packages (make deb): debian/control's Build-Depends,
# which dpkg-buildpackage checks, and lintian; and a Debian root to
# install them into (make package-check).
DEB_DEPS = $(BUILD_DEPS) debhelper dh-python dpkg-dev fakeroot lintian librocksdb-dev \
           libhiredis-dev
DEPS = $(RUNTIME_DEPS) $(BUILD_DEPS) $(TEST_DEPS)

.PHONY: all deps runtime-deps build-deps demo-deps bench-deps fuzz-deps deb-deps build asan \
        fuzz-build release-check test sanitize demo bench soak repeat fuzz fuzz-corpus install deb \
        package-check clean format

all: build

# Everything make test needs.
deps:
	@sh tools/deps.sh $(DEPS)

runtime-deps:
	@sh tools/deps.sh $(RUNTIME_DEPS)

build-deps:
	@sh tools/deps.sh $(RUNTIME_DEPS) $(BUILD_DEPS)

# The demo runs from the test build (make build), which needs Criterion;
# plain `stash demo` starts no Ceph cluster (--hosts does).
demo-deps:
	@sh tools/deps.sh $(RUNTIME_DEPS) $(BUILD_DEPS) libcriterion-dev

deb-deps:
	@sh tools/deps.sh $(DEB_DEPS)

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
release-check: build-deps
	cmake -S . -B $(WERROR_BUILD) -DCMAKE_BUILD_TYPE=Release -DSTASH_WERROR=ON $(CMAKE_ARGS)
	cmake --build $(WERROR_BUILD) -j $(JOBS)

# The sanitizer passes: the Release build's warnings, every test again under
# ASan and UBSan (those that only drive daemons and namespaces left out), and
# each fuzz target for 30 s.
sanitize: deps release-check asan fuzz-build
	cd $(ASAN_BUILD) && ctest --output-on-failure -j $(JOBS) -LE nosan
	cd $(FUZZ_BUILD) && ctest --output-on-failure -j $(JOBS)

demo: demo-deps build
	$(BUILD)/tools/stash demo

bench: deps build
	$(BUILD)/tools/stash bench all

# The crash campaigns for MINUTES minutes each: one host, one host with its
# checkpoints in S3 too, then a job across hosts in namespaces of their own
# (SEED=N replays a sequence of events).
MINUTES ?= 60
soak: deps build
	$(BUILD)/tests/crash/stash-crash --minutes $(MINUTES) $(if $(SEED),--seed $(SEED))
	sh tests/crash/storage-soak.sh $(BUILD) $(MINUTES) $(SEED)
	$(BUILD)/tests/crash/stash-nemesis --minutes $(MINUTES) $(if $(SEED),--seed $(SEED))

# Every test RUNS times in a row (the campaigns LONG times) with the other
# core busy: a test that waits on time rather than its event shows.
RUNS ?= 20
LONG ?= 3
repeat: deps build
	sh tests/repeat.sh $(BUILD) $(RUNS) $(LONG)

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

install: build-deps $(RELEASE_BUILD)/CMakeCache.txt
	cmake --build $(RELEASE_BUILD) -j $(JOBS)
	cmake --install $(RELEASE_BUILD)

# The Debian packages libstash0, libstash-dev, stash and python3-stash,
# built from this tree (debian/) into $(DEB_BUILD) and checked by lintian.
deb: deb-deps
	sh packaging/deb.sh $(DEB_BUILD) $(JOBS)

# The packages installed into a new Debian 12 root (debootstrap, kept under
# /var/cache/stash-package-check): the unit verified, its user made, a
# program built against libstash-dev and the module imported, the command
# run; then the root booted with systemd (systemd-nspawn) and the unit run
# there. Needs root and Debian's archive.
package-check: deb
	@sh tools/deps.sh debootstrap systemd-container
	sh tests/package_check.sh $(DEB_BUILD)

format:
	clang-format -i include/*.h shm/*.[ch] ioengine/*.[ch] backends/*/*.[ch] tools/*.[ch] tests/*.[ch]

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(FUZZ_BUILD) $(RELEASE_BUILD) $(WERROR_BUILD) $(DEB_BUILD)
