"""Helpers shared by the tests, one module per concern (``from support.api import FlaskApi``).

==================  ==========================================================================
``waiting``         ``wait_until(condition, timeout, interval)``: the one poll-until-true wait
``ports``           ``free_port()``: a free TCP port on 127.0.0.1
``seeds``           ``SEED`` / ``SOAK`` / ``soak()`` / ``seeded_random()``: replayable randomness
                    (``GUARANTEE_SEED``) and the ``SOAK=1`` switch, read from the environment once
``processes``       ``ProcessManager`` / ``Proc``: real ``agentledger`` processes in their own
                    process groups, killed at teardown; ``ExecutorPool``; plain reads of runs
``api``             the HTTP test helpers (Flask test client and real server): ``FlaskApi``,
                    ``ServerProcess`` (a ``ProcessManager`` server), actors, SSE parser
``dashboards``      a dashboards app on a test database and Dash callback calls
``factories``       test data through the real write path (``ingest``)
``history``         hand-timed history for the query tests
``ledger``          read-side checks of the ingest tests (``assert_run_invariants`` …)
``guarantees``      many-event runs for the guarantee tests
``races``           concurrent HTTP, two-connection interleavings, tallies
``rollup``          the outcome rollup recomputed by a scan
``frameworks``      the framework-kind tests' ask / answer / two turns in a worker process
``expiry``          ``expire_lease``: a claimed run's lease moved into the past, so a test of
                    expiry does not race a short lease
``gates``           ``hold_the_plodder``: a framework agent's plain-code work held open until
                    the test lets go (cancel tests)
``async_graphs``    LangGraph graphs with async nodes, edges and tools (the kind refuses them)
==================  ==========================================================================

Fixtures that start processes, browsers or soak loops mark their tests ``process``, ``browser``
or ``soak`` (each also ``slow``) in ``tests/conftest.py``; nobody marks those by hand.
"""
