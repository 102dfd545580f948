"""Entry point: ``python -m gpuquota.sim.nvml STATE COMMAND ...`` (see gpuquota.sim.nvml.cli)."""

from gpuquota.sim.nvml.cli import main

raise SystemExit(main())
