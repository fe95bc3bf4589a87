"""Where recorded rows go: row building (`rows`), the background writer with atomic commits (`writer`), the
run's one-owner claim (`claim`) and its metadata file (`run_meta`)."""
