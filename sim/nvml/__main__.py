"""Entry point: ``python -m sim.nvml STATE COMMAND ...`` (see sim.nvml.cli)."""

from sim.nvml.cli import main

raise SystemExit(main())
