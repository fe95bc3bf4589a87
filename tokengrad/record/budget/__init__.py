"""Budgeted recording: at most K token rows per step and rank (`kept_rows`), every aggregate still exact
(`aggregates`)."""
