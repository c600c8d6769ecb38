"""What leaves the store: prometheus.py serves /metrics, files.py writes and reads run files
(CSV, Parquet)."""
