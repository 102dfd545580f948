"""gpuquota's cluster side: watch pods and quotas, account GPU-hours in SQL, report them."""
