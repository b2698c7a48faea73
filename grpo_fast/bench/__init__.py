"""Benchmark library behind the scripts in benchmarks/ and `grpo-fast bench-*`."""
