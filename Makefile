# rocketq: `make run` starts a broker, `make test` runs the suite. Both install what they need.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install run test test-pure check lint typecheck docs config-doc bench bench-peers replay demo clean chaos timer-full fuzz fuzz-twins sanitize sanitize-thread cluster cluster-ha pipeline

# setup.py builds the optional C modules (in place, with the editable install);
# without a C compiler the install goes on and the pure-Python twins run.
$(STAMP): pyproject.toml setup.py protocol/_speedups.c protocol/_msgpack.h broker/store/_fsync.c broker/store/_records.c
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev,bench]'
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(BIN)/rocketq broker start --config conf/broker.toml --store-dir ./store

# .ci/system-packages first: the system programs some tests drive (Prometheus, tmux, chromium),
# installed when missing and possible (else those tests skip saying why)
test: $(STAMP)
	@.ci/system-packages
	$(BIN)/python -m pytest

# the whole suite on the pure-Python twins of the C modules, as on a machine without a C compiler
# (RQ_PURE_PYTHON=1; the C-only tests skip; about 2.5 min)
test-pure: $(STAMP)
	RQ_PURE_PYTHON=1 $(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check .

typecheck: $(STAMP)
	$(BIN)/mypy

check: lint typecheck test

# The documentation site (mkdocs.yml, docs/) into ./site, strict: a warning (a broken link or anchor)
# fails it. Installs the docs extra on first use. NO_MKDOCS_2_WARNING silences the theme's banner.
docs: $(STAMP)
	@$(BIN)/python -c "import mkdocs, material" 2>/dev/null || $(BIN)/python -m pip install --quiet -e '.[dev,bench,docs]'
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict -d site

# docs/configuration.md from the config classes of conf/ (tests/conf/test_configuration_doc.py fails
# when the committed page is stale)
config-doc: $(STAMP)
	$(BIN)/python -m conf.docgen docs/configuration.md

bench: $(STAMP)
	$(BIN)/python -m bench

# rocketq against Redis Streams (redis-py asyncio + hiredis); installs redis-server (Debian) if missing
bench-peers: $(STAMP)
	@command -v redis-server >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq redis-server; \
	  else sudo apt-get update -qq && sudo apt-get install -y -qq redis-server; fi; }
	$(BIN)/python -m bench.peers

# A name server (127.0.0.1:9876), two brokers (broker-a :10911, broker-b :10921) and the web
# console (http://127.0.0.1:8080) in the foreground, stores under ./store-cluster; Ctrl-C stops all.
cluster: $(STAMP)
	@echo "name server 127.0.0.1:9876; broker-a 127.0.0.1:10911 (metrics :5557); broker-b 127.0.0.1:10921 (metrics :5558); console http://127.0.0.1:8080; Ctrl-C stops all"
	@trap 'wait' INT; trap 'kill -TERM $$ns $$a $$b $$c 2>/dev/null; wait' TERM; \
	$(BIN)/rocketq namesrv start --config conf/namesrv.toml & ns=$$!; \
	$(BIN)/rocketq broker start --config conf/broker.toml --listen-port 10911 --store-dir ./store-cluster/broker-a \
	  --namesrv-addr 127.0.0.1:9876 --set broker_name=broker-a & a=$$!; \
	$(BIN)/rocketq broker start --config conf/broker.toml --listen-port 10921 --store-dir ./store-cluster/broker-b \
	  --namesrv-addr 127.0.0.1:9876 --set broker_name=broker-b --set metrics_port=5558 & b=$$!; \
	$(BIN)/rocketq console start --endpoints 127.0.0.1:9876 --listen-host 127.0.0.1 --listen-port 8080 & c=$$!; \
	wait

# High availability (docs/ha.md): a controller (127.0.0.1:9878), a name server (127.0.0.1:9876) and
# broker-a as a SYNC_MASTER (:10911, replication :10912) + slave (:10921) under ./store-cluster-ha;
# kill the master and the controller makes the slave master within the lease (6 s). Ctrl-C stops all.
cluster-ha: $(STAMP)
	@echo "controller 127.0.0.1:9878; name server 127.0.0.1:9876; broker-a master 127.0.0.1:10911 (metrics :5557), slave 127.0.0.1:10921 (metrics :5558); Ctrl-C stops all"
	@trap 'wait' INT; trap 'kill -TERM $$ctl $$ns $$a0 $$a1 2>/dev/null; wait' TERM; \
	$(BIN)/rocketq controller start --listen-port 9878 --data-dir ./store-cluster-ha/controller & ctl=$$!; \
	$(BIN)/rocketq namesrv start --config conf/namesrv.toml & ns=$$!; \
	sleep 1; \
	$(BIN)/rocketq broker start --config conf/broker.toml --listen-port 10911 --store-dir ./store-cluster-ha/a0 \
	  --namesrv-addr 127.0.0.1:9876 --set broker_name=broker-a --set broker_role=SYNC_MASTER \
	  --set controller_addr=127.0.0.1:9878 & a0=$$!; \
	sleep 2; \
	$(BIN)/rocketq broker start --config conf/broker.toml --listen-port 10921 --store-dir ./store-cluster-ha/a1 \
	  --namesrv-addr 127.0.0.1:9876 --set broker_name=broker-a --set broker_role=SLAVE --set broker_id=1 \
	  --set controller_addr=127.0.0.1:9878 --set metrics_port=5558 & a1=$$!; \
	wait

replay: $(STAMP)
	$(BIN)/python -m bench.replay

# 20 fault cycles (SIGKILL / SIGSTOP broker, kill consumers, clean restarts), then 10 HA cycles (a
# controller, master + slave: kill master, kill slave, SIGSTOP master past the lease, cut replication);
# CHAOS_ARGS="--seed N" replays
chaos: $(STAMP)
	$(BIN)/python -m chaos --cycles 20 --ha-cycles 10 $(CHAOS_ARGS)

# timer messages: 100,000 over the next 60 s each within 1 s of its time (~2 min; CI runs 10,000 over 10 s)
timer-full: $(STAMP)
	ROCKETQ_TIMER_FULL=1 $(BIN)/python -m pytest -q -s tests/broker/timer/test_timer_precision.py

# >= 1,000,000 random and mutated frames from several connections, then serve, RSS and store checks
fuzz: $(STAMP)
	$(BIN)/python -m chaos.fuzz $(FUZZ_ARGS)

# the C modules against their pure-Python twins on random and mutated input (60 s; TWINS_ARGS="--seed N")
fuzz-twins: $(STAMP)
	$(BIN)/python -m chaos.twins $(TWINS_ARGS)

# the C modules built with AddressSanitizer and UBSan in a copy of the checkout, then their tests,
# fuzz-twins and 100,000 fuzz frames run on them (about 2.5 min; needs gcc's sanitizer runtimes)
sanitize: $(STAMP)
	$(BIN)/python -m chaos.sanitize $(SANITIZE_ARGS)

# the C modules built with ThreadSanitizer, then the tests that drive the C fsync thread (about
# 20 s; needs gcc's libtsan)
sanitize-thread: $(STAMP)
	$(BIN)/python -m chaos.sanitize --thread $(SANITIZE_ARGS)

# DEMO_SECURE=1: with authentication, authorization (a user and an ACL per role) and mutual TLS (certificates
# made for the run) on; docs/security.md
demo: $(STAMP)
	$(BIN)/python -m demo

# the flights through rocketq into Spark Structured Streaming, checked against pandas (README "Spark");
# DEMO_SECURE=1: with authentication, authorization and TLS on
pipeline: $(STAMP)
	$(BIN)/python -m demo.pipeline

clean:
	rm -rf $(VENV) store store-cluster bench/results pipeline-out site .pytest_cache .mypy_cache
