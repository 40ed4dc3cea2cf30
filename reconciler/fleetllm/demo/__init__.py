"""`fleetllm demo`: a whole fleet on one machine, simulated boxes on loopback addresses.

Kept free of imports: the stub vLLM and the fake nvidia-smi in this package run as small processes
(one per simulated server) and must start fast, on the standard library only.
"""
