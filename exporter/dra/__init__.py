"""Dynamic Resource Allocation on the node: ResourceSlices, claim attribution, DeviceTaintRules."""
