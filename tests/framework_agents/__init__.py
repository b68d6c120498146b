"""Code-defined agents for the framework tests: real LangGraph graphs and Agents SDK agents
with fake models (no network). Importable by subprocesses with ``tests`` on ``PYTHONPATH``."""
