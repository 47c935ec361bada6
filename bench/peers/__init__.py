"""Adapters that run the throughput workload on other PostgreSQL queues."""
