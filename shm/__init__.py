"""Shared-memory tables and counters (built by a later issue; see DESIGN.md, "The rooms")."""
