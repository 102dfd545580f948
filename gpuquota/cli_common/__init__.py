"""Small pieces every gpuquota command shares (the agent, the controller and the report)."""
