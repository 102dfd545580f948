"""The NVML stand-in: a libnvidia-ml.so.1 built from nvml.h, driven from Python."""
