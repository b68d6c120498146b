"""The benchmark suite: ``python -m bench --db URL --runs N [--quick | --smoke] [--skip-peer]``.

What it does, in order, in one process:

1. ``dataset``: reuses the database when it holds ≥ N runs (``--reload`` forces a reload),
   else loads through the project's own path (``agentledger.demo.seed``, which uses the
   COPY-based ``ingest.bulk_import`` for large N when it exists) and reports its rate.
2. Against a real ``agentledger serve --no-worker`` subprocess (``AGENTLEDGER_RUN_RATE_LIMIT=0``):
   ``reads`` (queries in-process, HTTP, raw SQL), ``dashboards`` (the initial Dash callbacks of
   each page), ``http_load`` (run creation and event appends, 4 clients, vs ``baseline``'s raw
   psycopg transactions), ``sse`` (append commit → delivery on 100 open streams, on PostgreSQL
   and on a SQLite file).
3. ``otlp``: the OTLP receiver in-process on the bench database, 32 protobuf batches of 512 spans
   (4 with ``--quick``) and the same batches again (a duplicate export), vs the same span rows
   stored with plain psycopg ``COPY`` (SQLite: ``executemany``) into a scratch table.
4. ``cancel``: how long agents of each kind go on after a cancel (``scripted``, ``langgraph``,
   ``openai-agents``; the contract's bound is 1 s), against ``agentledger serve`` with its worker
   on a database of its own (``<db>_cancel``, dropped afterwards; a SQLite file on SQLite).
5. ``peer_langgraph``: LangGraph's dev server vs ``agentledger serve`` with its worker, on a
   trivial workload (skipped with a reason when the peer cannot be installed or started).
6. ``report``: Markdown and JSON under ``bench/results/`` (timestamped, and ``latest.*``).

Timing: ``time.perf_counter()`` around each complete operation, in the bench process.
Throughput phases run a fixed time (10 s each; 2 s with ``--quick``) with 4 client threads.
The HTTP write clients are ``bench.common.LeanHTTP`` (``http.client``, keep-alive, 0.2 ms of
client CPU per request here; ``requests`` took 0.9 ms of the same two cores the server runs on),
so that the ratio to raw psycopg compares the server's work, not the client library's.
Latency percentiles (p50/p95/p99, linear interpolation between ranks) come from 300 samples per
point read, 100 per list read, 50 per outcomes window (30/10/5 with ``--quick``: there p99 is
about the maximum), each after 2 warm-up calls; SSE from 300 appends (40 quick); the peer from
50 sequential runs (10 quick) and 10 s of load per concurrency level (3 s quick).
Outcome windows end at the moment the reads start; the runs of the partial hour at a window's
start are scanned run by run (the rest comes from the rollups), so each outcome row's note says
how long that edge was and how many runs it held: it depends on the minute the bench reached
the reads, and rows of two runs compare only with it in view.

``--smoke`` shrinks everything further (500 runs, 0.5 s write phases, 5 samples per point read,
1 s per peer phase): every part runs and fills its row, in about half a quick run's time; its
figures say nothing about speed.

Speed is measured, never asserted: ``tests/test_bench_smoke.py`` only checks that a smoke run
completes and writes every expected row.
"""
