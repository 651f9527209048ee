"""Delayed delivery: `SCHEDULE_TOPIC_XXXX` and the per-level schedule service (REFERENCE.md §10)."""
