"""Helpers the test suites share: the PostgreSQL server, and what runs on it."""
