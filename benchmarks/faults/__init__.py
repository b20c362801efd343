"""The fault-injection soak: writers, workflows and readers on four nodes of two emulated WAN sites
while daemons are killed and restarted, a disk fills, packets are dropped and delayed and connections
are cut; then every file is checked from every node. `benchmarks/soak.py` runs it long,
`tests/test_soak.py` small."""

from .run import KINDS, Report, SoakConfig, run_soak, write_report

__all__ = ["KINDS", "Report", "SoakConfig", "run_soak", "write_report"]
