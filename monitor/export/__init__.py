"""What leaves the store for other tools: Prometheus's /metrics (and the Grafana dashboard
and rules it is read with), a job read back from Prometheus, and run files (CSV, Parquet)."""
