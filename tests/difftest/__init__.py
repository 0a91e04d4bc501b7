"""Differential testing of skiff: generated queries, two oracles (skiff with every rule
against skiff with none, and DuckDB over the same Iceberg tables), reduction of mismatches.
Run it with scripts/difftest; tests/difftest/README.md says how it works."""
