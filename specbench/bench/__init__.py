"""Benchmark scaffolding: workloads, one job's protocol, the C_t(k) micro-benchmark, telemetry, environment, run store."""
